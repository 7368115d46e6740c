"""What a tool source module declares, read from this repository's files (no import: infra
imports no handler, and synth must not run a tool's code): swarm.core.tool_declarations reads
them, here from the repository, in the worker and the API from the asset."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from swarm.core.tool_declarations import Reader, SourceError, module_path
from swarm.core.tool_declarations import declared_tools as _declared

ROOT = Path(__file__).resolve().parent.parent

__all__ = ["SourceError", "declared_tools"]


def _reader(root: Path) -> Reader:
    def read(relative: str) -> str | None:
        path = root / relative
        return path.read_text(encoding="utf-8") if path.is_file() else None

    return read


def declared_tools(source: str, root: Path = ROOT) -> dict[str, dict[str, Any]]:
    """The tools ``functions/tools/<source>`` declares; :class:`SourceError` naming the sources
    there are when it is missing."""
    if not (root / module_path(source)).is_file():
        available = sorted(
            p.stem for p in (root / "functions" / "tools").glob("*.py") if p.stem != "__init__"
        )
        raise SourceError(
            f"there is no module {module_path(source)} in this repository "
            f"(sources: {', '.join(available) or 'none'})"
        )
    return _declared(source, _reader(root))
