"""The worker's MCP client (swarm.adapters.mcp_tools) against a real MCP server of the ``mcp``
package (swarm.local.mcp_server: MCPServer, Streamable HTTP, stateless) on a free localhost
port: a call carries its idempotency key in ``_meta`` and the write tool has one effect per key;
one session per invocation per server, reused; a server that answers isError, is down, or is
slower than the timeout gives an error result, never an exception; the auth header comes from
a Secrets Manager secret (moto)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from swarm.adapters.mcp_tools import (
    META_IDEMPOTENCY_KEY,
    McpServer,
    McpServers,
    ToolServerUnavailable,
    auth_headers,
)
from swarm.adapters.tools import LambdaToolExecutor, RegistryTools, ToolRegistry
from swarm.core.agent import ToolCall, ToolOutcome
from swarm.local.mcp_server import LocalMcpServer
from swarm.local.server import free_port

REGION = "us-east-1"


@pytest.fixture(scope="module")
def server() -> Iterator[LocalMcpServer]:
    running = LocalMcpServer()
    running.start()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def guarded() -> Iterator[LocalMcpServer]:
    running = LocalMcpServer(token="s3cret-token")
    running.start()
    yield running
    running.stop()


def _servers(url: str, timeout_s: float = 5.0, read_secret: Any = None, **kw: Any) -> McpServers:
    return McpServers({"local": McpServer("local", url, timeout_s, **kw)}, read_secret)


def _call(name: str, use: str, unit: str = "u1", **input: Any) -> ToolCall:
    return ToolCall(1, use, name, input, f"b1/{unit}/{use}")


def test_a_write_call_carries_its_key_and_has_one_effect_per_key(server: LocalMcpServer) -> None:
    mcp = _servers(server.url)
    try:
        first = mcp.run(_call("tally_write", "t1", entry="a"), "acme", "b1", "u1")
        again = mcp.run(_call("tally_write", "t1", entry="b"), "acme", "b1", "u1")
        other = mcp.run(_call("tally_write", "t2", entry="c"), "acme", "b1", "u1")
    finally:
        mcp.close()
    # the second call with the key answers the first result; a new key is a new effect
    assert first == again == ToolOutcome("success", {"recorded": 1, "entry": "a"})
    assert other == ToolOutcome("success", {"recorded": 2, "entry": "c"})
    report = server.tally.report("b1/u1/")
    assert report["effects"] == {"b1/u1/t1": 1, "b1/u1/t2": 1}
    assert report["calls"] == {"b1/u1/t1": 2, "b1/u1/t2": 1}
    assert report["tenants"]["b1/u1/t1"] == "acme"  # swarm/tenant in the _meta


def test_one_session_per_invocation_per_server_reused_for_its_calls(
    server: LocalMcpServer,
) -> None:
    mcp = _servers(server.url)
    try:
        for i in range(3):
            assert mcp.run(_call("tally_read", f"r{i}", unit="s"), "acme", "b1", "s").status == (
                "success"
            )
        assert mcp.opened == 1
        mcp.end_invocation()  # the next invocation opens its own
        assert mcp.run(_call("tally_read", "r9", unit="s"), "acme", "b1", "s").status == "success"
        assert mcp.opened == 2
    finally:
        mcp.close()


def test_tools_are_listed_at_first_use_with_their_specs_and_effects(
    server: LocalMcpServer,
) -> None:
    everything = _servers(server.url)
    some = _servers(server.url, tools=("tally_write",))
    forced = _servers(server.url, effect="write")
    gated = _servers(server.url, approval=True)
    try:
        listed = everything.listing(everything.servers["local"])
        assert set(listed) == {"tally_write", "tally_read", "slow", "fail"}
        write = listed["tally_write"]
        assert write.effect == "write" and listed["tally_read"].effect == "read"  # readOnlyHint
        assert write.tool.description.startswith("Record a finding")
        assert write.tool.input_schema["type"] == "object"
        assert "entry" in write.tool.input_schema["properties"]
        # a server whose cdk.json entry lists tools exposes those only
        assert some.find("tally_read") is None and some.find("tally_write") is not None
        assert some.known() == ["tally_write"]
        # an entry's effect is every tool's
        assert forced.find("tally_read").effect == "write"  # type: ignore[union-attr]
        # an entry's approval: required gates every tool of its server (and none of another's)
        assert not write.tool.approval
        assert all(t.tool.approval for t in gated.listing(gated.servers["local"]).values())
    finally:
        for each in (everything, some, forced, gated):
            each.close()


def test_is_error_becomes_an_error_result_with_the_servers_message(
    server: LocalMcpServer,
) -> None:
    mcp = _servers(server.url)
    try:
        outcome = mcp.run(_call("fail", "f1", reason="the ledger is closed"), "acme", "b1", "u")
    finally:
        mcp.close()
    assert outcome.status == "error"
    assert "fail" in outcome.value and "the ledger is closed" in outcome.value


def test_a_slow_server_is_an_error_result_after_the_timeout(server: LocalMcpServer) -> None:
    mcp = _servers(server.url, timeout_s=1.0)
    try:
        outcome = mcp.run(_call("slow", "s1", seconds=30), "acme", "b1", "u")
        # and the invocation's next call is served: the mcp package closes a session whose
        # request timed out, so that call opens a new one
        after = mcp.run(_call("tally_read", "s2"), "acme", "b1", "u")
    finally:
        mcp.close()
    assert outcome.status == "error" and "did not answer within 1 s" in outcome.value
    assert after.status == "success" and mcp.opened == 2


def test_a_server_that_is_down_is_an_error_result_and_its_listing_unavailable() -> None:
    down = f"http://127.0.0.1:{free_port()}/mcp"  # nothing listens there
    mcp = _servers(down, tools=("tally_write",), timeout_s=2.0)
    try:
        outcome = mcp.run(_call("tally_write", "d1"), "acme", "b1", "u")
        again = mcp.run(_call("tally_write", "d2"), "acme", "b1", "u")
        with pytest.raises(ToolServerUnavailable, match="'local' could not list its tools"):
            mcp.find("tally_write")
    finally:
        mcp.close()
    assert outcome.status == "error" and "try again in a later turn" in outcome.value
    assert again.status == "error"
    assert mcp.opened == 0  # no session was had, and none retried within the invocation


def test_the_auth_header_is_read_from_a_secret(
    guarded: LocalMcpServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, "testing")
    with mock_aws():
        secrets = boto3.client("secretsmanager", region_name=REGION)
        secrets.create_secret(Name="mcp/token", SecretString="Authorization: Bearer s3cret-token")
        secrets.create_secret(Name="mcp/wrong", SecretString='{"Authorization": "Bearer nope"}')

        def read(secret: str) -> str:
            return str(secrets.get_secret_value(SecretId=secret)["SecretString"])

        right = _servers(guarded.url, secret="mcp/token", read_secret=read)
        wrong = _servers(guarded.url, secret="mcp/wrong", read_secret=read)
        try:
            ok = right.run(_call("tally_write", "a1", unit="auth"), "acme", "b1", "auth")
            refused = wrong.run(_call("tally_write", "a2", unit="auth"), "acme", "b1", "auth")
        finally:
            right.close()
            wrong.close()
    assert ok == ToolOutcome("success", {"recorded": 1, "entry": ""})
    assert guarded.tally.headers == ["Bearer s3cret-token"]
    assert refused.status == "error" and "error response" in refused.value  # its 401
    assert "nope" not in refused.value  # the header's value is never in a result


@pytest.mark.parametrize(
    ("value", "headers"),
    [
        ("Authorization: Bearer abc", {"Authorization": "Bearer abc"}),
        ('{"X-Api-Key": "k1", "X-Org": "o"}', {"X-Api-Key": "k1", "X-Org": "o"}),
    ],
)
def test_a_secret_gives_one_header_line_or_a_json_object(
    value: str, headers: dict[str, str]
) -> None:
    assert auth_headers(value) == headers


@pytest.mark.parametrize("value", ["Bearer abc", '{"a": 1}', "Authorization: x\nOther: y", "[]"])
def test_a_secret_of_another_shape_is_refused_naming_the_format(value: str) -> None:
    with pytest.raises(ValueError, match="header") as error:
        auth_headers(value)
    assert "abc" not in str(error.value)


def test_the_workers_runner_checks_the_tenants_grant_and_routes_to_the_server(
    server: LocalMcpServer,
) -> None:
    doc = {
        "functions": {},
        "tools": {},
        "toolsets": {},
        "mcp": {"local": {"url": server.url, "timeout": 5}},
        "grants": {"defaults": ["local"], "overrides": {"other": []}},
    }
    registry = ToolRegistry.from_json(json.dumps(doc))
    runner = RegistryTools(registry, LambdaToolExecutor(registry), McpServers(registry.mcp))
    try:
        specs = runner.specs()
        assert "tally_write" in specs and "nothing_like_it" not in specs
        assert runner.in_order("tally_write") and not runner.in_order("tally_read")
        # the loop's bound on the call: the session's opening, the call, the backstop
        assert runner.timeout_s("tally_write") == 2 * 5 + 5
        call = _call("tally_write", "g1", unit="grant")
        assert runner.run(call, "acme") == ToolOutcome("success", {"recorded": 1, "entry": ""})
        refused = runner.run(_call("tally_write", "g2", unit="grant"), "other")
        assert refused == ToolOutcome(
            "error", "the tool 'tally_write' is not available to this unit"
        )
    finally:
        runner.end_invocation()
        assert runner.mcp is not None
        runner.mcp.close()
    assert server.tally.report("b1/grant/")["calls"] == {"b1/grant/g1": 1}
    assert META_IDEMPOTENCY_KEY == "swarm/idempotency_key"
