"""The tool registry at run time, the tools' Lambda protocol, and the executor that calls them.

The stack resolves cdk.json's ``tools`` at synth (infra/config.py, ``ToolsConfig``) and gives it
to the functions as compact JSON (:data:`swarm.contract.TOOL_REGISTRY`, the worker's: every
tool's function, timeout, effect and Converse spec; :data:`swarm.contract.TOOL_GRANTS`, the
API's: the names and the tenants' grants only, to check a unit's ``tools`` without the specs).
A tool of a source (``functions/tools/<source>.py``) is given by its source and what cdk.json
changes: its spec is read here from what the source declares, in the functions' asset
(:func:`source_declarations`, swarm.core.tool_declarations), which Lambda's 4 KB of variables
need not hold. A *toolset* (one entry for every tool a source declares, e.g. BFCL's 128
functions) is given by its source alone; a tenant granted the toolset's name gets every tool of
it.

The protocol of a tool function (functions/tools/, or any function a ``function_arn`` names):

- event ``{"tool": name, "input": {...}, "idempotency_key": "<batch>/<unit>/<toolUseId>",
  "tenant": t, "batch": b, "unit": u}``;
- response ``{"status": "success" | "error", "content": <JSON value or text>}``: a bad input is
  an ``error`` result whose content tells the model what to send instead, never an exception.

:class:`LambdaToolExecutor` invokes a tool's function synchronously with the tool's timeout and
turns every failure of the tool (its error, its timeout, a throttle, a malformed answer) into a
:class:`~swarm.core.agent.ToolOutcome` with status ``error``; it never raises for them.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Final

from swarm.adapters.client_errors import client_error_type, error_code
from swarm.adapters.mcp_tools import (
    BACKSTOP_S,
    McpServer,
    McpServers,
    ToolServerUnavailable,
    servers_from,
)
from swarm.core.agent import Tool, ToolCall, ToolOutcome
from swarm.core.tool_declarations import SourceError, declared_tools
from swarm.core.tool_protocol import MAX_ERROR_CHARS

#: Converse's tool name pattern (a toolSpec's ``name``)
TOOL_NAME: Final = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


#: the functions' asset root (and this repository's): ``swarm/adapters/tools.py``'s grandparent
ASSET_ROOT: Final = Path(__file__).resolve().parents[2]

#: a source's declarations: tool name -> ``description``, ``input_schema``, ``effect``
Declarations = Callable[[str], Mapping[str, Mapping[str, Any]]]


class RegistryError(ValueError):
    """The registry's JSON is not what the stack writes (a deployment bug, found at cold start)."""


def _read_asset(relative: str) -> str | None:
    path = ASSET_ROOT / relative
    return path.read_text(encoding="utf-8") if path.is_file() else None


@cache
def source_declarations(source: str) -> Mapping[str, Mapping[str, Any]]:
    """What a tool source declares, from its files in the asset (read once per process)."""
    try:
        return declared_tools(source, _read_asset)
    except SourceError as error:
        raise RegistryError(f"the tool source {source!r} in the asset: {error}") from None


def _toolsets(doc: Mapping[str, Any], declarations: Declarations) -> dict[str, tuple[str, ...]]:
    """Each toolset's name -> its tools' names (``doc["toolsets"]``: name -> source, or name ->
    ``{"source": ...}``)."""
    out: dict[str, tuple[str, ...]] = {}
    for name, given in (doc.get("toolsets") or {}).items():
        source = given["source"] if isinstance(given, dict) else given
        out[str(name)] = tuple(sorted(declarations(str(source))))
    return out


@dataclass(frozen=True)
class RegisteredTool:
    """One tool of the registry: its spec, its function, its timeout and its effect."""

    name: str
    function_arn: str
    timeout_s: float
    effect: str  # read | write
    tool: Tool


