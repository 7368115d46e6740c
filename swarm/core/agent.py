"""An agent unit's loop as a pure, resumable state machine over its event log.

An agent unit is a conversation with tools: the model answers, asks for tool calls, reads their
results and answers again, turn after turn, until it ends its answer (and the unit's follow-up
user messages are all answered), or a limit stops it. Everything the loop knows lives in the
unit's *event log*, an append-only list of JSON events that is also its transcript:

* ``turn_started``: model turn ``turn`` is about to be called; ``drawn`` tokens were drawn for it
  (``input_estimate``, the conversation's input so far, plus ``output_bound``, its maxTokens);
* ``model_turn``: what the model answered (the assistant ``message``, ``stopReason``, ``usage``
  with input/output/cacheRead/cacheWrite tokens, ``latency_s``);
* ``tool_result``: one tool call's outcome (``toolUseId``, ``name``, ``input``, ``status``
  success|error, ``content``, ``latency_s``, the idempotency ``key``);
* ``turn_settled``: the turn's ``billed`` tokens, settled once (``lost``: the call's answer was
  never recorded, so it is billed at what was drawn for it, as a lost attempt is);
* ``stopped``: the unit's end (``reason`` completed | limit_turns | limit_tokens | failed, a
  ``detail``, the final ``answer``).

:func:`next_step` reads the log alone and says what to do next: call the model with this exact
Converse request (:class:`CallModel`), run these tool calls (:class:`RunTools`: only those without a
recorded result), settle turn n (:class:`SettleTurn`), stop (:class:`Stop`), or nothing
(:class:`Finished`). Any worker can continue a unit from its log after a crash; docs/agents.md
gives the at-most-once argument. Every request it builds keeps Converse's rules
(:func:`request_problem`).

:func:`parse_agent_input` reads and checks a unit's ``input`` when it carries ``tools``,
``toolChoice``, ``limits`` or ``followUps``, naming the field at fault.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

from swarm.core import prompts
from swarm.core.burndown import turn_draw
from swarm.core.errors import InvalidInput, SwarmError
from swarm.core.pricing import Usage

#: a tool's name and a toolUseId: Converse's pattern and length (1 to 64 characters)
NAME_PATTERN: Final = r"^[a-zA-Z0-9_-]{1,64}$"
_NAME = re.compile(NAME_PATTERN)
DEFAULT_MAX_TURNS: Final = 20
MAX_TURNS: Final = 100
#: a turn's output bound when the unit's inferenceConfig gives no maxTokens
DEFAULT_OUTPUT_BOUND: Final = 1024
#: the estimator's tokenizer: a token per this many bytes of the request's JSON (rounded up);
#: the simulated model's rate. The model's reported usage is what is billed; the estimate only
#: sizes a turn's draw, and after the first answered turn only the text added since is estimated
BYTES_PER_TOKEN: Final = 4
#: the fields an agent unit's input may hold besides a Converse request's
AGENT_FIELDS: Final = ("tools", "toolChoice", "limits", "followUps")
LIMITS: Final = ("max_turns", "approve_tools")
TOOL_CHOICES: Final = ("auto", "any")
#: the kinds of Converse's toolChoice, as :func:`model_tool_choices` names them
CHOICE_KINDS: Final = ("auto", "any", "tool")
#: the model's stop reasons that end its answer, and those that fail the unit (not retried)
ANSWERED: Final = ("end_turn", "stop_sequence")
REFUSED: Final = ("guardrail_intervened", "content_filtered")
STOP_REASONS: Final = ("completed", "limit_turns", "limit_tokens", "failed")
EVENT_TYPES: Final = (
    "turn_started",
    "model_turn",
    "approval_requested",
    "approval_decided",
    "tool_result",
    "turn_settled",
    "stopped",
)
#: a person's decisions on a gated tool call (docs/agents.md, "Human gates")
DECISIONS: Final = ("approve", "reject")
#: a toolResult's content when a tool gave none: Converse refuses an empty one
EMPTY_RESULT: Final = "(the tool returned nothing)"
EMPTY_ERROR: Final = "(the tool failed without a message)"

Event = dict[str, Any]


class CorruptLog(SwarmError):
    """A unit's event log that no run of the loop writes (an event out of order, a duplicate, a
    result for a call never asked): the loop refuses to go on from it."""

    def __init__(self, seq: int, message: str) -> None:
        super().__init__(f"event {seq} of the unit's log: {message}")
        self.seq = seq


class RequestBreaksConverse(SwarmError):
    """A request the loop built would break one of Converse's rules (a bug, never sent)."""


# ------------------------------------------------------------------ the unit contract


@dataclass(frozen=True)
class Tool:
    """A tool the model may call: Converse's toolSpec."""

    name: str
    description: str
    input_schema: dict[str, Any]
    #: each call waits for a person's decision before it runs (the registry's ``approval:
    #: "required"``); not part of what the model reads
    approval: bool = False

    def tool_spec(self) -> dict[str, Any]:
        return {
            "toolSpec": {
                "name": self.name,
                "description": self.description,
                "inputSchema": {"json": self.input_schema},
            }
        }


def check_tool(tool: Tool, field: str) -> Tool:
    """``tool`` if Converse accepts it as a toolSpec, else InvalidInput naming ``field``."""
    if not _NAME.match(tool.name):
        raise InvalidInput(
            f"{field}.name", f"{tool.name!r} must be 1 to 64 letters, digits, '_' or '-'"
        )
    if not tool.description.strip():
        raise InvalidInput(f"{field}.description", "must not be empty")
    if not isinstance(tool.input_schema, dict) or tool.input_schema.get("type") != "object":
        raise InvalidInput(f"{field}.input_schema", 'must be a JSON Schema of "type": "object"')
    return tool


