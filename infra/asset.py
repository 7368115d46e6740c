"""What the functions' asset holds: the handlers, the modules of ``swarm/`` they import, the tool
sources' declarations files (``functions/tools/*.tools.json``), and the pinned runtime
dependencies, with the part of ``bfcl-eval`` the BFCL toolset runs (:data:`NODEPS_KEEP`).
Nothing else: no local stack, simulator, CLI or benchmark code.

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
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FUNCTIONS_DIR = ROOT / "functions"
LIBRARY_DIR = ROOT / "swarm"
REQUIREMENTS = FUNCTIONS_DIR / "requirements.txt"
#: dependencies installed without their own (their lists are far wider than the part used), of
#: which the asset keeps only :data:`NODEPS_KEEP`
REQUIREMENTS_NODEPS = FUNCTIONS_DIR / "requirements-nodeps.txt"
#: what the asset keeps of them (paths under the install target; a folder keeps all it holds):
#: BFCL's multi-turn backends, the base category's entries and answers, its function docs, and
#: the package's license metadata. Not its model handlers, other categories or scripts (15 MB).
NODEPS_KEEP = (
    "bfcl_eval/__init__.py",
    "bfcl_eval/constants/__init__.py",
    "bfcl_eval/constants/executable_backend_config.py",
    "bfcl_eval/eval_checker/__init__.py",
    "bfcl_eval/eval_checker/multi_turn_eval",
    "bfcl_eval/data/BFCL_v4_multi_turn_base.json",
    "bfcl_eval/data/possible_answer/BFCL_v4_multi_turn_base.json",
    "bfcl_eval/data/multi_turn_func_doc",
    "bfcl_eval-*.dist-info",
)
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


def declarations_files(root: Path = ROOT) -> list[Path]:
    """The tool sources' declarations files (infra/tool_sources.py): the worker and the API read
    a toolset's specs from them."""
    return sorted((root / "functions" / "tools").glob("*.tools.json"))


def asset_files(root: Path = ROOT) -> list[Path]:
    """The project's files in the asset (absolute paths, sorted)."""
    return sorted([*asset_modules(root).values(), *declarations_files(root)])


def copy_sources(out: Path, root: Path = ROOT) -> list[Path]:
    """Copy the asset's modules into ``out`` at their paths in the project; their new paths."""
    copied = []
    for source in asset_files(root):
        target = out / source.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        copied.append(target)
    return copied


def install_requirements(
    out: Path,
    python_version: str,
    platform_tag: str,
    requirements: Path = REQUIREMENTS,
    extra: tuple[str, ...] = (),
) -> None:
    """``pip install --target`` of ``requirements`` as wheels for that Python and platform."""
    command = [
        sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
        "--target", str(out), "--platform", platform_tag, "--implementation", "cp",
        "--python-version", python_version, "--only-binary=:all:",
        "--no-compile", *extra, "-r", str(requirements),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(
            "bundling the Lambda dependencies with pip failed "
            f"(exit {result.returncode}):\n{result.stderr.strip()}"
        )


def install_nodeps(out: Path, python_version: str, platform_tag: str) -> None:
    """:data:`REQUIREMENTS_NODEPS` without their dependencies, keeping :data:`NODEPS_KEEP`."""
    with tempfile.TemporaryDirectory() as scratch:
        staged = Path(scratch)
        install_requirements(
            staged, python_version, platform_tag, REQUIREMENTS_NODEPS, ("--no-deps",)
        )
        for pattern in NODEPS_KEEP:
            found = sorted(staged.glob(pattern))
            if not found:
                raise RuntimeError(
                    f"bundling: {pattern} is not in {REQUIREMENTS_NODEPS.name}'s packages "
                    "(a new version moved it: update infra/asset.py NODEPS_KEEP)"
                )
            for path in found:
                target = out / path.relative_to(staged)
                if path.is_dir():
                    shutil.copytree(
                        path,
                        target,
                        dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__"),
                    )
                else:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(path, target)


def build(out: Path, python_version: str, platform_tag: str) -> None:
    """The whole asset in ``out``: the dependencies, then the handlers and their modules."""
    install_requirements(out, python_version, platform_tag)
    install_nodeps(out, python_version, platform_tag)
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