class Granted(frozenset[str]):
    """A tenant's tools. With ``open`` (MCP servers whose tools are listed at first use, granted
    to the tenant), any other name Converse accepts is in it too: the API cannot list a private
    server, so the worker checks the name against the server's listing (docs/agents.md, "MCP
    tools")."""

    open: frozenset[str]
    #: every name the registry knows (its tools, the listed MCP tools): never an open server's
    registered: frozenset[str]

    def __new__(cls, names: Any = (), open: Any = (), registered: Any = ()) -> Granted:
        granted = super().__new__(cls, names)
        granted.open = frozenset(open)
        granted.registered = frozenset(registered)
        return granted

    def __contains__(self, name: object) -> bool:
        if super().__contains__(name):
            return True
        return (
            bool(self.open)
            and isinstance(name, str)
            and name not in self.registered  # a registered tool needs its own grant
            and TOOL_NAME.match(name) is not None
        )


class NamedTools(Mapping[str, Tool]):
    """The registry as the API sees it (names, no specs): with an open MCP server, any name
    Converse accepts (the worker checks it against the server's listing)."""

    def __init__(self, names: frozenset[str], open_servers: bool) -> None:
        self.names = names
        self.open_servers = open_servers

    def __getitem__(self, name: str) -> Tool:
        if name in self.names or (self.open_servers and TOOL_NAME.match(name) is not None):
            return named_tool(name)
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self.names))

    def __len__(self) -> int:
        return len(self.names)


@dataclass(frozen=True)
class ToolGrants:
    """Which tools each tenant may give its units: the defaults, and overrides per tenant.
    An MCP entry's name stays in a tenant's list beside its tools (the worker checks a call's
    server against it); ``open_servers``: the MCP entries without a ``tools`` list."""

    names: frozenset[str]
    defaults: tuple[str, ...] = ()
    overrides: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    open_servers: frozenset[str] = frozenset()

    def allowed(self, tenant: str) -> frozenset[str]:
        listed = self.overrides.get(tenant, self.defaults)
        return Granted(listed, self.open_servers & set(listed), self.names)

    def registry_view(self) -> Mapping[str, Tool]:
        """What the API checks a unit's ``tools`` against (:class:`NamedTools`)."""
        return NamedTools(self.names, bool(self.open_servers))

    @classmethod
    def parse(
        cls,
        doc: Mapping[str, Any],
        names: frozenset[str],
        toolsets: Mapping[str, tuple[str, ...]] | None = None,
    ) -> ToolGrants:
        """The grants of ``doc``, a toolset's name (``toolsets``: name -> its tools) replaced
        by its tools, an MCP entry's name (``doc["mcp"]``) kept beside its listed tools."""
        toolsets = toolsets or {}
        servers = {str(k): v for k, v in (doc.get("mcp") or {}).items()}

        def expanded(listed: Any) -> tuple[str, ...]:
            out: list[str] = []
            for name in listed or ():
                if name in servers:
                    out += [name, *(servers[name] or ())]
                else:
                    out += toolsets.get(name, (name,))
            return tuple(out)

        grants = doc.get("grants") or {}
        defaults = expanded(grants.get("defaults"))
        overrides = {t: expanded(v) for t, v in (grants.get("overrides") or {}).items()}
        for tenant, listed in [("defaults", defaults), *overrides.items()]:
            unknown = sorted(set(listed) - names - set(servers))
            if unknown:
                raise RegistryError(f"grants of {tenant} name unknown tools: {unknown}")
        open_servers = frozenset(name for name, tools in servers.items() if tools is None)
        return cls(names, defaults, overrides, open_servers)


