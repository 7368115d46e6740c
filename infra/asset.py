"""What the functions' asset holds: the handlers, the modules of ``swarm/`` they import, and the
pinned runtime dependencies. Nothing else: no local stack, simulator, CLI or benchmark code.

The modules are the handlers' import closure, read from the sources (:func:`asset_modules`):
every ``import`` and ``from ... import`` of a handler module (``functions/*.py``), followed
through the project's packages, those inside functions (lazy imports) and parent packages
(their ``__init__``) included. A module no handler reaches is not shipped, so a handler that
starts importing one ships it with it; the infra tier imports every handler from a built asset
with nothing else on ``sys.path`` (tests/infra/test_asset.py).

Standard library only (no CDK): :mod:`infra.bundling` builds the CDK asset with it, and
``swarm bench cost`` measures the asset's size and a cold start's imports with it.
"""

from __future__ import annotations

import ast
import io
import platform
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FUNCTIONS_DIR = ROOT / "functions"
LIBRARY_DIR = ROOT / "swarm"
REQUIREMENTS = FUNCTIONS_DIR / "requirements.txt"
#: the project's packages the asset may hold (the handlers' closure is followed through them)
PACKAGES = ("functions", "swarm")
#: what the asset must never hold (tested): the local stack, the simulator, the CLI, benchmarks
NOT_SHIPPED = ("swarm.local", "swarm.sim", "swarm.cli", "swarm.bench", "swarm.client")


def handler_modules(root: Path = ROOT) -> list[str]:
    """Every handler module: ``functions.<name>`` for each ``functions/<name>.py``, and the
    tool sources ``functions.tools.<source>`` (``functions/tools/<source>.py``)."""
    handlers = [
        f"functions.{path.stem}"
        for path in (root / "functions").glob("*.py")
        if path.stem != "__init__"
    ]
    handlers += [
        f"functions.tools.{path.stem}"
        for path in (root / "functions" / "tools").glob("*.py")
        if path.stem != "__init__"
    ]
    return sorted(handlers)


def _module_file(root: Path, name: str) -> Path | None:
    base = root.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _imported_names(module: str, path: Path) -> set[str]:
    """Every name ``module`` imports, anywhere in its body: ``a.b`` for ``import a.b``; ``a``
    and ``a.x`` for ``from a import x`` (``x`` may be a submodule), relative ones resolved."""
    tree = ast.parse(path.read_bytes(), filename=str(path))
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package[: len(package) - node.level + 1]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def asset_modules(root: Path = ROOT) -> dict[str, Path]:
    """The handlers' import closure inside the project: module name -> source file."""
    found: dict[str, Path] = {}
    todo = handler_modules(root)
    while todo:
        parts = todo.pop().split(".")
        if parts[0] not in PACKAGES:
            continue
        for i in range(1, len(parts) + 1):  # a module's parent packages run first
            name = ".".join(parts[:i])
            if name in found:
                continue
            path = _module_file(root, name)
            if path is None:  # a name imported from a module, not a module
                break
            found[name] = path
            todo.extend(_imported_names(name, path))
    return dict(sorted(found.items()))


def asset_files(root: Path = ROOT) -> list[Path]:
    """The project's files in the asset (absolute paths, sorted)."""
    return sorted(asset_modules(root).values())


def copy_sources(out: Path, root: Path = ROOT) -> list[Path]:
    """Copy the asset's modules into ``out`` at their paths in the project; their new paths."""
    copied = []
    for source in asset_files(root):
        target = out / source.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        copied.append(target)
    return copied


def install_requirements(out: Path, python_version: str, platform_tag: str) -> None:
    """``pip install --target`` of :data:`REQUIREMENTS` as wheels for that Python and platform."""
    command = [
        sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
        "--target", str(out), "--platform", platform_tag, "--implementation", "cp",
        "--python-version", python_version, "--only-binary=:all:",
        "--no-compile", "-r", str(REQUIREMENTS),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(
            "bundling the Lambda dependencies with pip failed "
            f"(exit {result.returncode}):\n{result.stderr.strip()}"
        )


def build(out: Path, python_version: str, platform_tag: str) -> None:
    """The whole asset in ``out``: the dependencies, then the handlers and their modules."""
    install_requirements(out, python_version, platform_tag)
    copy_sources(out)


def lambda_platform(architecture: str) -> str:
    """The wheels' platform for a Lambda architecture (``arm64`` or ``x86_64``)."""
    return f"manylinux2014_{'aarch64' if architecture == 'arm64' else 'x86_64'}"


def host_target() -> tuple[str, str]:
    """(Python version, platform) of this interpreter on this machine, to build an asset that
    imports here (the tests, the benchmark's cold-start timing)."""
    machine = platform.machine().lower()
    arch = "arm64" if machine in ("aarch64", "arm64") else "x86_64"
    return f"{sys.version_info.major}.{sys.version_info.minor}", lambda_platform(arch)


def zipped_size(directory: Path) -> int:
    """Bytes of ``directory`` zipped (deflated), as the asset is uploaded."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(directory.rglob("*")):
            if path.is_file():
                archive.write(path, path.relative_to(directory))
    return buffer.tell()


def tree_size(directory: Path) -> int:
    """Bytes of the files under ``directory`` (unzipped)."""
    return sum(path.stat().st_size for path in directory.rglob("*") if path.is_file())
