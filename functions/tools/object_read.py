"""The ``object_read`` tool: reads a text object of the calling tenant's own folder of the batch
bucket (``manifests/uploads/<tenant>/``, swarm.adapters.tool_objects), at most 64 KiB of it.
Its role may only ``s3:GetObject`` under that prefix of the bucket."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from functions.tools import serve
from swarm.core.tool_protocol import ToolEvent
from swarm.wiring import tenant_objects

TOOLS: dict[str, dict[str, Any]] = {
    "object_read": {
        "description": (
            "Reads a text file your tenant uploaded (POST /uploads), by its key inside your "
            "folder, e.g. the upload id. Returns at most the first 64 KiB and says if it cut."
        ),
        "input_schema": {
            "type": "object",
            "properties": {
                "key": {"type": "string", "description": "the object's key in your folder"}
            },
            "required": ["key"],
        },
        "effect": "read",
    }
}

_cache: dict[str, Any] = {}


def reader() -> Any:
    if "reader" not in _cache:
        _cache["reader"] = tenant_objects()
    return _cache["reader"]


def run(call: ToolEvent) -> Any:
    return reader().read(call.tenant, call.input.get("key"))


def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return serve(event, TOOLS, run)
