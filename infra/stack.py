"""The control plane stack."""

from __future__ import annotations

from typing import Any

import aws_cdk as cdk
from constructs import Construct


class SwarmStack(cdk.Stack):
    def __init__(self, scope: Construct, construct_id: str, *, stage: str, **kwargs: Any) -> None:
        super().__init__(scope, construct_id, **kwargs)
        self.stage = stage
        cdk.CfnOutput(self, "Stage", value=stage)
