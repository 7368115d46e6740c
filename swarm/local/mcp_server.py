"""A real MCP server for the local stack and the tests (docs/agents.md, "MCP tools").

The ``mcp`` package's ``MCPServer`` over Streamable HTTP, stateless (``stateless_http=True``),
served by uvicorn in a daemon thread on a localhost port. Its tools:

- ``tally_write`` (write): records an effect once per idempotency key (the call's
  ``_meta["swarm/idempotency_key"]``): a second call with the same key answers the first
  call's result and has no second effect. The key's check and the effect are one step under a
  lock (one process);
- ``tally_read`` (read, ``readOnlyHint``): the effects recorded for the calling unit;
- ``slow`` (read): sleeps ``seconds`` (a server slower than the worker's timeout);
- ``fail`` (read): answers ``isError`` with a message.

With a ``token``, every request must carry ``Authorization: Bearer <token>`` (else 401): the
local stack keeps the header in a Secrets Manager secret the worker reads. :meth:`report` gives
the counts a test asserts on: effects and calls per key.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any, Final

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

#: the meta key the worker puts the idempotency key under (swarm.adapters.mcp_tools)
KEY: Final = "swarm/idempotency_key"

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


@dataclass
class Tally:
    """The write tool's effects: one per idempotency key, and every call counted."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    effects: Counter[str] = field(default_factory=Counter)  # key -> effects (1 at most)
    calls: Counter[str] = field(default_factory=Counter)  # key -> calls (retries included)
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    tenants: dict[str, str] = field(default_factory=dict)
    headers: list[str | None] = field(default_factory=list)  # each call's Authorization

    def write(self, key: str, tenant: str, entry: str) -> dict[str, Any]:
        with self.lock:
            self.calls[key] += 1
            if key in self.results:  # the first outcome, no second effect
                return self.results[key]
            self.effects[key] += 1
            unit = key.rsplit("/", 1)[0]
            recorded = sum(n for k, n in self.effects.items() if k.rsplit("/", 1)[0] == unit)
            result = {"recorded": recorded, "entry": entry}
            self.results[key] = result
            self.tenants[key] = tenant
            return result

    def of_unit(self, prefix: str) -> int:
        with self.lock:
            return sum(n for k, n in self.effects.items() if k.startswith(prefix + "/"))

    def report(self, prefix: str = "") -> dict[str, Any]:
        with self.lock:
            return {
                "effects": {k: n for k, n in self.effects.items() if k.startswith(prefix)},
                "calls": {k: n for k, n in self.calls.items() if k.startswith(prefix)},
                "tenants": {k: t for k, t in self.tenants.items() if k.startswith(prefix)},
                "results": {k: r for k, r in self.results.items() if k.startswith(prefix)},
            }


def build_server(tally: Tally) -> Any:
    """The MCPServer with the four tools over ``tally``."""
    server = MCPServer("swarm-local-tools")

    def meta_of(ctx: Context) -> dict[str, Any]:
        meta = ctx.request_context.meta
        return dict(meta) if isinstance(meta, dict) else {}

    def auth_of(ctx: Context) -> str | None:
        headers = ctx.headers or {}
        return headers.get("authorization")

    @server.tool(description="Record a finding once (idempotent by the call's key).")
    def tally_write(ctx: Context, entry: str = "") -> dict[str, Any]:
        meta = meta_of(ctx)
        key = meta.get(KEY)
        tally.headers.append(auth_of(ctx))
        if not isinstance(key, str) or not key:
            raise ValueError(f"the call carries no {KEY} in its _meta")
        return tally.write(key, str(meta.get("swarm/tenant", "")), entry)

    @server.tool(
        description="How many findings this unit recorded.",
        annotations=ToolAnnotations(read_only_hint=True),
    )
    def tally_read(ctx: Context) -> dict[str, Any]:
        meta = meta_of(ctx)
        unit = f"{meta.get('swarm/batch', '')}/{meta.get('swarm/unit', '')}"
        return {"recorded": tally.of_unit(unit)}

    @server.tool(
        description="Wait a number of seconds.", annotations=ToolAnnotations(read_only_hint=True)
    )
    async def slow(seconds: float = 1.0) -> str:
        import anyio

        await anyio.sleep(seconds)
        return f"waited {seconds} s"

    @server.tool(description="Always fails.", annotations=ToolAnnotations(read_only_hint=True))
    def fail(reason: str = "the tool refused") -> str:
        raise ToolError(reason)

    return server


def _guarded(app: Any, token: str | None) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        if token is not None and scope.get("type") == "http":
            headers = dict(scope.get("headers") or [])
            if headers.get(b"authorization") != f"Bearer {token}".encode():
                body = b'{"error": "unauthorized"}'
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [(b"content-type", b"application/json")],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await app(scope, receive, send)

    return guarded


@dataclass
class LocalMcpServer:
    """The server in a daemon thread: :meth:`start` gives its URL, :meth:`stop` ends it."""

    token: str | None = None
    tally: Tally = field(default_factory=Tally)
    url: str = ""

    def start(self, port: int = 0, host: str = "127.0.0.1") -> str:
        import uvicorn

        from swarm.local.server import free_port

        app = build_server(self.tally).streamable_http_app(stateless_http=True, json_response=True)
        port = port or free_port(host)
        config = uvicorn.Config(
            _guarded(app, self.token), host=host, port=port, log_level="warning", lifespan="on"
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="mcp-server", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the local MCP server did not start on {host}:{port}")
            time.sleep(0.02)
        self.url = f"http://{host}:{port}/mcp"
        return self.url

    def stop(self) -> None:
        server = getattr(self, "_server", None)
        if server is not None:
            server.should_exit = True
            self._thread.join(timeout=10)
