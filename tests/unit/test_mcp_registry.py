"""MCP entries in the worker's registry and the API's grants (swarm.adapters.tools), and how a
call's result becomes the loop's outcome (swarm.adapters.mcp_tools.outcome_of): pure, no server."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from swarm.adapters.mcp_tools import outcome_of
from swarm.adapters.tools import RegistryError, ToolRegistry, grants_from_json
from swarm.core.agent import ToolOutcome
from swarm.core.tool_protocol import MAX_ERROR_CHARS

REGISTRY = {
    "functions": {},
    "tools": {},
    "toolsets": {},
    "mcp": {
        "search": {"url": "https://s.example.com/mcp", "timeout": 20, "tools": ["web_search"]},
        "open": {"url": "https://o.example.com/mcp", "timeout": 10, "secret": "tok"},
    },
    "grants": {"defaults": ["search"], "overrides": {"acme": ["search", "open"]}},
}


def test_the_registry_reads_the_servers_and_keeps_an_entry_name_beside_its_tools() -> None:
    registry = ToolRegistry.from_json(json.dumps(REGISTRY))
    assert registry.mcp["search"].tools == ("web_search",)
    assert registry.mcp["open"].tools is None and registry.mcp["open"].secret == "tok"
    # a tenant granted a listed server: its tools and its entry's name, nothing else
    assert "web_search" in registry.allowed("demo") and "search" in registry.allowed("demo")
    assert "anything" not in registry.allowed("demo")
    # a tenant granted an open server: any name Converse takes (the worker checks the listing)
    assert "anything" in registry.allowed("acme") and "not a name" not in registry.allowed("acme")


def test_the_apis_view_accepts_an_open_servers_names_only_when_one_is_registered() -> None:
    one = {"defaults": ["search"], "overrides": {}}
    grants = grants_from_json(
        json.dumps({"tools": [], "mcp": {"search": ["web_search"]}, "grants": one})
    )
    view = grants.registry_view()
    assert "web_search" in view and "anything" not in view
    assert grants.open_servers == frozenset()
    opened = grants_from_json(json.dumps({"tools": [], "mcp": {"search": None}, "grants": one}))
    assert "anything" in opened.registry_view() and opened.open_servers == {"search"}


def test_an_open_server_grants_no_registered_tool_the_tenant_was_not_granted() -> None:
    doc = {
        "functions": {"notes": "arn:aws:lambda:us-east-1:123456789012:function:notes"},
        "tools": {
            "notes_write": {
                "arn": "arn:aws:lambda:us-east-1:123456789012:function:notes",
                "timeout": 10,
                "effect": "write",
                "description": "Write a note",
                "input_schema": {"type": "object"},
            }
        },
        "toolsets": {},
        "mcp": {"open": {"url": "https://o.example.com/mcp", "timeout": 10}},
        "grants": {"defaults": ["open"], "overrides": {"writer": ["open", "notes_write"]}},
    }
    registry = ToolRegistry.from_json(json.dumps(doc))
    # granted the open server only: its names, not the Lambda tool granted to another tenant
    assert "whatever_it_lists" in registry.allowed("demo")
    assert "notes_write" not in registry.allowed("demo")
    assert "notes_write" in registry.allowed("writer")
    grants = grants_from_json(json.dumps({"tools": ["notes_write"], **doc_grants(doc)}))
    assert "notes_write" not in grants.allowed("demo")


def doc_grants(doc: dict[str, Any]) -> dict[str, Any]:
    return {"mcp": {name: None for name in doc["mcp"]}, "grants": doc["grants"]}


def test_a_grant_naming_neither_a_tool_nor_a_server_is_refused() -> None:
    doc = {**REGISTRY, "grants": {"defaults": ["nowhere"], "overrides": {}}}
    with pytest.raises(RegistryError, match="nowhere"):
        ToolRegistry.from_json(json.dumps(doc))


@dataclass
class Block:
    text: str | None = None
    type: str = "text"


@dataclass
class Result:
    content: list[Any] = field(default_factory=list)
    structured_content: Any = None
    is_error: bool = False


@pytest.mark.parametrize(
    ("result", "outcome"),
    [
        (Result([Block('{"a": 1}')], {"a": 1, "b": 2}), ToolOutcome("success", {"a": 1, "b": 2})),
        (Result([Block('{"a": 1}')]), ToolOutcome("success", {"a": 1})),
        (Result([Block("plain words")]), ToolOutcome("success", "plain words")),
        (
            Result([Block("one"), Block(None, "image")]),
            ToolOutcome("success", ["one", "[image]"]),
        ),
        (
            Result([Block("the ledger is closed")], is_error=True),
            ToolOutcome("error", "the tool 'w' failed: the ledger is closed"),
        ),
    ],
)
def test_a_results_content_becomes_the_outcome(result: Result, outcome: ToolOutcome) -> None:
    assert outcome_of("w", result) == outcome


def test_an_error_text_is_cut_for_the_model() -> None:
    outcome = outcome_of("w", Result([Block("x" * 5000)], is_error=True))
    assert outcome.status == "error" and len(outcome.value) == MAX_ERROR_CHARS
