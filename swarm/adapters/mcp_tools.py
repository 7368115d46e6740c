"""Tools on MCP servers (docs/agents.md, "MCP tools"): the worker's client.

A registry entry of kind ``mcp`` (cdk.json ``tools.<name>.mcp``) names a server reached over
Streamable HTTP with the ``mcp`` package. This module is the worker's side:

- **stateless, one session per invocation per server**: the first call (or listing) of a
  server in an invocation opens a session, the invocation's later calls reuse it, and
  :meth:`McpServers.end_invocation` closes every session when the invocation ends. A session
  that failed to open is not tried again in that invocation: its calls are error results. A
  call that times out closes its session (the ``mcp`` package ends the connection): the
  invocation's next call of that server opens a new one;
- **specs listed at first use**: ``list_tools`` when a unit first names one of a server's tools,
  kept in the process (a warm worker) for :data:`SPECS_TTL_S`; a listing that fails keeps the
  last one it had, if any;
- **the idempotency key** ``<batch>/<unit>/<toolUseId>`` goes in the call's ``_meta`` under
  :data:`META_IDEMPOTENCY_KEY`, with the tenant, batch and unit under ``swarm/tenant``,
  ``swarm/batch`` and ``swarm/unit``;
- **every failure is an error result the model can act on**: a server down or refusing, a call
  answered ``isError``, a call slower than the entry's timeout. Nothing raises out of
  :meth:`McpServers.run`;
- **the auth header** comes from Secrets Manager (``auth_secret``): the secret's string is one
  header line ``Name: value`` (``Authorization: Bearer ...``) or a JSON object of headers,
  read when the invocation opens its session.

The ``mcp`` package is async (anyio); the worker is threaded. One event loop per process runs
in a thread of its own (an anyio blocking portal, started at the first use), and the worker's
tool threads submit their calls to it.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from swarm.core.agent import Tool, ToolCall, ToolOutcome
from swarm.core.ports import ToolsUnavailable
from swarm.core.tool_protocol import MAX_ERROR_CHARS

log = logging.getLogger(__name__)

#: the key of the call's ``_meta`` that carries the idempotency key ``<batch>/<unit>/<toolUseId>``
META_IDEMPOTENCY_KEY: Final = "swarm/idempotency_key"
META_TENANT: Final = "swarm/tenant"
META_BATCH: Final = "swarm/batch"
META_UNIT: Final = "swarm/unit"
#: the margin after a call's timeout at which the worker cancels it (its read timeout first)
BACKSTOP_S: Final = 5.0
#: how long a server's listed specs are kept in a warm worker (seconds)
SPECS_TTL_S: Final = 300.0


class ToolServerUnavailable(ToolsUnavailable):
    """A server whose tools a unit names could not be listed (and none was listed before)."""


@dataclass(frozen=True)
class McpServer:
    """One ``mcp`` entry of the registry, as the worker gets it (``TOOL_REGISTRY``'s ``mcp``)."""

    name: str  # the registry entry's name (a grant gives all its tools)
    url: str
    timeout_s: float
    #: the tools it exposes; None: every tool ``list_tools`` returns
    tools: tuple[str, ...] | None = None
    #: a Secrets Manager secret (name or ARN) whose value is the auth header
    secret: str | None = None
    #: read | write for all its tools; None: a tool annotated ``readOnlyHint`` is read, else write
    effect: str | None = None
    #: each call of its tools waits for a person's decision (cdk.json ``approval: required``)
    approval: bool = False

    @classmethod
    def parse(cls, name: str, doc: Mapping[str, Any]) -> McpServer:
        listed = doc.get("tools")
        return cls(
            name=name,
            url=str(doc["url"]),
            timeout_s=float(doc["timeout"]),
            tools=None if listed is None else tuple(str(t) for t in listed),
            secret=None if doc.get("secret") is None else str(doc["secret"]),
            effect=None if doc.get("effect") is None else str(doc["effect"]),
            approval=doc.get("approval") == "required",
        )


@dataclass(frozen=True)
class ListedTool:
    server: str
    tool: Tool
    effect: str


def auth_headers(secret_value: str) -> dict[str, str]:
    """The headers a secret's string gives: a JSON object of headers, or one ``Name: value``
    line; ValueError naming the format otherwise (never the value)."""
    text = secret_value.strip()
    if text.startswith("{"):
        try:
            doc = json.loads(text)
        except ValueError:
            doc = None
        if (
            isinstance(doc, dict)
            and doc
            and all(isinstance(k, str) and isinstance(v, str) for k, v in doc.items())
        ):
            return dict(doc)
        raise ValueError("a JSON secret must be an object of header names to texts")
    name, sep, value = text.partition(":")
    if not sep or not name.strip() or not value.strip() or "\n" in text or " " in name.strip():
        raise ValueError(
            "the secret must be one header line 'Name: value' (e.g. 'Authorization: Bearer ...') "
            "or a JSON object of headers"
        )
    return {name.strip(): value.strip()}


def secrets_reader() -> Callable[[str], str]:
    """``GetSecretValue`` with the worker's role (its policy names exactly the configured
    secrets)."""
    import boto3

    client = boto3.client("secretsmanager")

    def read(secret: str) -> str:
        return str(client.get_secret_value(SecretId=secret)["SecretString"])

    return read


def _effect_of(server: McpServer, annotations: Any) -> str:
    if server.effect is not None:
        return server.effect
    read_only = getattr(annotations, "read_only_hint", None) if annotations is not None else None
    return "read" if read_only is True else "write"


def outcome_of(name: str, result: Any) -> ToolOutcome:
    """A ``CallToolResult`` as the loop's outcome: its structured content, else its text (a
    JSON text parsed), other blocks named; ``isError`` an error result with its text."""
    texts: list[str] = []
    for block in getattr(result, "content", None) or []:
        text = getattr(block, "text", None)
        texts.append(text if isinstance(text, str) else f"[{getattr(block, 'type', 'block')}]")
    if getattr(result, "is_error", False):
        detail = " ".join(texts).strip() or "no detail"
        return ToolOutcome("error", f"the tool {name!r} failed: {detail}"[:MAX_ERROR_CHARS])
    structured = getattr(result, "structured_content", None)
    if structured is not None:
        return ToolOutcome("success", structured)
    if len(texts) == 1:
        try:
            return ToolOutcome("success", json.loads(texts[0]))
        except ValueError:
            return ToolOutcome("success", texts[0])
    return ToolOutcome("success", texts)


class _Session:
    """One open session of a server: its client, entered in the portal's loop."""

    def __init__(self, portal: Any, server: McpServer, headers: Mapping[str, str]) -> None:
        import httpx2
        from mcp import Client
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import create_mcp_http_client

        self.portal = portal
        self.http = create_mcp_http_client(
            headers=dict(headers), timeout=httpx2.Timeout(server.timeout_s)
        )
        transport = streamable_http_client(server.url, http_client=self.http)
        client = Client(transport, cache=None, read_timeout_seconds=server.timeout_s)
        self._context = portal.wrap_async_context_manager(client)
        self.client = self._context.__enter__()

    def close(self) -> None:
        try:
            self._context.__exit__(None, None, None)
        except Exception:  # a broken session's close: nothing to keep
            log.debug("closing an MCP session failed", exc_info=True)
        try:
            self.portal.call(self.http.aclose)
        except Exception:
            log.debug("closing an MCP HTTP client failed", exc_info=True)


def _within(timeout_s: float, call: Callable[[], Any]) -> Callable[[], Any]:
    async def run() -> Any:
        import anyio

        with anyio.fail_after(timeout_s):
            return await call()

    return run


@dataclass
class McpServers:
    """The registry's MCP servers as the worker calls them (see the module's docstring)."""

    servers: Mapping[str, McpServer]
    read_secret: Callable[[str], str] | None = None
    clock: Callable[[], float] = time.monotonic
    _lock: threading.RLock = field(default_factory=threading.RLock)
    _portal_context: Any = None
    _portal: Any = None
    _sessions: dict[str, _Session] = field(default_factory=dict)
    _failed: dict[str, str] = field(default_factory=dict)  # this invocation's failed opens
    _listed: dict[str, tuple[float, dict[str, ListedTool]]] = field(default_factory=dict)
    #: sessions opened (a test's count: at most one per server per invocation)
    opened: int = 0

    # -- names and specs

    def declared(self) -> dict[str, str]:
        """The tools named in cdk.json (``tools`` lists), each to its server's name."""
        out: dict[str, str] = {}
        for server in sorted(self.servers.values(), key=lambda s: s.name):
            for name in server.tools or ():
                out.setdefault(name, server.name)
        return out

    def open_servers(self) -> list[McpServer]:
        """The servers exposing every tool they list (no ``tools`` in cdk.json)."""
        return sorted((s for s in self.servers.values() if s.tools is None), key=lambda s: s.name)

    def known(self) -> list[str]:
        """Every tool name known without a listing: the declared, and those already listed."""
        names = set(self.declared())
        for _, tools in self._listed.values():
            names |= set(tools)
        return sorted(names)

    def find(self, name: str) -> ListedTool | None:
        """The tool ``name`` with its spec (its server listed at first use); None when no server
        has it; ToolServerUnavailable when a server that may have it cannot be listed."""
        server = self.declared().get(name)
        candidates = [self.servers[server]] if server is not None else self.open_servers()
        for each in candidates:
            listed = self.listing(each).get(name)
            if listed is not None:
                return listed
        return None

    def listing(self, server: McpServer) -> dict[str, ListedTool]:
        """``server``'s tools (those cdk.json lists, or all), listed once a :data:`SPECS_TTL_S`."""
        with self._lock:
            cached = self._listed.get(server.name)
            if cached is not None and self.clock() - cached[0] < SPECS_TTL_S:
                return cached[1]
        try:
            session = self._session(server)
            result = session.portal.call(_within(server.timeout_s, session.client.list_tools))
            tools: dict[str, ListedTool] = {}
            for tool in result.tools:
                if server.tools is not None and tool.name not in server.tools:
                    continue
                description = (tool.description or "").strip() or (
                    f"the tool {tool.name} of the MCP server {server.name}"
                )
                schema = dict(tool.input_schema or {"type": "object"})
                spec = Tool(tool.name, description[:4000], schema, approval=server.approval)
                tools[tool.name] = ListedTool(
                    server.name, spec, _effect_of(server, tool.annotations)
                )
        except Exception as error:
            if _timed_out(error) or _closed(error):
                self._drop(server.name, self._sessions.get(server.name))
            if cached is not None:  # a stale listing beats none
                log.warning(
                    "listing MCP server %s failed, keeping the last: %r", server.name, error
                )
                return cached[1]
            raise ToolServerUnavailable(
                f"the MCP server {server.name!r} could not list its tools ({_why(error)})"
            ) from None
        with self._lock:
            self._listed[server.name] = (self.clock(), tools)
        return tools

    # -- calls

    def run(self, call: ToolCall, tenant: str, batch: str, unit: str) -> ToolOutcome:
        """Run ``call`` on its server, its key in ``_meta``; every failure an error result."""
        try:
            found = self.find(call.name)
        except ToolServerUnavailable as error:
            return ToolOutcome("error", f"{error}; try again in a later turn, or go on without it")
        if found is None:
            return ToolOutcome("error", f"there is no tool named {call.name!r}")
        server = self.servers[found.server]
        arguments = call.input if isinstance(call.input, dict) else {}
        meta = {
            META_IDEMPOTENCY_KEY: call.key,
            META_TENANT: tenant,
            META_BATCH: batch,
            META_UNIT: unit,
        }
        try:
            session = self._session(server)
        except Exception as error:
            return ToolOutcome(
                "error",
                f"the tool {call.name!r} could not be reached ({_why(error)}); try again in a "
                "later turn, or go on without it",
            )
        client = session.client
        try:
            # the request's own read timeout ends the call and keeps the session; the outer bound
            # (a margin later) is a backstop that cancels it
            result = session.portal.call(
                _within(
                    server.timeout_s + BACKSTOP_S,
                    lambda: client.call_tool(
                        call.name, arguments, read_timeout_seconds=server.timeout_s, meta=meta
                    ),
                )
            )
        except Exception as error:
            if _timed_out(error) or _closed(error):
                # the mcp package closes the session's connection after a request's timeout:
                # the invocation's next call opens a new one
                self._drop(server.name, session)
            if not _timed_out(error):
                return ToolOutcome(
                    "error",
                    f"the tool {call.name!r} failed ({_why(error)}); try again in a later turn, "
                    "or go on without it",
                )
            return ToolOutcome(
                "error",
                f"the tool {call.name!r} did not answer within {server.timeout_s:g} s; try again "
                "with a smaller input, or go on without it",
            )
        return outcome_of(call.name, result)

    # -- sessions

    def _session(self, server: McpServer) -> _Session:
        with self._lock:
            session = self._sessions.get(server.name)
            if session is not None:
                return session
            if server.name in self._failed:
                raise ConnectionError(self._failed[server.name])
            try:
                headers: dict[str, str] = {}
                if server.secret is not None:
                    if self.read_secret is None:
                        self.read_secret = secrets_reader()
                    try:
                        headers = auth_headers(self.read_secret(server.secret))
                    except ValueError as error:
                        raise ConnectionError(f"its auth secret: {error}") from None
                session = _Session(self._portal_now(), server, headers)
            except Exception as error:
                self._failed[server.name] = _why(error)
                raise
            self.opened += 1
            self._sessions[server.name] = session
            return session

    def _drop(self, name: str, session: _Session | None) -> None:
        with self._lock:
            if session is None or self._sessions.get(name) is not session:
                return
            del self._sessions[name]
        session.close()

    def _portal_now(self) -> Any:
        if self._portal is None:
            from anyio.from_thread import start_blocking_portal

            self._portal_context = start_blocking_portal()
            self._portal = self._portal_context.__enter__()
        return self._portal

    def end_invocation(self) -> None:
        """Close the invocation's sessions (the next invocation opens its own)."""
        with self._lock:
            sessions = list(self._sessions.values())
            self._sessions.clear()
            self._failed.clear()
        for session in sessions:
            session.close()

    def close(self) -> None:
        """The sessions and the event loop's thread (a process's end; tests)."""
        self.end_invocation()
        with self._lock:
            if self._portal_context is not None:
                self._portal_context.__exit__(None, None, None)
            self._portal_context = self._portal = None


def _timed_out(error: BaseException) -> bool:
    """A timeout: anyio's backstop, httpx's, or the session's read timeout (an MCP error whose
    code is REQUEST_TIMEOUT, -32001, or whose message says it timed out)."""
    inner: BaseException = error
    while isinstance(inner, BaseExceptionGroup) and inner.exceptions:
        inner = inner.exceptions[0]
    if isinstance(inner, TimeoutError) or "Timeout" in type(inner).__name__:
        return True
    code = getattr(getattr(inner, "error", None), "code", None)
    return code == -32001 or "timed out" in str(inner).lower()


def _closed(error: BaseException) -> bool:
    return "connection closed" in str(error).lower()


def _why(error: BaseException) -> str:
    """A short reason, for the model and the log (no header, no secret)."""
    inner: BaseException = error
    while isinstance(inner, BaseExceptionGroup) and inner.exceptions:
        inner = inner.exceptions[0]
    text = str(inner).strip().splitlines()[0][:200] if str(inner).strip() else ""
    return f"{type(inner).__name__}: {text}" if text else type(inner).__name__


def servers_from(doc: Mapping[str, Any]) -> dict[str, McpServer]:
    """The registry JSON's ``mcp`` section: entry name -> :class:`McpServer`."""
    return {str(name): McpServer.parse(str(name), entry) for name, entry in doc.items()}
