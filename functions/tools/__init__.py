"""Tool functions: one module per tool *source*, each built by the stack as a Lambda function
with a role of its own (infra/tools.py). A module declares the tools it serves in ``TOOLS``
(name -> ``description``, ``input_schema``, ``effect``: a literal, which infra reads at synth
without importing the module) and exposes ``handler``. The protocol is
swarm.core.tool_protocol's; docs/agents.md, "Tools", describes the shipped ones.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from functions import service_logger
from swarm.core.tool_protocol import (
    ToolEvent,
    ToolEventError,
    ToolInputError,
    error,
    parse_event,
    success,
)

logger = service_logger()


def serve(event: Any, tools: Mapping[str, Any], run: Callable[[ToolEvent], Any]) -> dict[str, Any]:
    """Parse ``event``, run it, answer the protocol's ``{"status", "content"}``: a bad event or
    a bad input is an ``error`` answer naming what to send; anything else (the store failing)
    raises, which Lambda reports as a FunctionError and the worker as a tool error."""
    try:
        call = parse_event(event, tools)
        content = run(call)
    except (ToolEventError, ToolInputError) as problem:
        # the refusal's kind, not its text: the text quotes the model's input, which the
        # functions never log (infra/checkov.py, the log groups' key)
        logger.info(
            "tool input refused",
            tool=str(event.get("tool") if isinstance(event, dict) else None),
            kind=type(problem).__name__,
        )
        return error(str(problem))
    return success(content)
