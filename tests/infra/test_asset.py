"""The functions' asset ships what the handlers import and nothing else (infra/asset.py): built
as `cdk synth` builds it, every handler imports with only the asset on ``sys.path``, and no local
stack, simulator, CLI or benchmark code is in it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from infra import asset, bundling
from infra.bundling import LocalPipBundling

#: a fresh interpreter, isolated (-I: no user site, no PYTHON* variables, no current directory)
#: and without site-packages (-S): what is on sys.path is the standard library and ``argv[1]``
IMPORT_EVERY_HANDLER = """
import importlib, json, sys
asset = sys.argv[1]
sys.path.insert(0, asset)
failed = {}
for name in json.loads(sys.argv[2]):
    try:
        module = importlib.import_module(name)
        assert callable(module.handler), f"{name} has no handler"
    except Exception as e:
        failed[name] = f"{type(e).__name__}: {e}"
outside = sorted(
    name for name, module in sys.modules.items()
    if name.split(".")[0] in ("functions", "swarm")
    and not str(getattr(module, "__file__", "") or "").startswith(asset)
)
print(json.dumps({"failed": failed, "outside": outside, "loaded": sorted(sys.modules)}))
"""


#: the worker's MCP client from the asset alone (swarm.adapters.mcp_tools imports it lazily)
IMPORT_THE_MCP_CLIENT = """
import json, sys
asset = sys.argv[1]
sys.path.insert(0, asset)
import httpx2
from anyio.from_thread import start_blocking_portal
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
import swarm.adapters.mcp_tools
outside = sorted(
    name for name, module in sys.modules.items()
    if name.split(".")[0] in ("mcp", "mcp_types", "httpx2", "anyio", "swarm")
    and not str(getattr(module, "__file__", "") or "").startswith(asset)
)
print(json.dumps({"outside": outside}))
"""


#: the BFCL toolset's run time from the asset alone: its declarations, every entry, and each
#: backend class in its initial state (what functions/tools/bfcl.py does on a call)
RUN_BFCL_FROM_THE_ASSET = """
import json, sys
sys.path.insert(0, sys.argv[1])
from swarm.adapters.tools import source_declarations
from swarm.workloads import bfcl
entries = bfcl.entries()
classes = {}
for entry in entries:
    for name, instance in bfcl.fresh_instances(entry).items():
        classes[name] = type(instance).__module__
print(json.dumps({"declared": len(source_declarations("bfcl")), "entries": len(entries),
                  "classes": classes}))
