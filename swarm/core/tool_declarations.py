"""What a tool source declares (docs/agents.md, "Tools"), read from its files' text: no import
(synth must not run a tool's code, and the worker need not load the tool's handler).

A module ``functions/tools/<source>.py`` declares the tools it serves as a literal ``TOOLS =
{name: {"description", "input_schema", "effect"}}``, or, when they are many or generated (BFCL's
128 functions), in a JSON file of the same shape beside it, ``functions/tools/<source>.tools.json``
(:data:`DECLARATIONS_SUFFIX`). The functions' asset carries both, so the worker and the API read
a source's tools from them at run time (swarm.adapters.tools), and synth reads them from this
repository (infra/tool_sources.py): Lambda's 4 KB of variables carries only what cdk.json
changes. Pure: the caller gives a reader of the files' text.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Callable
from typing import Any, Final

#: a source's declarations in a file of their own: ``functions/tools/<source>.tools.json``
DECLARATIONS_SUFFIX: Final = ".tools.json"
#: where the sources are, under the repository's (and the asset's) root
SOURCES_DIR: Final = "functions/tools"

#: a file's text by its path under the root, or None when there is no such file
Reader = Callable[[str], "str | None"]


class SourceError(ValueError):
    """The source module is missing or its ``TOOLS`` is not a literal of the expected shape."""


def module_path(source: str) -> str:
    return f"{SOURCES_DIR}/{source}.py"


def declarations_path(source: str) -> str:
    return f"{SOURCES_DIR}/{source}{DECLARATIONS_SUFFIX}"


def declared_tools(source: str, read: Reader) -> dict[str, dict[str, Any]]:
    """The tools ``source`` declares: its declarations file, else its module's ``TOOLS``
    literal; :class:`SourceError` when the module is missing or declares none."""
    module = read(module_path(source))
    if module is None:
        raise SourceError(f"there is no module {module_path(source)}")
    text = read(declarations_path(source))
    if text is not None:
        try:
            value = json.loads(text)
        except ValueError as error:
            raise SourceError(f"{declarations_path(source)} is not JSON: {error}") from None
        return _checked(source, value)
    tree = ast.parse(module, filename=module_path(source))
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
                raise SourceError(f"{module_path(source)}: TOOLS is not a literal") from None
            return _checked(source, value)
    raise SourceError(
        f"{module_path(source)} declares no TOOLS (and there is no {declarations_path(source)})"
    )


def _checked(source: str, value: Any) -> dict[str, dict[str, Any]]:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, dict) for k, v in value.items()
    ):
        raise SourceError(f"{SOURCES_DIR}/{source}: TOOLS must map tool names to objects")
    return value