@dataclass(frozen=True)
class ToolRegistry:
    """name -> :class:`RegisteredTool`, and the tenants' grants."""

    tools: Mapping[str, RegisteredTool]
    grants: ToolGrants
    #: the MCP servers (``tools.<name>.mcp``): their tools are listed at first use
    mcp: Mapping[str, McpServer] = field(default_factory=dict)

    def __contains__(self, name: object) -> bool:
        return name in self.tools

    def get(self, name: str) -> RegisteredTool | None:
        return self.tools.get(name)

    def allowed(self, tenant: str) -> frozenset[str]:
        """The tools ``tenant`` may give its units."""
        return self.grants.allowed(tenant)

    def specs(self) -> dict[str, Tool]:
        """Every tool's Converse spec by name (what :func:`swarm.core.agent.parse_agent_input`
        takes as the registry)."""
        return {name: entry.tool for name, entry in self.tools.items()}

    @classmethod
    def empty(cls) -> ToolRegistry:
        return cls({}, ToolGrants(frozenset()))

    @classmethod
    def from_json(
        cls, text: str | None, declarations: Declarations = source_declarations
    ) -> ToolRegistry:
        """The registry from :data:`swarm.contract.TOOL_REGISTRY` (empty or unset: no tools),
        each toolset's tools from its source's ``declarations``."""
        if not text:
            return cls.empty()
        try:
            doc = json.loads(text)
            functions = doc.get("functions") or {}
            tools: dict[str, RegisteredTool] = {}
            for name, entry in doc["tools"].items():
                source = entry.get("source")
                spec = {**declarations(str(source)).get(name, {}), **entry} if source else entry
                arn = functions[source] if source else entry["arn"]
                tools[name] = _registered(name, spec, arn, entry["timeout"])
            for toolset in (doc.get("toolsets") or {}).values():
                source = str(toolset["source"])
                for name, declared in declarations(source).items():
                    if name in tools:
                        raise RegistryError(f"the tool {name!r} is registered twice")
                    tools[name] = _registered(name, declared, functions[source], toolset["timeout"])
            toolsets = _toolsets(doc, declarations)
            servers = servers_from(doc.get("mcp") or {})
            names = frozenset(tools) | {n for s in servers.values() for n in s.tools or ()}
            grants_doc = {
                **doc,
                "mcp": {name: server.tools for name, server in servers.items()},
            }
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            if isinstance(error, RegistryError):
                raise
            raise RegistryError(f"the tool registry is not the stack's JSON: {error!r}") from None
        return cls(tools, ToolGrants.parse(grants_doc, names, toolsets), servers)


def _registered(name: str, spec: Mapping[str, Any], arn: Any, timeout: Any) -> RegisteredTool:
    return RegisteredTool(
        name=name,
        function_arn=str(arn),
        timeout_s=float(timeout),
        effect=str(spec["effect"]),
        # "approval": "required" (cdk.json): each call waits for a person's decision
        tool=Tool(
            name,
            str(spec["description"]),
            dict(spec["input_schema"]),
            approval=spec.get("approval") == "required",
        ),
    )


def named_tool(name: str) -> Tool:
    """A registered tool known by its name alone (the API's view: the grants carry no specs)."""
    return Tool(name, "a tool of this deployment's registry", {"type": "object"})


@dataclass
class RegistryTools:
    """The registry's tools as the worker runs them (:class:`swarm.core.ports.ToolRunner`):
    their specs, timeouts, and calls through :class:`LambdaToolExecutor`. Calls of ``write``
    tools run one after another in the model's order (they may share state: a note written,
    then read); ``read`` tools in parallel."""

    registry: ToolRegistry
    executor: LambdaToolExecutor
    #: the MCP servers' client (None: the registry has none)
    mcp: McpServers | None = None

    def specs(self) -> Mapping[str, Tool]:
        """The registry's specs, and the MCP servers' tools: a server is listed when a name
        is first looked up (ToolServerUnavailable when it cannot be)."""
        return _Specs(self.registry.specs(), self.mcp)

    def timeout_s(self, name: str) -> float:
        entry = self.registry.get(name)
        if entry is not None:
            return entry.timeout_s
        found = self._mcp_tool(name)
        if self.mcp is None or found is None:
            return 0.0
        # opening the invocation's session (and listing) within the timeout, then the call
        # within it, then the backstop (swarm.adapters.mcp_tools)
        return 2 * self.mcp.servers[found.server].timeout_s + BACKSTOP_S

    def in_order(self, name: str) -> bool:
        entry = self.registry.get(name)
        if entry is not None:
            return entry.effect == "write"
        found = self._mcp_tool(name)
        return found is not None and found.effect == "write"

    def run(self, call: ToolCall, tenant: str) -> ToolOutcome:
        batch, unit, _ = call.key.split("/", 2)  # the key: batch/unit/toolUseId
        if call.name in self.registry or self.mcp is None:
            return self.executor.run(call, tenant, batch, unit)
        found = self._mcp_tool(call.name)
        if found is None:
            return ToolOutcome("error", f"there is no tool named {call.name!r}")
        # the tenant must be granted the tool's server (its entry's name)
        if found.server not in frozenset(self.registry.allowed(tenant)):
            return ToolOutcome("error", f"the tool {call.name!r} is not available to this unit")
        return self.mcp.run(call, tenant, batch, unit)

    def end_invocation(self) -> None:
        """Close the invocation's MCP sessions (functions/worker.py, at the invocation's end)."""
        if self.mcp is not None:
            self.mcp.end_invocation()

    def _mcp_tool(self, name: str) -> Any:
        if self.mcp is None:
            return None
        try:
            return self.mcp.find(name)
        except ToolServerUnavailable:
            return None