"""


def _run_alone(script: str, built: Path, *args: str) -> Any:
    """``script``'s JSON output, run by a fresh interpreter with only the asset at ``built``
    (and the standard library) on its path."""
    command = [sys.executable, "-I", "-S", "-c", script, str(built), *args]
    result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=300)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _write(root: Path, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.mark.slow
def test_every_handler_imports_from_the_built_asset_alone(tmp_path: Path) -> None:
    # Given the asset as `cdk synth` bundles it (the same code), with wheels for this machine
    python_version, platform = asset.host_target()
    assert LocalPipBundling(python_version, platform).try_bundle(str(tmp_path), None)
    handlers = asset.handler_modules()
    assert "functions.worker" in handlers and "functions.api" in handlers
    # When a fresh interpreter with only the asset (and the standard library) imports them all
    report = _run_alone(IMPORT_EVERY_HANDLER, tmp_path, json.dumps(handlers))
    # Then each imports (a module left out of the asset would be a ModuleNotFoundError here and
    # on every cold start on AWS), from the asset's own files
    assert report["failed"] == {}
    assert report["outside"] == []
    assert "moto" not in report["loaded"]
    # and the asset holds no local stack, simulator, CLI or benchmark code
    for package in ("local", "sim", "cli", "bench"):
        assert not (tmp_path / "swarm" / package).exists(), f"swarm/{package} was shipped"
        assert (asset.LIBRARY_DIR / package).is_dir()  # (they are there to leave out)
    assert not (tmp_path / "swarm" / "client.py").exists()
    assert not (tmp_path / "functions" / "requirements.txt").exists()
    # and the BFCL toolset runs from it: its declarations, its 200 entries, its 8 backend
    # classes, from bfcl-eval's part the asset keeps (not its model handlers or other data)
    ran = _run_alone(RUN_BFCL_FROM_THE_ASSET, tmp_path)
    assert ran["declared"] == 128 and ran["entries"] == 200 and len(ran["classes"]) == 8
    assert all(module.startswith("bfcl_eval.") for module in ran["classes"].values())
    assert not (tmp_path / "bfcl_eval" / "model_handler").exists()
    assert (tmp_path / "functions" / "tools" / "bfcl.tools.json").is_file()
    # and the worker's MCP client imports from it (the mcp package and its dependencies)
    assert _run_alone(IMPORT_THE_MCP_CLIENT, tmp_path) == {"outside": []}


def test_the_asset_holds_the_handlers_import_closure_and_no_tooling() -> None:
    modules = asset.asset_modules()
    assert set(asset.handler_modules()) <= set(modules)
    # what the handlers reach through the wiring is shipped
    for needed in ("swarm.wiring", "swarm.service.worker", "swarm.adapters.dynamodb_governor"):
        assert needed in modules
    # the tooling is not, whatever imports it (a handler reaching it fails here, naming it)
    shipped_tooling = sorted(m for m in modules if m.startswith(asset.NOT_SHIPPED))
    assert shipped_tooling == []


def test_the_closure_follows_lazy_relative_and_parent_imports(tmp_path: Path) -> None:
    # Given a project whose handler imports a module lazily, one relatively, and one whose
    # package's __init__ imports another
    _write(tmp_path, "functions/__init__.py", "")
    _write(
        tmp_path,
        "functions/job.py",
        "from swarm.core import rules\n"
        "def handler(event, context):\n"
        "    from swarm.adapters.late import answer\n"
        "    return answer()\n",
    )
    _write(tmp_path, "swarm/__init__.py", "")
    _write(tmp_path, "swarm/core/__init__.py", "from swarm.core import base\n")
    _write(tmp_path, "swarm/core/base.py", "")
    _write(tmp_path, "swarm/core/rules.py", "from . import helpers\nimport json\n")
    _write(tmp_path, "swarm/core/helpers.py", "")
    _write(tmp_path, "swarm/adapters/__init__.py", "")
    _write(tmp_path, "swarm/adapters/late.py", "def answer(): return 1\n")
    _write(tmp_path, "swarm/local/__init__.py", "")
    _write(tmp_path, "swarm/local/stack.py", "import functions.job\n")
    # When the asset's modules are read from it
    modules = asset.asset_modules(tmp_path)
    # Then every module the handler can reach is in, and the one importing it (not imported by
    # it) is not
    assert sorted(modules) == [
        "functions",
        "functions.job",
        "swarm",
        "swarm.adapters",
        "swarm.adapters.late",
        "swarm.core",
        "swarm.core.base",
        "swarm.core.helpers",
        "swarm.core.rules",
    ]
    # and the copy keeps the project's layout
    copied = asset.copy_sources(tmp_path / "out", tmp_path)
    assert (tmp_path / "out" / "swarm" / "core" / "helpers.py") in copied
    assert not (tmp_path / "out" / "swarm" / "local").exists()


def test_the_asset_hash_covers_the_shipped_files_only() -> None:
    # Given what the asset's hash is computed from
    hashed = {p.relative_to(asset.ROOT).as_posix() for p in bundling._source_files()}
    # Then a change to the CLI or the local stack (not shipped) redeploys no function's code,
    # and a change to a shipped module or the pinned requirements does
    assert not any(p.startswith(("swarm/cli/", "swarm/local/", "swarm/bench/")) for p in hashed)
    assert {"swarm/wiring.py", "functions/worker.py", "functions/requirements.txt"} <= hashed
    assert {"functions/requirements-nodeps.txt", "functions/tools/bfcl.tools.json"} <= hashed


def test_the_asset_pins_bfcl_eval_as_the_project_does() -> None:
    def pins(path: Path) -> set[str]:
        lines = path.read_text().splitlines()
        return {line.strip() for line in lines if line.strip() and not line.startswith("#")}

    assert pins(asset.REQUIREMENTS_NODEPS) == pins(asset.ROOT / "requirements-nodeps.txt")
