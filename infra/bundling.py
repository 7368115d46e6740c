"""Lambda packaging without Docker: pip-install pinned dependencies for the Lambda platform.

One asset holds the handlers (``functions/``), the modules of the library (``swarm/``) they
import and the dependencies from ``functions/requirements.txt``, installed as manylinux wheels for
the function's Python version: :mod:`infra.asset` says which modules (the handlers' import
closure: no local stack, simulator, CLI or benchmark code). Tests skip bundling with the context
``aws:cdk:bundling-stacks=[]``.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, cast

import aws_cdk as cdk
import jsii
from aws_cdk import aws_lambda as lambda_

from infra import asset
from infra.constants import ROOT

FUNCTIONS_DIR = asset.FUNCTIONS_DIR
REQUIREMENTS = asset.REQUIREMENTS


def _source_files() -> list[Path]:
    return [REQUIREMENTS, asset.REQUIREMENTS_NODEPS, *asset.asset_files()]


def source_hash(platform: str = "") -> str:
    """Hash of everything that goes into the asset, so any change re-bundles: the shipped
    sources, the pinned requirements and the platform their wheels are for (a change to code
    the handlers do not import, the CLI's say, leaves the functions' code as it is)."""
    digest = hashlib.sha256(platform.encode())
    for path in _source_files():
        digest.update(str(path.relative_to(ROOT)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


@jsii.implements(cdk.ILocalBundling)
class LocalPipBundling:
    """``pip install --target`` for the Lambda platform, then copy the shipped sources."""

    def __init__(self, python_version: str, platform: str) -> None:
        self.python_version = python_version
        self.platform = platform

    def try_bundle(self, output_dir: str, options: Any) -> bool:
        asset.build(Path(output_dir), self.python_version, self.platform)
        return True


def function_code(runtime: lambda_.Runtime, architecture: lambda_.Architecture) -> lambda_.Code:
    """The shared asset of every function (handler ``functions.<name>.handler``)."""
    python_version = runtime.name.removeprefix("python")
    platform = asset.lambda_platform(architecture.name)
    return lambda_.Code.from_asset(
        str(FUNCTIONS_DIR),
        asset_hash_type=cdk.AssetHashType.CUSTOM,
        asset_hash=source_hash(f"{platform} cp{python_version}"),
        bundling=cdk.BundlingOptions(
            # Never pulled: local bundling always succeeds or raises with pip's message.
            image=runtime.bundling_image,
            local=cast(cdk.ILocalBundling, LocalPipBundling(python_version, platform)),
        ),
    )
