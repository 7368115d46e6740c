"""The ``notes_read``, ``notes_write`` and ``notes_publish`` tools: a key-value store of the
calling tenant's own (swarm.adapters.tool_notes, a DynamoDB table of its own). ``notes_write``
and ``notes_publish`` (the same write, meant to be registered gated: the local stack's operator
decides its calls) have at most one effect per idempotency key; the role holds item rights on
the notes table alone."""

from __future__ import annotations

import time
from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from functions.tools import serve
from swarm.core.tool_protocol import ToolEvent
from swarm.wiring import notes_store

TOOLS: dict[str, dict[str, Any]] = {
    "notes_read": {
        "description": (
            "Reads a note you (or an earlier unit of your tenant) saved with notes_write. "
            "Give a name to read that note; give no name to list the names of your notes."
        ),
        "input_schema": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "description": "1-128 letters, digits or _.:/-"}
            },
        },
        "effect": "read",
    },
    "notes_write": {
        "description": (
            "Saves a text note under a name, replacing the note of that name. Notes are kept "
            "for your tenant and can be read by later turns and units with notes_read."
        ),
        "input_schema": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "description": "1-128 letters, digits or _.:/-"},
                "value": {
                    "type": "string",
                    "description": "the note's text (at most 16,000 characters)",
                },
            },
            "required": ["name", "value"],
        },
        "effect": "write",
    },
    "notes_publish": {
        "description": (
            "Publishes a text note under a name, replacing the note of that name, as notes_write "
            "saves one; where it is registered gated, each call waits for its approvers."
        ),
        "input_schema": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "description": "1-128 letters, digits or _.:/-"},
                "value": {
                    "type": "string",
                    "description": "the note's text (at most 16,000 characters)",
                },
            },
            "required": ["name", "value"],
        },
        "effect": "write",
    },
}

_cache: dict[str, Any] = {}


def store() -> Any:
    if "store" not in _cache:
        _cache["store"] = notes_store()
    return _cache["store"]


def run(call: ToolEvent) -> Any:
    if call.tool == "notes_read":
        name = call.input.get("name")
        if name is None:
            return store().names(call.tenant)
        return store().read(call.tenant, name)
    return store().write(
        call.tenant,
        call.idempotency_key,
        call.input.get("name"),
        call.input.get("value"),
        time.time(),
    )


def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return serve(event, TOOLS, run)