@dataclass(frozen=True)
class AgentSpec:
    """One agent unit: its conversation's start, its tools, its limits, its cap."""

    batch: str
    unit: str
    #: the Converse request the loop starts from, in normal form (swarm.core.prompts)
    request: dict[str, Any]
    #: the unit's hard cap: its whole loop's billed tokens stay within it
    projected_tokens: int
    tools: tuple[Tool, ...] = ()
    #: "auto", "any", or {"tool": name}: Converse's toolChoice until the model has called a tool
    #: since the last user message, then "auto" (a forced choice on every turn never ends)
    tool_choice: str | dict[str, str] = "auto"
    #: later user messages (content blocks), each sent once the model answered the one before
    follow_ups: tuple[tuple[dict[str, Any], ...], ...] = ()
    max_turns: int = DEFAULT_MAX_TURNS
    #: the unit's tools whose calls wait for a person's decision (``limits.approve_tools``),
    #: beside those the registry gates (``Tool.approval``)
    approve_tools: frozenset[str] = frozenset()
    #: the largest draw the fleet's governor can grant at once on the unit's lane (None: no
    #: bound): a turn whose draw is larger stops the unit ``limit_tokens`` before it is called
    max_draw: int | None = None
    #: quota tokens one output token counts as (the governor's GovernorConfig.output_burndown):
    #: a turn draws ``input estimate + burndown x output bound`` from the governor
    output_burndown: float = 1.0

    def tool(self, name: str) -> Tool | None:
        return next((t for t in self.tools if t.name == name), None)

    def gated(self, name: str) -> bool:
        """Whether a call of the unit's tool ``name`` waits for a person's decision."""
        tool = self.tool(name)
        return tool is not None and (tool.approval or name in self.approve_tools)

    @property
    def output_bound(self) -> int:
        asked = self.request.get("inferenceConfig", {}).get("maxTokens")
        return int(asked) if asked is not None else DEFAULT_OUTPUT_BOUND


def first_draw(spec: AgentSpec) -> int:
    """What the unit's first model turn draws from the governor (quota tokens)."""
    step = next_step([], spec)
    return step.quota_draw if isinstance(step, CallModel) else spec.projected_tokens


def is_agent_input(value: Any) -> bool:
    """Whether a unit's input asks for an agent loop (it holds one of :data:`AGENT_FIELDS`)."""
    return isinstance(value, dict) and any(name in value for name in AGENT_FIELDS)


def model_tool_choices(model_id: str) -> tuple[str, ...]:
    """The kinds of ``toolChoice`` (of :data:`CHOICE_KINDS`) Bedrock's Converse takes with the
    model ``model_id`` (a foundation model's id, or a cross-region inference profile's:
    ``us.anthropic...``), keyed on its family:

    - Anthropic Claude 3 and later, and Amazon Nova: ``auto``, ``any`` and ``tool``. The Bedrock
      API Reference, ToolChoice: ``tool`` is "Only supported by Anthropic Claude 3 and Amazon
      Nova models"; the Amazon Nova User Guide, "Choosing a tool": "three supported parameter
      options for tool choice: tool, any, and auto".
    - Mistral AI Mistral Large: ``auto`` and ``any``. Earlier editions of the same ToolChoice
      page: "ToolChoice is only supported by Anthropic Claude 3 models and by Mistral AI Mistral
      Large" (and ``tool`` by Claude 3 only).
    - any other model: ``auto`` only (Converse's default). Others refuse a forced choice, e.g.
      Meta Llama: "This model doesn't support the toolConfig.toolChoice.any field" (a
      ValidationException, reported in strands-agents/harness-sdk #1241).

    A family Bedrock adds support for later is refused here until this list knows it: the
    refusal names the field and the model, never a surprise on the first model call."""
    parts = model_id.split(".")
    if len(parts) > 2:  # an inference profile: its region group, then the model's own id
        parts = parts[1:]
    provider, name = parts[0], ".".join(parts[1:])
    # Claude 2 and Claude Instant (claude-v2, claude-instant-v1) take no tools at all
    claude_3_on = name.startswith("claude-") and not name.startswith(("claude-v", "claude-instant"))
    if provider == "anthropic" and claude_3_on:
        return CHOICE_KINDS
    if provider == "amazon" and name.startswith("nova-"):
        return CHOICE_KINDS
    if provider == "mistral" and name.startswith("mistral-large"):
        return ("auto", "any")
    return ("auto",)


def check_tool_choice(choice: str | dict[str, str], model_id: str, field: str) -> None:
    """InvalidInput naming ``field`` when the model ``model_id`` does not take ``choice`` (a
    parsed toolChoice: ``"auto"``, ``"any"`` or ``{"tool": name}``), saying which it takes."""
    kind = "tool" if isinstance(choice, dict) else choice
    takes = model_tool_choices(model_id)
    if kind in takes:
        return
    forms = {"auto": '"auto"', "any": '"any"', "tool": '{"tool": name}'}
    given = forms[kind] if kind in forms else repr(kind)
    raise InvalidInput(
        field,
        f"{given} is not supported by this deployment's model ({model_id}): Bedrock's Converse "
        f"takes {' and '.join(forms[k] for k in takes)} from it; use "
        f"{'that' if len(takes) == 1 else 'one of those'}, or leave toolChoice out (the model "
        "then decides whether to call a tool)",
    )


