"""The functions' asset as `cdk deploy` builds it: the pinned dependencies installed for the
runtime's Python and the functions' architecture (pip, no Docker). A wheel for the wrong machine
would import nowhere but here and fail every function's cold start on AWS."""

from __future__ import annotations

from pathlib import Path

from infra.bundling import LocalPipBundling, source_hash
from infra.functions import ARCHITECTURE, RUNTIME


def test_the_asset_holds_wheels_for_the_functions_architecture_and_python(tmp_path: Path) -> None:
    machine = "aarch64" if ARCHITECTURE.name == "arm64" else "x86_64"
    python = RUNTIME.name.removeprefix("python")
    # When the asset is bundled as `cdk synth` bundles it
    assert LocalPipBundling(python, f"manylinux2014_{machine}").try_bundle(str(tmp_path), None)
    # Then the compiled dependency (pydantic's core) is built for that machine and Python
    [wheel] = tmp_path.glob("pydantic_core-*.dist-info/WHEEL")
    tags = [
        line.split(": ", 1)[1] for line in wheel.read_text().splitlines() if line.startswith("Tag:")
    ]
    assert tags and all(machine in tag and f"cp{python.replace('.', '')}" in tag for tag in tags)
    # and the handlers and the library are beside it
    assert (tmp_path / "functions" / "worker.py").is_file()
    assert (tmp_path / "swarm" / "core" / "lanes.py").is_file()


def test_the_asset_hash_changes_with_the_platform() -> None:
    # a cached asset built for another machine is never reused
    assert source_hash("manylinux2014_aarch64 cp3.14") != source_hash("manylinux2014_x86_64 cp3.14")
