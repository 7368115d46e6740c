"""Lambda packaging without Docker: pip-install pinned dependencies for the Lambda platform.

One asset holds the handlers (``functions/``), the library they call (``swarm/``) and the
dependencies from ``functions/requirements.txt``, installed as manylinux wheels for the function's
Python version. Tests skip bundling with the context ``aws:cdk:bundling-stacks=[]``.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import aws_cdk as cdk
import jsii
from aws_cdk import aws_lambda as lambda_

from infra.constants import ROOT

FUNCTIONS_DIR = ROOT / "functions"
LIBRARY_DIR = ROOT / "swarm"
REQUIREMENTS = FUNCTIONS_DIR / "requirements.txt"
_IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", "requirements.txt")


def _source_files() -> list[Path]:
    files = [REQUIREMENTS]
    for directory in (FUNCTIONS_DIR, LIBRARY_DIR):
        files += sorted(p for p in directory.rglob("*.py") if "__pycache__" not in p.parts)
    return files


def source_hash(platform: str = "") -> str:
    """Hash of everything that goes into the asset, so any change re-bundles: the sources, the
    pinned requirements and the platform their wheels are for."""
    digest = hashlib.sha256(platform.encode())
    for path in _source_files():
        digest.update(str(path.relative_to(ROOT)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


@jsii.implements(cdk.ILocalBundling)
class LocalPipBundling:
    """``pip install --target`` for the Lambda platform, then copy the sources."""

    def __init__(self, python_version: str, platform: str) -> None:
        self.python_version = python_version
        self.platform = platform

    def try_bundle(self, output_dir: str, options: Any) -> bool:
        out = Path(output_dir)
        command = [
            sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
            "--target", str(out), "--platform", self.platform, "--implementation", "cp",
            "--python-version", self.python_version, "--only-binary=:all:",
            "--no-compile", "-r", str(REQUIREMENTS),
        ]  # fmt: skip
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise RuntimeError(
                "bundling the Lambda dependencies with pip failed "
                f"(exit {result.returncode}):\n{result.stderr.strip()}"
            )
        shutil.copytree(FUNCTIONS_DIR, out / "functions", ignore=_IGNORED, dirs_exist_ok=True)
        shutil.copytree(LIBRARY_DIR, out / "swarm", ignore=_IGNORED, dirs_exist_ok=True)
        return True


def function_code(runtime: lambda_.Runtime, architecture: lambda_.Architecture) -> lambda_.Code:
    """The shared asset of every function (handler ``functions.<name>.handler``)."""
    python_version = runtime.name.removeprefix("python")
    machine = "aarch64" if architecture.name == "arm64" else "x86_64"
    platform = f"manylinux2014_{machine}"
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