class _Specs(Mapping[str, Tool]):
    """The registry's specs, then the MCP servers' tools (listed at a lookup of their names)."""

    def __init__(self, specs: Mapping[str, Tool], mcp: McpServers | None) -> None:
        self.specs = specs
        self.mcp = mcp

    def __getitem__(self, name: str) -> Tool:
        if name in self.specs:
            return self.specs[name]
        found = self.mcp.find(name) if self.mcp is not None else None
        if found is None:
            raise KeyError(name)
        return found.tool

    def __iter__(self) -> Iterator[str]:
        names = set(self.specs) | set(self.mcp.known() if self.mcp is not None else ())
        return iter(sorted(names))

    def __len__(self) -> int:
        return sum(1 for _ in self)


def grants_from_json(
    text: str | None, declarations: Declarations = source_declarations
) -> ToolGrants:
    """The API's view (:data:`swarm.contract.TOOL_GRANTS`): the names and the grants, each
    toolset's names from its source's ``declarations``."""
    if not text:
        return ToolGrants(frozenset())
    try:
        doc = json.loads(text)
        toolsets = _toolsets(doc, declarations)
        names = frozenset(str(name) for name in doc["tools"])
        names |= {name for members in toolsets.values() for name in members}
        names |= {str(n) for listed in (doc.get("mcp") or {}).values() for n in listed or ()}
    except (ValueError, KeyError, TypeError) as error:
        if isinstance(error, RegistryError):
            raise
        raise RegistryError(f"the tool grants are not the stack's JSON: {error!r}") from None
    return ToolGrants.parse(doc, names, toolsets)


# --- the worker's side ---------------------------------------------------------------------
ClientForTimeout = Callable[[float], Any]


def lambda_client_for(timeout_s: float) -> Any:
    """A Lambda client whose read timeout is ``timeout_s`` plus a margin for the invoke's own
    overhead, and no SDK retries (a retry would run a tool again after its timeout)."""
    import boto3
    from botocore.config import Config

    return boto3.client(
        "lambda",
        config=Config(
            read_timeout=timeout_s + 5,
            connect_timeout=5,
            retries={"max_attempts": 1, "mode": "standard"},
        ),
    )


