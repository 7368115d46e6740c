"""The protocol between the worker and a tool function (docs/agents.md, "Tools"): the event a
tool function receives and the answer it gives. Pure: the handlers in functions/tools/ and the
worker's executor (swarm.adapters.tools) share it.

- event ``{"tool": name, "input": {...}, "idempotency_key": "<batch>/<unit>/<toolUseId>",
  "tenant": t, "batch": b, "unit": u}``;
- answer ``{"status": "success" | "error", "content": <JSON value or text>}``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from swarm.core.records import TENANT_PATTERN

#: the most characters of a tool's error text the model is given
MAX_ERROR_CHARS: Final = 1000
_TENANT: Final = re.compile(TENANT_PATTERN)


class ToolInputError(ValueError):
    """The model's input is not one the tool takes: an ``error`` answer whose message says what
    to send instead (never an exception out of the handler)."""


@dataclass(frozen=True)
class ToolEvent:
    tool: str
    input: dict[str, Any]
    idempotency_key: str
    tenant: str
    batch: str
    unit: str


class ToolEventError(ValueError):
    """The event is not the protocol's; the message says which field."""


def parse_event(event: Any, tools: Mapping[str, Any]) -> ToolEvent:
    """The event, checked: a tool this function serves, an object input, a tenant name."""
    if not isinstance(event, dict):
        raise ToolEventError("the event must be an object {tool, input, idempotency_key, tenant}")
    name = event.get("tool")
    if name not in tools:
        raise ToolEventError(
            f"tool: {name!r} is not served here; this function serves {sorted(tools)}"
        )
    value = event.get("input")
    if not isinstance(value, dict):
        raise ToolEventError(
            f"input: the {name} tool takes a JSON object (got {type(value).__name__})"
        )
    tenant = event.get("tenant")
    if not isinstance(tenant, str) or not _TENANT.match(tenant):
        raise ToolEventError(f"tenant: {tenant!r} is not a tenant name")
    key = event.get("idempotency_key")
    if not isinstance(key, str) or not 1 <= len(key) <= 512:
        raise ToolEventError("idempotency_key: must be a text of 1 to 512 characters")
    return ToolEvent(
        str(name), value, key, tenant, str(event.get("batch") or ""), str(event.get("unit") or "")
    )


def success(content: Any) -> dict[str, Any]:
    return {"status": "success", "content": content}


def error(message: str) -> dict[str, Any]:
    return {"status": "error", "content": message[:MAX_ERROR_CHARS]}
