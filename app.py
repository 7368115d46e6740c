#!/usr/bin/env python3
"""CDK entry point. Loads cdk.json's context itself so `python app.py`, pytest and `npx cdk synth`
build the same template; cdk-nag (AwsSolutions) runs as a CDK validation plugin on every synth.
The stack is a thin user of infra.control_plane.SwarmControlPlane, which a user's own CDK app can
add to its own stacks instead (examples/existing_app)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import aws_cdk as cdk
from cdk_nag import AwsSolutionsChecks

from infra.config import SwarmConfig
from infra.context import cdk_json_context
from infra.stack import SwarmStack

#: What the CLI passes for cdk.json's "versionReporting": false, "pathMetadata": true and
#: "assetMetadata": true; set here too so `python app.py` and pytest build the same template.
CLI_DEFAULTS: dict[str, Any] = {
    "aws:cdk:version-reporting": False,
    "aws:cdk:enable-path-metadata": True,
    "aws:cdk:enable-asset-metadata": True,
}


SKIP_BUNDLING: dict[str, Any] = {"aws:cdk:bundling-stacks": []}


def build_app(
    context: Mapping[str, Any] | None = None,
    *,
    nag: bool = True,
    outdir: str | None = None,
) -> tuple[cdk.App, SwarmStack]:
    """cdk.json's context, overridden by ``context`` (the CLI's ``-c`` values arrive there too)."""
    app = cdk.App(
        context={**CLI_DEFAULTS, **cdk_json_context(), **(context or {})},
        # The CLI refuses `-c aws:...`; SWARM_SKIP_BUNDLING=1 skips the pip bundling (tests, CI).
        post_cli_context=SKIP_BUNDLING if os.environ.get("SWARM_SKIP_BUNDLING") == "1" else None,
        outdir=outdir,
    )
    # The CLI's -c values (and cdk.json again) reach the app through the environment and win
    # over the constructor's context, so validate what the app node finally holds.
    config = SwarmConfig.from_context(app)
    stack = SwarmStack(
        app,
        f"Swarm-{config.stage}",
        config=config,
        description=f"swarm control plane ({config.stage}): lanes, fleet, governor, ledger",
    )
    if nag:
        cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    return app, stack


if __name__ == "__main__":
    build_app()[0].synth()
