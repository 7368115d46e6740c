#!/usr/bin/env python3
"""CDK entry point. Loads cdk.json's context itself so every path builds the same template."""

from __future__ import annotations

import aws_cdk as cdk

from infra.context import cdk_json_context
from infra.stack import SwarmStack


def build_app(context: dict[str, object] | None = None) -> cdk.App:
    merged = {**cdk_json_context(), **(context or {})}
    app = cdk.App(context=merged)
    stage = str(app.node.try_get_context("stage"))
    SwarmStack(app, f"Swarm-{stage}", stage=stage)
    return app


if __name__ == "__main__":
    build_app().synth()
