"""BFCL's multi-turn backends as a toolset (cdk.json ``"bfcl": {"source": "bfcl", "toolset":
true}``): a file system, messaging, posting, tickets, trading, travel, vehicle control and math,
128 functions, declared in ``bfcl.tools.json`` beside this module (written from ``bfcl-eval``'s
function docs by ``python -m swarm.workloads.bfcl --write-declarations``).

Each unit of a BFCL batch has backends of its own, kept durably as its *journal* in the tool
journals table (swarm.adapters.tool_journals): the calls that ran, each under its idempotency key
with its outcome. A call rebuilds the unit's backends from the journal (cached while the journal
does not move) and runs at most once per key: a repeated key answers its first outcome. A unit is
found by its id (BFCL's entry id, ``_`` as ``-``); any other unit gets an error result. The role
holds Query and PutItem on the journals table alone.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from functions import service_logger
from swarm.core.agent import ToolCall
from swarm.core.tool_protocol import ToolEventError, error, parse_event
from swarm.wiring import tool_journals, tool_source_declarations
from swarm.workloads.bfcl import BfclTools

SOURCE = "bfcl"
logger = service_logger()
_cache: dict[str, BfclTools] = {}


def tools() -> BfclTools:
    if "tools" not in _cache:
        _cache["tools"] = BfclTools(tool_journals())
    return _cache["tools"]


def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    try:
        call = parse_event(event, tool_source_declarations(SOURCE))
    except ToolEventError as problem:  # its kind, not its text (the model's input: not logged)
        tool = event.get("tool") if isinstance(event, dict) else None
        logger.info("tool input refused", tool=str(tool), kind="ToolEventError")
        return error(str(problem))
    tool_use_id = call.idempotency_key.rsplit("/", 1)[-1]
    request = ToolCall(0, tool_use_id, call.tool, call.input, call.idempotency_key)
    outcome = tools().run(request, call.tenant)
    return {"status": outcome.status, "content": outcome.value}
