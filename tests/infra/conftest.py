"""Synthesize the app once per test session (per xdist worker) and share the cloud assembly."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aws_cdk.assertions import Template

from app import build_app
from infra.config import SwarmConfig
from infra.context import cdk_json_context
from infra.stack import SwarmStack

#: Skip the pip bundling in tests: the asset is staged from the sources instead.
NO_BUNDLING: dict[str, Any] = {"aws:cdk:bundling-stacks": []}


@dataclass(frozen=True)
class Synthesized:
    outdir: Path
    stack: SwarmStack
    config: SwarmConfig
    template: dict[str, Any]

    @property
    def assertions(self) -> Template:
        return Template.from_json(self.template)

    @property
    def resources(self) -> dict[str, Any]:
        resources: dict[str, Any] = self.template["Resources"]
        return resources

    def of_type(self, type_name: str) -> dict[str, Any]:
        return {k: v for k, v in self.resources.items() if v["Type"] == type_name}

    def logical_id(self, construct: Any) -> str:
        return str(self.stack.get_logical_id(construct.node.default_child))


def synthesize(outdir: Path, context: dict[str, Any] | None = None, *, nag: bool) -> Synthesized:
    app, stack = build_app({**NO_BUNDLING, **(context or {})}, nag=nag, outdir=str(outdir))
    app.synth()
    template = json.loads((outdir / f"{stack.stack_name}.template.json").read_text())
    return Synthesized(outdir=outdir, stack=stack, config=stack.config, template=template)


@pytest.fixture(scope="session")
def synth(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Synthesized]:
    """The default (dev) stage, with cdk-nag: synthesis itself fails on any unacknowledged
    finding, so every test that uses this fixture also proves the stack is nag-clean."""
    yield synthesize(tmp_path_factory.mktemp("cdk-dev"), nag=True)


@pytest.fixture(scope="session")
def prod_synth(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Synthesized]:
    """A production stage with the Bedrock adapter (retain, deletion protection, model grant)."""
    yield synthesize(
        tmp_path_factory.mktemp("cdk-prod"),
        {
            "stage": "prod",
            "model": {
                "adapter": "bedrock",
                "simulated": {"quota_tpm": 1000, "failure_rate": 0.0, "seed": 1},
            },
            # two models: a cross-region inference profile and an on-demand model id
            "models": {
                "default": "haiku",
                "catalog": {
                    "haiku": {
                        "model_id": "us.anthropic.claude-3-5-haiku-20241022-v1:0",
                        "tpm": 300_000,
                    },
                    "sonnet": {
                        "model_id": "anthropic.claude-sonnet-4-20250514-v1:0",
                        "tpm": 200_000,
                    },
                },
            },
            # a batch's Converse calls run at once: 20 s governor wait + 10 s connect + 5 s to
            # count + 180 s read + 2 s overhead = 217 s (infra/config.py worker_timing_problem)
            "worker": {**cdk_json_context()["worker"], "timeout_seconds": 240},
        },
        nag=True,
    )
