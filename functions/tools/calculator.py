"""The ``calculator`` tool: safe arithmetic (swarm.core.calculator: parsed, never eval'd,
bounded). It calls no AWS service; its role may only write its own logs."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from functions.tools import serve
from swarm.core.calculator import CalculatorError, evaluate
from swarm.core.tool_protocol import ToolEvent, ToolInputError

TOOLS: dict[str, dict[str, Any]] = {
    "calculator": {
        "description": (
            "Evaluates an arithmetic expression exactly: numbers, + - * / // % **, parentheses, "
            "pi, e, and abs round min max sqrt log exp sin cos tan floor ceil. Use it instead "
            "of computing by hand."
        ),
        "input_schema": {
            "type": "object",
            "properties": {
                "expression": {"type": "string", "description": "e.g. (17.5 * 12) / 3 - 2**10"}
            },
            "required": ["expression"],
        },
        "effect": "read",
    }
}


_cache: dict[str, Any] = {}  # nothing to cache: no client (the handlers' common shape)


def run(call: ToolEvent) -> Any:
    try:
        value = evaluate(call.input.get("expression"))  # type: ignore[arg-type]
    except CalculatorError as problem:
        raise ToolInputError(f"expression: {problem}") from None
    return {"expression": call.input["expression"], "value": value}


def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return serve(event, TOOLS, run)
