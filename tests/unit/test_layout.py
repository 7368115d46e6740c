"""The layout stays readable: no class name means two different things across the project.

(The layers themselves are enforced by import-linter's contracts in pyproject.toml.)
"""

from __future__ import annotations

import ast
import tomllib
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("swarm", "functions", "infra")


def _classes() -> dict[str, list[str]]:
    found: dict[str, list[str]] = defaultdict(list)
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in tree.body:
                if isinstance(node, ast.ClassDef):
                    found[node.name].append(str(path.relative_to(ROOT)))
    return found


def test_no_class_name_is_defined_twice() -> None:
    classes = _classes()
    assert len(classes) > 50, "the scan found too few classes: is ROOT right?"
    twice = {name: paths for name, paths in classes.items() if len(paths) > 1}
    assert not twice, f"one name, two classes (rename one): {twice}"


def _cdk_modules_imported() -> set[str]:
    """The aws_cdk modules the type-checked code imports (``import aws_cdk``, ``from aws_cdk
    import aws_x``, ``import aws_cdk.aws_x``, ``from aws_cdk.aws_x import ...``)."""
    found: set[str] = set()
    paths = [ROOT / "app.py"]
    for package in PACKAGES:
        paths.extend(sorted((ROOT / package).rglob("*.py")))
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.split(".")[0] == "aws_cdk")
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module == "aws_cdk":
                    found.add("aws_cdk")
                    found.update(f"aws_cdk.{a.name}" for a in node.names if a.name.islower())
                elif node.module.startswith("aws_cdk."):
                    found.update({"aws_cdk", node.module})
    return found


def test_mypy_reads_every_cdk_module_the_code_imports() -> None:
    """pyproject.toml skips aws_cdk's modules for mypy except those it lists (a cold check
    took 175 s with all of them): a module imported but not listed would be unchecked (Any)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    overrides = config["tool"]["mypy"]["overrides"]
    read = {
        module
        for override in overrides
        if override.get("follow_imports") == "normal"
        for module in override["module"]
    }
    imported = _cdk_modules_imported()
    assert "aws_cdk.aws_lambda" in imported, "the scan found no CDK import: is ROOT right?"
    missing = sorted(imported - read)
    assert not missing, (
        f"add {missing} to the follow_imports = 'normal' override of [tool.mypy] in pyproject.toml"
    )
    unused = sorted(read - imported)
    assert not unused, f"no code imports {unused}: remove them from that mypy override"
