"""localstack/ cannot run here (no Docker): check its files statically."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2] / "localstack"


def test_the_compose_file_parses_and_binds_localhost_only() -> None:
    doc = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    service = doc["services"]["localstack"]
    assert all(str(p).startswith("127.0.0.1:") for p in service["ports"])
    assert "LOCALSTACK_AUTH_TOKEN" in service["environment"]


def test_the_scripts_pass_bash_n() -> None:
    for script in [ROOT / "deploy.sh", *sorted((ROOT / "init" / "ready.d").glob("*.sh"))]:
        result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert result.returncode == 0, (script, result.stderr)
