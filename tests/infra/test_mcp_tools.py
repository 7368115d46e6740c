"""MCP servers in the tool registry (docs/agents.md, "MCP tools"): validated at synth, every
error naming its key; the worker's role may read exactly the configured auth secrets (a name
with Secrets Manager's ``-??????`` suffix wildcard, an ARN as given), nothing when none has one;
the registry reaches the worker and the grants the API."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from infra.config import ConfigError, load_config
from infra.context import cdk_json_context
from swarm import contract as env
from swarm.adapters.tools import ToolRegistry, grants_from_json
from swarm.contract import WORKER
from tests.infra.conftest import Synthesized, synthesize
from tests.infra.helpers import as_list, statements_of_role
from tests.infra.test_permissions import EXPECTED, granted
from tests.infra.test_tools import _resolve

THEIR_SECRET = "arn:aws:secretsmanager:us-east-1:123456789012:secret:their/mcp-token-AbCdEf"


def _context(tools: dict[str, Any], grants: list[str], stage: str | None = None) -> dict[str, Any]:
    context = copy.deepcopy(cdk_json_context())
    context["tools"] = {**context["tools"], **tools}
    defaults = context["tenants"]["defaults"]
    context["tenants"]["defaults"] = {**defaults, "tools": [*defaults["tools"], *grants]}
    if stage is not None:
        context["stage"] = stage
    return context


SERVERS = {
    "search": {
        "mcp": {
            "url": "https://mcp.example.com/mcp",
            "auth_secret": "swarm/search-token",
            "tools": ["web_search", "fetch_page"],
        },
        "effect": "read",
        "timeout_seconds": 20,
    },
    "crm": {
        "mcp": {"url": "https://crm.example.com/mcp", "auth_secret": THEIR_SECRET},
        "approval": "required",
    },
    "open": {"mcp": {"url": "https://open.example.com/mcp"}},
}


@pytest.fixture(scope="module")
def mcp_synth(tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    context = _context(SERVERS, ["search", "crm", "open"])
    return synthesize(tmp_path_factory.mktemp("cdk-mcp"), context, nag=True)


def _secret_reads(synth: Synthesized) -> list[dict[str, Any]]:
    return [
        s
        for s in statements_of_role(synth, synth.stack.workers.worker.role)
        if any(a.startswith("secretsmanager:") for a in as_list(s["Action"]))
    ]


def test_the_worker_may_read_exactly_the_configured_secrets(mcp_synth: Synthesized) -> None:
    [statement] = _secret_reads(mcp_synth)
    assert as_list(statement["Action"]) == ["secretsmanager:GetSecretValue"]
    resources = as_list(statement["Resource"])
    assert THEIR_SECRET in resources and len(resources) == 2
    [by_name] = [r for r in resources if r != THEIR_SECRET]
    # a name: the ARN Secrets Manager gives it, with its six random characters as a wildcard
    assert by_name == {
        "Fn::Join": [
            "",
            [
                "arn:",
                {"Ref": "AWS::Partition"},
                ":secretsmanager:",
                {"Ref": "AWS::Region"},
                ":",
                {"Ref": "AWS::AccountId"},
                ":secret:swarm/search-token-??????",
            ],
        ]
    }
    # no other role may read them
    for role in mcp_synth.of_type("AWS::IAM::Policy").values():
        for s in role["Properties"]["PolicyDocument"]["Statement"]:
            if any(a.startswith("secretsmanager:") for a in as_list(s["Action"])):
                assert statement == s


def test_without_an_mcp_secret_the_worker_reads_no_secret(synth: Synthesized) -> None:
    assert _secret_reads(synth) == []


def test_the_registry_carries_the_servers_to_the_worker_and_the_grants_to_the_api(
    mcp_synth: Synthesized,
) -> None:
    functions = {
        f["Properties"]["Handler"]: f["Properties"]
        for f in mcp_synth.of_type("AWS::Lambda::Function").values()
    }
    worker = functions["functions.worker.handler"]["Environment"]["Variables"]
    registry = ToolRegistry.from_json(_resolve(worker[env.TOOL_REGISTRY], mcp_synth))
    assert set(registry.mcp) == {"search", "crm", "open"}
    search = registry.mcp["search"]
    assert search.url == "https://mcp.example.com/mcp" and search.timeout_s == 20
    assert search.tools == ("web_search", "fetch_page") and search.effect == "read"
    assert search.secret == "swarm/search-token"
    assert registry.mcp["open"].tools is None and registry.mcp["open"].secret is None
    # an entry's approval: required reaches the worker, which gates every tool of that server
    assert registry.mcp["crm"].approval and not search.approval
    api = functions["functions.api.handler"]["Environment"]["Variables"]
    grants = grants_from_json(_resolve(api[env.TOOL_GRANTS], mcp_synth))
    assert {"web_search", "fetch_page"} <= grants.names
    assert grants.open_servers == {"crm", "open"}
    allowed = grants.allowed("demo")
    # a listed tool by its name; an open server's tools by any name (the worker checks it)
    assert "web_search" in allowed and "anything_else" in allowed and "bad name" not in allowed
    view = grants.registry_view()
    assert "fetch_page" in view and "whatever_open_lists" in view


def test_an_open_server_grants_no_unknown_name_to_a_tenant_not_granted_it() -> None:
    context = _context(SERVERS, [])
    context["tenants"]["overrides"] = {"acme": {"tools": ["search"]}}
    config = load_config(context)
    grants = grants_from_json(config.tool_grants_value())
    assert "anything_else" not in grants.allowed("acme")
    assert "web_search" in grants.allowed("acme")
    assert "web_search" not in grants.allowed("demo")


@pytest.mark.parametrize(
    ("tools", "grants", "stage", "key", "says"),
    [
        (
            {"m": {"mcp": {"url": "http://mcp.example.com/mcp"}}},
            [],
            None,
            "tools.m.mcp.url",
            "https://",
        ),
        (  # http to localhost only on the local stack
            {"m": {"mcp": {"url": "http://127.0.0.1:8000/mcp"}}},
            [],
            None,
            "tools.m.mcp.url",
            "local stack",
        ),
        (
            {"m": {"mcp": {"url": "https://user:pw@mcp.example.com/mcp"}}},
            [],
            None,
            "tools.m.mcp.url",
            "auth_secret",
        ),
        (
            {"m": {"mcp": {"url": "https://x.example.com/mcp"}, "source": "calculator"}},
            [],
            None,
            "tools.m.source",
            "mcp entry",
        ),
        (
            {"m": {"mcp": {"url": "https://x.example.com/mcp", "tools": ["a b"]}}},
            [],
            None,
            "tools.m.mcp.tools[0]",
            "Converse",
        ),
        (
            {"m": {"mcp": {"url": "https://x.example.com/mcp", "tools": ["calculator"]}}},
            [],
            None,
            "tools.m.mcp.tools[0]",
            "unique",
        ),
        (
            {"m": {"mcp": {"url": "https://x.example.com/mcp", "auth_secret": "a secret"}}},
            [],
            None,
            "tools.m.mcp.auth_secret",
            "",
        ),
        (
            {"m": {"mcp": {"url": "https://x.example.com/mcp", "tools": ["lookup"]}}},
            ["lookup"],
            None,
            "tenants.defaults.tools",
            "grant the entry's name ('m')",
        ),
    ],
)
def test_a_bad_mcp_entry_fails_synth_naming_its_key(
    tools: dict[str, Any], grants: list[str], stage: str | None, key: str, says: str
) -> None:
    with pytest.raises(ConfigError) as error:
        load_config(_context(tools, grants, stage))
    assert key in str(error.value) and says in str(error.value), str(error.value)


def test_http_to_localhost_is_accepted_on_the_local_stack() -> None:
    tools = {"m": {"mcp": {"url": "http://127.0.0.1:8000/mcp", "tools": ["lookup"]}}}
    config = load_config(_context(tools, ["m"], stage="local"))
    assert config.mcp_servers()["m"].url == "http://127.0.0.1:8000/mcp"


def test_an_mcp_registry_is_counted_in_the_4_kb_check(tmp_path: Path) -> None:
    long = {f"m{i}": {"mcp": {"url": "https://x.example.com/" + "p" * 400}} for i in range(6)}
    with pytest.raises(ConfigError, match="4 KB"):
        load_config(_context(long, []))


def test_the_workers_permission_table_gains_exactly_the_secret_reads(
    mcp_synth: Synthesized,
) -> None:
    table = granted(mcp_synth, WORKER)
    secrets = {label: actions for label, actions in table.items() if ":secret:" in label}
    assert {label: actions for label, actions in table.items() if label not in secrets} == (
        EXPECTED[WORKER]
    )
    assert len(secrets) == 2 and set(secrets.values()) == {
        frozenset({"secretsmanager:GetSecretValue"})
    }
    assert any(label.endswith(THEIR_SECRET) or THEIR_SECRET in label for label in secrets)
    assert any("swarm/search-token-??????" in label for label in secrets)
