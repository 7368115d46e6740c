"""The layout stays readable: no class name means two different things across the project.

(The layers themselves are enforced by import-linter's contracts in pyproject.toml.)
"""

from __future__ import annotations

import ast
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
