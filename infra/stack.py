"""The control plane's own stack, as this repository's app.py deploys it: a thin user of
:class:`~infra.control_plane.SwarmControlPlane`, plus the outputs the CLI reads."""

from __future__ import annotations

from typing import Any

import aws_cdk as cdk
from constructs import Construct

from infra.config import SwarmConfig
from infra.control_plane import TRANSPARENT_ID, SwarmControlPlane


class SwarmStack(cdk.Stack):
    """``Swarm-<stage>``: one :class:`SwarmControlPlane` built with the id ``Default``, so its
    resources keep the logical ids of the releases before the construct existed (CloudFormation
    would replace a resource whose logical id changed: the tables with their data)."""

    def __init__(
        self, scope: Construct, construct_id: str, *, config: SwarmConfig, **kwargs: Any
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)
        self.control_plane = plane = SwarmControlPlane(self, TRANSPARENT_ID, config=config)
        self.config = config
        # the parts, as before the construct: the tests and the acknowledgments read them
        self.lanes = plane.lanes
        self.tables = plane.tables
        self.storage = plane.storage
        self.bus = plane.bus
        self.drain = plane.drain
        self.tools = plane.tools
        self.workers = plane.workers
        self.drain_controller = plane.drain_controller
        self.fanout = plane.fanout
        self.sweeper = plane.sweeper
        self.front_door = plane.front_door
        self.functions = plane.functions
        self.observability = plane.observability
        for name, value in plane.outputs().items():
            cdk.CfnOutput(self, name, value=value)