def parse_agent_input(
    value: Any,
    *,
    batch: str,
    unit: str,
    projected_tokens: int,
    registry: Mapping[str, Tool],
    allowed: frozenset[str] | None = None,
    field: str = "input",
    cap_field: str = "projected_tokens",
    model_id: str | None = None,
) -> AgentSpec:
    """The unit's input as an :class:`AgentSpec`, or InvalidInput naming the field at fault.

    ``value``: a Converse request (``system``, ``messages``, ``inferenceConfig``; or a string)
    with any of ``tools`` (names in ``registry``; and in ``allowed``, the tenant's tools, when
    given), ``toolChoice`` (``"auto"`` | ``"any"`` | ``{"tool": name}``, a name of ``tools``),
    ``limits`` (``{"max_turns": 1..100}``, default 20) and ``followUps`` (later user messages:
    each a text or a list of text blocks). With ``model_id`` (the deployment's model), a
    ``toolChoice`` that model does not take is refused too (:func:`check_tool_choice`)."""
    if isinstance(value, str):
        value = {"messages": [{"role": "user", "content": [{"text": value}]}]}
    if not isinstance(value, dict):
        raise InvalidInput(field, prompts.NOT_A_PROMPT)
    request = {k: v for k, v in value.items() if k not in AGENT_FIELDS}
    prompts.check(request, field)
    tools = _parse_tools(value.get("tools"), registry, allowed, f"{field}.tools")
    names = [t.name for t in tools]
    tool_choice = _parse_tool_choice(value.get("toolChoice"), names, f"{field}.toolChoice")
    if model_id is not None and "toolChoice" in value:
        check_tool_choice(tool_choice, model_id, f"{field}.toolChoice")
    max_turns, approve_tools = _parse_limits(value.get("limits"), names, f"{field}.limits")
    follow_ups = _parse_follow_ups(value.get("followUps"), f"{field}.followUps")
    if not isinstance(projected_tokens, int) or projected_tokens < 1:
        raise InvalidInput(cap_field, "must be a positive integer: the loop's cap")
    spec = AgentSpec(
        batch=batch,
        unit=unit,
        request=prompts.normal_form(request),
        projected_tokens=projected_tokens,
        tools=tuple(tools),
        tool_choice=tool_choice,
        follow_ups=follow_ups,
        max_turns=max_turns,
        approve_tools=approve_tools,
    )
    first = next_step([], spec)
    if isinstance(first, Stop):  # the first turn cannot fit the cap: the unit could do nothing
        raise InvalidInput(
            cap_field,
            f"{first.detail}: raise projected_tokens, or lower inferenceConfig.maxTokens (the "
            "output bound of each turn)",
        )
    return spec


def _parse_tools(
    value: Any, registry: Mapping[str, Tool], allowed: frozenset[str] | None, field: str
) -> list[Tool]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
        raise InvalidInput(field, "must be a list of tool names")
    tools: list[Tool] = []
    for index, name in enumerate(value):
        if name not in registry:
            known = ", ".join(sorted(registry)) or "none are registered"
            raise InvalidInput(f"{field}[{index}]", f"{name!r} is not a tool; the tools: {known}")
        if allowed is not None and name not in allowed:
            raise InvalidInput(
                f"{field}[{index}]",
                f"the tenant may not use {name!r}; its tools: "
                f"{', '.join(sorted(allowed)) or 'none'} (ask the operator to grant it)",
            )
        if name in value[:index]:
            raise InvalidInput(f"{field}[{index}]", f"{name!r} is listed twice")
        tools.append(check_tool(registry[name], f"{field}[{index}]"))
    return tools


def _parse_tool_choice(value: Any, names: Sequence[str], field: str) -> str | dict[str, str]:
    if value is None:
        return "auto"
    if not names:
        raise InvalidInput(field, "needs tools: give input.tools, or leave toolChoice out")
    if value in TOOL_CHOICES:
        return str(value)
    if isinstance(value, dict) and value.keys() == {"tool"}:
        name = value["tool"]
        if name not in names:
            raise InvalidInput(
                f"{field}.tool", f"{name!r} is not one of the unit's tools ({', '.join(names)})"
            )
        return {"tool": name}
    raise InvalidInput(field, 'must be "auto", "any" or {"tool": "<one of the unit\'s tools>"}')


def _parse_limits(value: Any, names: Sequence[str], field: str) -> tuple[int, frozenset[str]]:
    if value is None:
        return DEFAULT_MAX_TURNS, frozenset()
    if not isinstance(value, dict):
        raise InvalidInput(field, f"must be an object with any of {', '.join(LIMITS)}")
    unknown = sorted(set(value) - set(LIMITS))
    if unknown:
        raise InvalidInput(f"{field}.{unknown[0]}", f"is not a limit; use {', '.join(LIMITS)}")
    turns = value.get("max_turns", DEFAULT_MAX_TURNS)
    if isinstance(turns, bool) or not isinstance(turns, int) or not 1 <= turns <= MAX_TURNS:
        raise InvalidInput(
            f"{field}.max_turns",
            f"must be an integer from 1 to {MAX_TURNS} (model turns; {DEFAULT_MAX_TURNS} if left "
            "out)",
        )
    gated = value.get("approve_tools", [])
    if not isinstance(gated, list) or not all(isinstance(name, str) for name in gated):
        raise InvalidInput(
            f"{field}.approve_tools",
            "must be a list of the unit's tool names whose calls wait for a person's approval",
        )
    for index, name in enumerate(gated):
        if name not in names:
            raise InvalidInput(
                f"{field}.approve_tools[{index}]",
                f"{name!r} is not one of the unit's tools ({', '.join(names) or 'none'}): list "
                "it in input.tools, or leave it out",
            )
        if name in gated[:index]:
            raise InvalidInput(f"{field}.approve_tools[{index}]", f"{name!r} is listed twice")
    return turns, frozenset(gated)


