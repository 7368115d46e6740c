"""What a tool source module declares, read from its source text (no import: infra imports no
handler, and synth must not run a tool's code). A module ``functions/tools/<source>.py`` declares
the tools it serves as a literal ``TOOLS = {name: {"description", "input_schema", "effect"}}``.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TOOL_SOURCES_DIR = ROOT / "functions" / "tools"


class SourceError(ValueError):
    """The source module is missing or its ``TOOLS`` is not a literal of the expected shape."""


def source_path(source: str, root: Path = ROOT) -> Path:
    return root / "functions" / "tools" / f"{source}.py"


def declared_tools(source: str, root: Path = ROOT) -> dict[str, dict[str, Any]]:
    """The ``TOOLS`` literal of ``functions/tools/<source>.py``."""
    path = source_path(source, root)
    if not path.is_file():
        available = sorted(
            p.stem for p in (root / "functions" / "tools").glob("*.py") if p.stem != "__init__"
        )
        raise SourceError(
            f"there is no module functions/tools/{source}.py in this repository "
            f"(sources: {', '.join(available) or 'none'})"
        )
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in tree.body:
        target: ast.expr | None = None
        expression: ast.expr | None = None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, expression = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign):
            target, expression = node.target, node.value
        if isinstance(target, ast.Name) and target.id == "TOOLS" and expression is not None:
            try:
                value = ast.literal_eval(expression)
            except ValueError:
                raise SourceError(f"functions/tools/{source}.py: TOOLS is not a literal") from None
            if not isinstance(value, dict) or not all(
                isinstance(k, str) and isinstance(v, dict) for k, v in value.items()
            ):
                raise SourceError(
                    f"functions/tools/{source}.py: TOOLS must map tool names to objects"
                )
            return value
    raise SourceError(f"functions/tools/{source}.py declares no TOOLS")