@dataclass
class LambdaToolExecutor:
    """Runs a :class:`ToolCall` on its tool's function (Invoke, RequestResponse).

    ``clients(timeout_s)`` gives a Lambda client whose read timeout fits the tool's; one per
    timeout is kept. The call's ``key`` is passed as the event's ``idempotency_key``: a write
    tool answers a repeated key with its first outcome (its contract, docs/agents.md, "Tools").
    """

    registry: ToolRegistry
    clients: ClientForTimeout = lambda_client_for
    clock: Callable[[], float] = time.monotonic
    _cache: dict[float, Any] = field(default_factory=dict)

    def client(self, timeout_s: float) -> Any:
        if timeout_s not in self._cache:
            self._cache[timeout_s] = self.clients(timeout_s)
        return self._cache[timeout_s]

    def run(self, call: ToolCall, tenant: str, batch: str, unit: str) -> ToolOutcome:
        entry = self.registry.get(call.name)
        if entry is None:
            return ToolOutcome("error", f"there is no tool named {call.name!r}")
        if call.name not in self.registry.allowed(tenant):
            return ToolOutcome("error", f"the tool {call.name!r} is not available to this unit")
        event = {
            "tool": call.name,
            "input": call.input,
            "idempotency_key": call.key,
            "tenant": tenant,
            "batch": batch,
            "unit": unit,
        }
        started = self.clock()
        try:
            answer = self.client(entry.timeout_s).invoke(
                FunctionName=entry.function_arn,
                InvocationType="RequestResponse",
                Payload=json.dumps(event, separators=(",", ":")).encode(),
            )
            payload = answer["Payload"].read()
        except client_error_type() as failure:
            return ToolOutcome("error", _client_failure(call.name, error_code(failure)))
        except Exception as failure:  # botocore's timeouts and connection errors
            if _is_timeout(failure) or self.clock() - started >= entry.timeout_s:
                return ToolOutcome(
                    "error",
                    f"the tool {call.name!r} did not answer within {entry.timeout_s:g} s; "
                    "try again with a smaller input, or go on without it",
                )
            return ToolOutcome(
                "error", f"the tool {call.name!r} could not be reached ({type(failure).__name__})"
            )
        if answer.get("FunctionError"):
            return ToolOutcome("error", _function_error(call.name, payload))
        return _outcome(call.name, payload)

    def __call__(self, call: ToolCall, tenant: str, batch: str, unit: str) -> ToolOutcome:
        return self.run(call, tenant, batch, unit)

    def bound(self, tenant: str, batch: str, unit: str) -> Callable[[ToolCall], ToolOutcome]:
        """The unit's :class:`~swarm.core.agent_driver.ToolExecutor` (what the loop's driver
        calls with a :class:`ToolCall` alone)."""
        return lambda call: self.run(call, tenant, batch, unit)


def _is_timeout(failure: BaseException) -> bool:
    try:
        from botocore.exceptions import ConnectTimeoutError, ReadTimeoutError
    except ImportError:  # pragma: no cover - botocore ships with boto3
        return False
    return isinstance(failure, ReadTimeoutError | ConnectTimeoutError)


def _client_failure(name: str, code: str | None) -> str:
    if code in ("TooManyRequestsException", "ThrottlingException", "EC2ThrottledException"):
        return f"the tool {name!r} is busy (throttled); try again in a later turn"
    if code in ("ResourceNotFoundException", "AccessDeniedException"):
        return f"the tool {name!r} is not available ({code}); go on without it"
    return f"the tool {name!r} failed ({code or 'unknown error'}); go on without it"


def _function_error(name: str, payload: bytes) -> str:
    try:
        doc = json.loads(payload)
        detail = str(doc.get("errorMessage") or doc.get("errorType") or "")
    except (ValueError, AttributeError):
        detail = ""
    if "Task timed out" in detail:
        return f"the tool {name!r} timed out; try again with a smaller input, or go on without it"
    return f"the tool {name!r} failed" + (f": {detail[:200]}" if detail else "")


def _outcome(name: str, payload: bytes) -> ToolOutcome:
    try:
        doc = json.loads(payload)
    except ValueError:
        return ToolOutcome("error", f"the tool {name!r} gave an answer that is not JSON")
    if (
        not isinstance(doc, dict)
        or doc.get("status") not in ("success", "error")
        or "content" not in doc
    ):
        return ToolOutcome("error", f"the tool {name!r} gave an answer without status and content")
    content = doc["content"]
    if doc["status"] == "error":
        text = content if isinstance(content, str) else json.dumps(content)
        return ToolOutcome("error", text[:MAX_ERROR_CHARS])
    return ToolOutcome("success", content)