def _parse_follow_ups(value: Any, field: str) -> tuple[tuple[dict[str, Any], ...], ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise InvalidInput(field, "must be a list of user messages (texts or lists of text blocks)")
    out: list[tuple[dict[str, Any], ...]] = []
    for index, message in enumerate(value):
        blocks = [{"text": message}] if isinstance(message, str) else message
        # the rules of a user message's content: prompts' own
        prompts.check({"messages": [{"role": "user", "content": blocks}]}, f"{field}[{index}]")
        out.append(tuple({"text": block["text"]} for block in blocks))
    return tuple(out)


# ------------------------------------------------------------------ steps


@dataclass(frozen=True)
class CallModel:
    """Record ``turn_started`` (the draw), then call the model with ``request`` exactly."""

    turn: int
    request: dict[str, Any]
    input_estimate: int
    output_bound: int
    #: the model's output burndown (AgentSpec.output_burndown)
    output_burndown: float = 1.0

    @property
    def draw(self) -> int:
        """The turn's draw in billed tokens (what it may bill; a lost turn is settled at it)."""
        return self.input_estimate + self.output_bound

    @property
    def quota_draw(self) -> int:
        """The turn's draw from the governor, in quota tokens (its ``draw`` at burndown 1)."""
        return turn_draw(self.input_estimate, self.output_bound, self.output_burndown)


@dataclass(frozen=True)
class ToolCall:
    """One tool call to run (``refused``: the loop's own error result, the tool is not run)."""

    turn: int
    tool_use_id: str
    name: str
    input: Any
    #: the tool's idempotency key: f"{batch}/{unit}/{toolUseId}"
    key: str
    refused: str | None = None


@dataclass(frozen=True)
class ToolOutcome:
    """What one tool call gave: ``status`` success | error, and its value (or the error's
    message the model can act on)."""

    status: str
    value: Any


@dataclass(frozen=True)
class RunTools:
    """Run these calls of ``turn`` (those without a recorded result), recording each result."""

    turn: int
    calls: tuple[ToolCall, ...]


@dataclass(frozen=True)
class AskApproval:
    """Record ``approval_requested`` for these calls of ``turn`` (gated, not asked yet), then
    park the unit: nothing of the turn runs before every gated call of it is decided."""

    turn: int
    calls: tuple[ToolCall, ...]


@dataclass(frozen=True)
class AwaitApproval:
    """The turn's gated calls ``waiting`` (toolUseIds) are asked and not decided: the unit
    stays parked."""

    turn: int
    waiting: tuple[str, ...]


@dataclass(frozen=True)
class SettleTurn:
    """Settle turn ``turn`` once: ``billed`` tokens (``lost``: its answer was never recorded,
    billed at ``drawn``; ``refused``: the model plane refused the call for quota, billed 0 and
    not counted against ``max_turns``); then record ``turn_settled``."""

    turn: int
    billed: int
    drawn: int
    lost: bool
    refused: str = ""
    #: the usage the model reported for it, by kind (what it is priced by); None: none was
    #: recorded (a lost turn, priced at ``billed`` as output, the dearest kind)
    usage: Usage | None = None


@dataclass(frozen=True)
class Stop:
    """Record ``stopped``: the unit ends."""

    reason: str
    detail: str
    answer: str


@dataclass(frozen=True)
class Finished:
    """Nothing to do: the log already ends with ``stopped``."""

    reason: str
    detail: str
    answer: str


Step = CallModel | RunTools | AskApproval | AwaitApproval | SettleTurn | Stop | Finished


# ------------------------------------------------------------------ reading the log


@dataclass
class TurnState:
    """One model turn as the log tells it."""

    n: int
    drawn: int
    message: dict[str, Any] | None = None
    stop_reason: str = ""
    usage: dict[str, int] = field(default_factory=dict)
    results: dict[str, Event] = field(default_factory=dict)
    settled: Event | None = None
    #: the gated calls asked for a person's decision, and those decided, by toolUseId
    requested: dict[str, Event] = field(default_factory=dict)
    decisions: dict[str, Event] = field(default_factory=dict)
    #: why its toolUse blocks cannot be answered (a toolUseId off Converse's pattern, or one
    #: used before), or None
    tool_use_problem: str | None = None

    @property
    def tool_uses(self) -> list[dict[str, Any]]:
        if self.message is None:
            return []
        return [b["toolUse"] for b in self.message["content"] if "toolUse" in b]


@dataclass
class LogState:
    turns: list[TurnState]
    stopped: Event | None


def billed_of(usage: Mapping[str, int]) -> int:
    """A model turn's billed tokens: input, output, cache read and cache write."""
    return sum(int(usage.get(name, 0)) for name in USAGE_FIELDS)


USAGE_FIELDS: Final = (
    "inputTokens",
    "outputTokens",
    "cacheReadInputTokens",
    "cacheWriteInputTokens",
)


def read_log(log: Sequence[Event]) -> LogState:
    """The turns and the end the log records; CorruptLog if no run of the loop wrote it."""
    turns: list[TurnState] = []
    stopped: Event | None = None
    used: set[str] = set()  # the toolUseIds of the turns before
    for seq, event in enumerate(log):
        kind = event.get("type")
        if stopped is not None:
            raise CorruptLog(seq, f"a {kind} event after the unit stopped")
        current = turns[-1] if turns else None
        if kind == "turn_started":
            if current is not None and current.settled is None:
                raise CorruptLog(
                    seq, f"turn {event.get('turn')} started before turn {current.n} was settled"
                )
            if event.get("turn") != len(turns) + 1:
                raise CorruptLog(
                    seq, f"turn {event.get('turn')} started; expected {len(turns) + 1}"
                )
            turns.append(TurnState(n=event["turn"], drawn=int(event["drawn"])))
        elif kind == "model_turn":
            if current is None or current.n != event.get("turn") or current.message is not None:
                raise CorruptLog(seq, f"a model_turn for turn {event.get('turn')} that is not open")
            if current.settled is not None:
                raise CorruptLog(seq, f"a model_turn for turn {current.n}, already settled")
            current.message = event["message"]
            current.stop_reason = event["stopReason"]
            current.usage = dict(event["usage"])
            current.tool_use_problem = _tool_use_problem(current.tool_uses, used)
            used.update(str(u.get("toolUseId")) for u in current.tool_uses)
        elif kind in ("approval_requested", "approval_decided"):
            if current is None or current.n != event.get("turn") or current.settled is not None:
                raise CorruptLog(seq, f"an {kind} for turn {event.get('turn')} that is not open")
            ident = str(event.get("toolUseId"))
            if ident not in {use["toolUseId"] for use in current.tool_uses}:
                raise CorruptLog(
                    seq, f"an {kind} for {ident!r}, which turn {current.n} never asked for"
                )
            if ident in current.results:
                raise CorruptLog(seq, f"an {kind} for {ident!r}, whose result is recorded")
            if kind == "approval_requested":
                if ident in current.requested:
                    raise CorruptLog(seq, f"a second approval_requested for {ident!r}")
                current.requested[ident] = event
            else:
                if ident not in current.requested:
                    raise CorruptLog(seq, f"an approval_decided for {ident!r}, never requested")
                if ident in current.decisions:
                    raise CorruptLog(seq, f"a second approval_decided for {ident!r}")
                if event.get("decision") not in DECISIONS:
                    raise CorruptLog(seq, f"a decision {event.get('decision')!r}")
                current.decisions[ident] = event
        elif kind == "tool_result":
            if current is None or current.n != event.get("turn") or current.settled is not None:
                raise CorruptLog(
                    seq, f"a tool_result for turn {event.get('turn')} that is not open"
                )
            ident = event["toolUseId"]
            if ident not in {use["toolUseId"] for use in current.tool_uses}:
                raise CorruptLog(
                    seq, f"a tool_result for {ident!r}, which turn {current.n} never asked for"
                )
            if ident in current.results:
                raise CorruptLog(seq, f"a second tool_result for {ident!r}")
            current.results[ident] = event
        elif kind == "turn_settled":
            if current is None or current.n != event.get("turn") or current.settled is not None:
                raise CorruptLog(seq, f"turn {event.get('turn')} settled, but it is not open")
            if _runs_tools(current) and len(current.results) < len(current.tool_uses):
                raise CorruptLog(seq, f"turn {current.n} settled before its tool results")
            current.settled = event
        elif kind == "stopped":
            if current is not None and current.settled is None:
                raise CorruptLog(seq, f"stopped with turn {current.n} unsettled")
            stopped = event
        else:
            raise CorruptLog(seq, f"unknown event type {kind!r}")
    return LogState(turns, stopped)


def _runs_tools(turn: TurnState) -> bool:
    """Whether the turn's tool calls are to run: it asked for some, its answer was not refused
    (guardrail, content filter) or cut (max_tokens), and their results can be sent back."""
    return (
        bool(turn.tool_uses)
        and turn.stop_reason not in (*REFUSED, "max_tokens")
        and turn.tool_use_problem is None
    )


def _tool_use_problem(uses: Sequence[Mapping[str, Any]], used: set[str]) -> str | None:
    seen: set[str] = set()
    for use in uses:
        ident = use.get("toolUseId")
        if not isinstance(ident, str) or not _NAME.match(ident):
            return f"the model gave toolUseId {ident!r}, which breaks {NAME_PATTERN}"
        if ident in seen or ident in used:
            return f"the model gave toolUseId {ident!r} twice"
        seen.add(ident)
    return None


def turns_used(state: LogState) -> int:
    """The model turns that count against ``max_turns``: every turn started but those the model
    plane refused for quota."""
    return sum(1 for t in state.turns if not (t.settled and t.settled.get("refused")))


def spent(log: Sequence[Event]) -> int:
    """The tokens the log's settled turns billed."""
    return sum(int(e["billed"]) for e in log if e.get("type") == "turn_settled")


def final_answer(state: LogState) -> str:
    """The text of the last assistant message the model answered (ended), or ''."""
    for turn in reversed(state.turns):
        if turn.message is not None:
            return "".join(b.get("text", "") for b in turn.message["content"] if "text" in b)
    return ""


# ------------------------------------------------------------------ the conversation


def tool_result_block(event: Event) -> dict[str, Any]:
    return {
        "toolResult": {
            "toolUseId": event["toolUseId"],
            "content": event["content"],
            "status": event["status"],
        }
    }


def result_content(value: Any, status: str) -> list[dict[str, Any]]:
    """A tool's return value as a toolResult's content, never empty: an object as a json block,
    anything else as text (a string as itself, other values as their JSON, or as their Python
    text when JSON cannot hold them: NaN, infinity, objects)."""
    if isinstance(value, dict) and _json_safe(value):
        return [{"json": value}]
    if isinstance(value, str):
        text = value
    else:
        text = json.dumps(value) if _json_safe(value) else str(value)
    if not text.strip():
        text = EMPTY_ERROR if status == "error" else EMPTY_RESULT
    return [{"text": text}]


def _json_safe(value: Any) -> bool:
    """Whether ``value`` is JSON a durable store keeps as is (no NaN, no infinity, no object)."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True


@dataclass(frozen=True)
class _Conversation:
    messages: list[dict[str, Any]]
    #: the user messages answered so far: 0 is the request's own, i the follow-up i
    user_turn: int
    #: whether the model called a tool since the last user message
    tool_called: bool
    #: the messages after the last answered turn's, and that turn's (None: no turn answered)
    since_answered: list[dict[str, Any]]
    last_usage: dict[str, int] | None


def _sendable(message: dict[str, Any]) -> dict[str, Any]:
    """An assistant message as the history sends it back: without the whitespace-only text
    blocks a model may give (Converse refuses them in a request)."""
    content = [
        block
        for block in message["content"]
        if not ("text" in block and not str(block["text"]).strip())
    ]
    return {"role": message["role"], "content": content}


def _conversation(spec: AgentSpec, state: LogState) -> _Conversation:
    messages = [dict(m) for m in spec.request["messages"]]
    user_turn, tool_called = 0, False
    since: list[dict[str, Any]] = list(messages)
    last_usage: dict[str, int] | None = None
    for turn in state.turns:
        if turn.message is None:
            continue  # lost: its answer was never recorded, the conversation goes on without it
        messages.append(_sendable(turn.message))
        since, last_usage = [], turn.usage
        uses = turn.tool_uses
        if uses:
            results = [turn.results[u["toolUseId"]] for u in uses if u["toolUseId"] in turn.results]
            if len(results) == len(uses):
                added = {"role": "user", "content": [tool_result_block(r) for r in results]}
                messages.append(added)
                since.append(added)
            tool_called = True
        elif turn.stop_reason in ANSWERED and user_turn < len(spec.follow_ups):
            added = {"role": "user", "content": list(spec.follow_ups[user_turn])}
            messages.append(added)
            since.append(added)
            user_turn, tool_called = user_turn + 1, False
        elif turn.stop_reason in ANSWERED:
            user_turn += 1
    return _Conversation(messages, user_turn, tool_called, since, last_usage)


def estimate_tokens(value: Any) -> int:
    """A token estimate of a JSON value: :data:`BYTES_PER_TOKEN` bytes of its JSON a token."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
    return math.ceil(len(text.encode()) / BYTES_PER_TOKEN)


def build_request(
    spec: AgentSpec, messages: list[dict[str, Any]], tool_called: bool
) -> dict[str, Any]:
    """The Converse request for the next turn: the unit's system, the conversation, its tools
    (toolConfig on every turn: the unit declares its tools from the start, so the history never
    holds a tool block without them), its inference settings with maxTokens as the turn's
    output bound."""
    request: dict[str, Any] = {}
    if "system" in spec.request:
        request["system"] = spec.request["system"]
    request["messages"] = messages
    settings = dict(spec.request.get("inferenceConfig", {}))
    settings["maxTokens"] = spec.output_bound
    request["inferenceConfig"] = settings
    if spec.tools:
        choice: dict[str, Any]
        if isinstance(spec.tool_choice, dict) and not tool_called:
            choice = {"tool": {"name": spec.tool_choice["tool"]}}
        elif spec.tool_choice == "any" and not tool_called:
            choice = {"any": {}}
        else:
            choice = {"auto": {}}
        request["toolConfig"] = {
            "tools": [t.tool_spec() for t in spec.tools],
            "toolChoice": choice,
        }
    problem = request_problem(request)
    if problem is not None:
        raise RequestBreaksConverse(problem)
    return request


def request_problem(request: Mapping[str, Any]) -> str | None:
    """Why Converse would refuse this request, or None: roles alternate from a user message to
    a user message; every toolUse is answered by a toolResult in the next (user) message and
    every toolResult answers one; a toolResult's content is never empty; toolUseIds match
    Converse's pattern; toolConfig is there once the history holds a tool block; no empty
    message."""
    messages = request.get("messages") or []
    problem = prompts.turns_problem([m.get("role", "") for m in messages])
    if problem is not None:
        return f"messages {problem}"
    holds_tool_block = False
    asked: set[str] = set()
    for index, message in enumerate(messages):
        content = message.get("content") or []
        if not content:
            return f"messages[{index}] has no content"
        answered: set[str] = set()
        for block in content:
            if "toolUse" in block:
                holds_tool_block = True
                ident = block["toolUse"].get("toolUseId", "")
                if message["role"] != "assistant":
                    return f"messages[{index}]: a toolUse in a user message"
                if not _NAME.match(ident):
                    return f"messages[{index}]: toolUseId {ident!r} breaks {NAME_PATTERN}"
            elif "toolResult" in block:
                holds_tool_block = True
                result = block["toolResult"]
                ident = result.get("toolUseId", "")
                if message["role"] != "user" or ident not in asked:
                    return f"messages[{index}]: a toolResult for {ident!r}, which was not asked"
                if not result.get("content"):
                    return f"messages[{index}]: the toolResult for {ident!r} has empty content"
                answered.add(ident)
            elif "text" in block and not str(block["text"]).strip():
                return f"messages[{index}]: an empty text block"
        if message["role"] == "user":
            if asked - answered:
                return f"messages[{index}] does not answer toolUse {sorted(asked - answered)}"
            asked = set()
        else:
            asked = {b["toolUse"]["toolUseId"] for b in content if "toolUse" in b}
    if asked:
        return "the history ends in an unanswered toolUse"
    if holds_tool_block and "toolConfig" not in request:
        return "the history holds a tool block but the request has no toolConfig"
    return None


# ------------------------------------------------------------------ what next


def next_step(log: Sequence[Event], spec: AgentSpec) -> Step:
    """What to do next for the unit whose event log is ``log``: a function of the log alone."""
    state = read_log(log)
    if state.stopped is not None:
        s = state.stopped
        return Finished(s["reason"], s.get("detail", ""), s.get("answer", ""))
    turn = state.turns[-1] if state.turns else None
    if turn is not None and turn.settled is None:
        if turn.message is None:  # called, perhaps, and never recorded: lost at its draw
            return SettleTurn(turn.n, turn.drawn, turn.drawn, lost=True)
        pending = [u for u in turn.tool_uses if u["toolUseId"] not in turn.results]
        if pending and _runs_tools(turn):
            calls = [_tool_call(spec, turn.n, use) for use in pending]
            gated = [c for c in calls if c.refused is None and spec.gated(c.name)]
            undecided = [c for c in gated if c.tool_use_id not in turn.decisions]
            unasked = [c for c in undecided if c.tool_use_id not in turn.requested]
            if unasked:
                return AskApproval(turn.n, tuple(unasked))
            if undecided:
                return AwaitApproval(turn.n, tuple(c.tool_use_id for c in undecided))
            return RunTools(turn.n, tuple(_decided(c, turn.decisions) for c in calls))
        return SettleTurn(
            turn.n,
            billed_of(turn.usage),
            turn.drawn,
            lost=False,
            usage=Usage.of_converse(turn.usage),
        )
    answer = final_answer(state)
    if turn is not None and turn.message is not None:
        reason = turn.stop_reason
        if reason in REFUSED or reason == "max_tokens" or reason not in (*ANSWERED, "tool_use"):
            return Stop("failed", reason or "no stopReason", answer)
        if reason == "tool_use" and not turn.tool_uses:
            return Stop("failed", "stopReason tool_use without a toolUse block", answer)
        if turn.tool_use_problem is not None:
            return Stop("failed", turn.tool_use_problem, answer)
    talk = _conversation(spec, state)
    if talk.user_turn > len(spec.follow_ups):
        return Stop("completed", "", answer)
    if any(not m["content"] for m in talk.messages):
        return Stop("failed", "the model answered with an empty message", answer)
    if turns_used(state) >= spec.max_turns:
        return Stop("limit_turns", f"{spec.max_turns} model turns reached", answer)
    request = build_request(spec, talk.messages, talk.tool_called)
    if talk.last_usage is None:
        estimate = estimate_tokens({k: v for k, v in request.items() if k != "inferenceConfig"})
    else:  # what the model counted for the last answered turn, its answer, and what came since
        estimate = billed_of(talk.last_usage) + (
            estimate_tokens(talk.since_answered) if talk.since_answered else 0
        )
    left = spec.projected_tokens - spent(log)
    draw = estimate + spec.output_bound
    quota = turn_draw(estimate, spec.output_bound, spec.output_burndown)
    if spec.max_draw is not None and quota > spec.max_draw:
        burndown = "" if spec.output_burndown == 1 else f" x burndown {spec.output_burndown:g}"
        return Stop(
            "limit_tokens",
            f"turn {len(state.turns) + 1} needs {quota:,} tokens (input ~{estimate:,} + output "
            f"bound {spec.output_bound:,}{burndown}), more than the fleet's governor grants at "
            f"once on the unit's lane ({spec.max_draw:,})",
            answer,
        )
    if draw > left:
        return Stop(
            "limit_tokens",
            f"turn {len(state.turns) + 1} needs {draw:,} tokens (input ~{estimate:,} + output "
            f"bound {spec.output_bound:,}); the unit has {left:,} of its "
            f"{spec.projected_tokens:,} left",
            answer,
        )
    return CallModel(
        len(state.turns) + 1, request, estimate, spec.output_bound, spec.output_burndown
    )


def idempotency_key(spec: AgentSpec, tool_use_id: str) -> str:
    return f"{spec.batch}/{spec.unit}/{tool_use_id}"


def _tool_call(spec: AgentSpec, turn: int, use: Mapping[str, Any]) -> ToolCall:
    name, value = str(use.get("name", "")), use.get("input")
    refused = None
    if spec.tool(name) is None:
        known = ", ".join(t.name for t in spec.tools) or "none"
        refused = f"there is no tool {name!r}; the tools are: {known}"
    elif not isinstance(value, dict):
        refused = f"the input of {name!r} must be a JSON object"
    ident = str(use["toolUseId"])
    return ToolCall(turn, ident, name, value, idempotency_key(spec, ident), refused)


def _decided(call: ToolCall, decisions: Mapping[str, Event]) -> ToolCall:
    """``call`` as its decision leaves it: rejected, it gets the decision's error result
    without running (the model reads who rejected it and why)."""
    decision = decisions.get(call.tool_use_id)
    if decision is None or decision["decision"] == "approve":
        return call
    return replace(call, refused=rejection_text(decision))


def rejection_text(decision: Mapping[str, Any]) -> str:
    """The error a rejected call's toolResult carries: that a person rejected it, and why."""
    reason = str(decision.get("reason") or "").strip() or "no reason given"
    return f"a person rejected this call of {decision.get('name', 'the tool')}: {reason}"


# ------------------------------------------------------------------ events


def turn_started(step: CallModel, at: float) -> Event:
    return {
        "type": "turn_started",
        "turn": step.turn,
        "drawn": step.draw,
        "input_estimate": step.input_estimate,
        "output_bound": step.output_bound,
        "at": at,
    }


class BadModelResponse(SwarmError):
    """A model answer that is not a Converse response the loop can record."""


def model_turn(turn: int, response: Mapping[str, Any], latency_s: float, at: float) -> Event:
    """The event recording a Converse response (``output.message``, ``stopReason``, ``usage``)."""
    message = (response.get("output") or {}).get("message")
    if not isinstance(message, dict) or message.get("role") != "assistant":
        raise BadModelResponse("the response has no assistant message (output.message)")
    content = message.get("content")
    if not isinstance(content, list):
        raise BadModelResponse("the assistant message has no content list")
    for index, block in enumerate(content):
        if not isinstance(block, dict):
            raise BadModelResponse(f"content[{index}] is not a content block")
        use = block.get("toolUse")
        if use is not None and not (
            isinstance(use, dict) and isinstance(use.get("name"), str) and "toolUseId" in use
        ):
            raise BadModelResponse(f"content[{index}].toolUse has no name or toolUseId")
    usage = response.get("usage") or {}
    return {
        "type": "model_turn",
        "turn": turn,
        "message": {"role": "assistant", "content": list(content)},
        "stopReason": str(response.get("stopReason", "")),
        "usage": {name: int(usage.get(name, 0)) for name in USAGE_FIELDS},
        "latency_s": latency_s,
        "at": at,
    }


def tool_result(call: ToolCall, status: str, value: Any, latency_s: float, at: float) -> Event:
    if status not in ("success", "error"):
        raise ValueError(f"a tool result's status is success or error, not {status!r}")
    return {
        "type": "tool_result",
        "turn": call.turn,
        "toolUseId": call.tool_use_id,
        "name": call.name,
        "input": call.input,
        "key": call.key,
        "status": status,
        "content": result_content(value, status),
        "latency_s": latency_s,
        "at": at,
    }


def approval_requested(call: ToolCall, at: float) -> Event:
    """A gated call asked for a person's decision (the unit parks after it)."""
    return {
        "type": "approval_requested",
        "turn": call.turn,
        "toolUseId": call.tool_use_id,
        "name": call.name,
        "input": call.input,
        "at": at,
    }


def approval_decided(
    requested: Mapping[str, Any], decision: str, reason: str, by: str, at: float
) -> Event:
    """A person's (or the sweeper's timeout's) decision on the call ``requested`` asked for:
    who (a principal's ARN), when, why, and how long the call waited."""
    if decision not in DECISIONS:
        raise InvalidInput("decision", f"must be one of {', '.join(DECISIONS)}, not {decision!r}")
    return {
        "type": "approval_decided",
        "turn": requested["turn"],
        "toolUseId": requested["toolUseId"],
        "name": requested["name"],
        "decision": decision,
        "reason": reason,
        "by": by,
        "at": at,
        "waited_s": round(max(0.0, at - float(requested["at"])), 3),
    }


def waiting_approvals(log: Sequence[Event]) -> list[Event]:
    """The ``approval_requested`` events of the log's open turn with no decision yet."""
    state = read_log(log)
    if state.stopped is not None or not state.turns:
        return []
    turn = state.turns[-1]
    return [e for ident, e in turn.requested.items() if ident not in turn.decisions]


def turn_settled(step: SettleTurn, at: float) -> Event:
    return {
        "type": "turn_settled",
        "turn": step.turn,
        "billed": step.billed,
        "drawn": step.drawn,
        "lost": step.lost,
        **({"refused": step.refused} if step.refused else {}),
        "at": at,
    }


def throttled(turn: int, drawn: int) -> SettleTurn:
    """The settlement of a turn whose call the model plane refused for quota (nothing billed):
    the worker records it, then the unit waits (goes back to its lane) and calls again."""
    return SettleTurn(turn, 0, drawn, lost=False, refused="throttled")


def stopped(step: Stop, at: float) -> Event:
    if step.reason not in STOP_REASONS:
        raise ValueError(f"a unit stops {', '.join(STOP_REASONS)}, not {step.reason!r}")
    return {
        "type": "stopped",
        "reason": step.reason,
        "detail": step.detail,
        "answer": step.answer,
        "at": at,
    }


def summary(log: Sequence[Event]) -> dict[str, Any]:
    """A transcript's figures: turns, lost turns, tool calls (and errors), billed tokens by kind,
    the stop reason."""
    state = read_log(log)
    usage = {name: sum(t.usage.get(name, 0) for t in state.turns) for name in USAGE_FIELDS}
    results = [r for t in state.turns for r in t.results.values()]
    return {
        "turns": len(state.turns),
        "lost_turns": sum(1 for t in state.turns if t.settled and t.settled.get("lost")),
        "refused_turns": len(state.turns) - turns_used(state),
        "tool_calls": len(results),
        "tool_errors": sum(1 for r in results if r["status"] == "error"),
        "billed": spent(log),
        "usage": usage,
        "stop": None if state.stopped is None else state.stopped["reason"],
    }


def _approval_of(turn: TurnState, ident: str) -> dict[str, Any]:
    """A gated call's gate as its transcript shows it: the decision, who decided, when, why,
    and how long the call waited (from its request to the decision)."""
    decision = turn.decisions.get(ident)
    if decision is None:
        return {}
    return {
        "approval": {
            name: decision[name]
            for name in ("decision", "reason", "by", "at", "waited_s")
            if name in decision
        }
    }


def _awaiting_of(turn: TurnState) -> dict[str, Any]:
    """A turn's gated calls that wait for a decision (none: nothing shown)."""
    waiting = [
        {"toolUseId": ident, "name": e["name"], "input": e["input"], "requested_at": e["at"]}
        for ident, e in turn.requested.items()
        if ident not in turn.decisions
    ]
    return {"awaiting_approval": waiting} if waiting else {}


def transcript(log: Sequence[Event]) -> dict[str, Any]:
    """A unit's output as the results will carry it: the figures of :func:`summary`, the final
    answer, the stop (its reason and detail), and every turn: its draw and bill, the assistant
    message, its stop reason and usage, and each tool call with its input, status, result and
    latency."""
    state = read_log(log)
    turns = []
    for turn in state.turns:
        settled = turn.settled or {}
        turns.append(
            {
                "turn": turn.n,
                "drawn": turn.drawn,
                "billed": settled.get("billed"),
                "lost": bool(settled.get("lost")),
                "refused": settled.get("refused", ""),
                "message": turn.message,
                "stopReason": turn.stop_reason,
                "usage": turn.usage,
                "tool_calls": [
                    {
                        **{
                            name: turn.results[use["toolUseId"]][name]
                            for name in (
                                "toolUseId",
                                "name",
                                "input",
                                "status",
                                "content",
                                "latency_s",
                            )
                        },
                        **_approval_of(turn, use["toolUseId"]),
                    }
                    for use in turn.tool_uses
                    if use["toolUseId"] in turn.results
                ],
                **_awaiting_of(turn),
            }
        )
    stop = state.stopped
    return {
        **summary(log),
        "answer": final_answer(state) if stop is None else stop["answer"],
        "stop": None if stop is None else {"reason": stop["reason"], "detail": stop["detail"]},
        "turns": turns,
    }
