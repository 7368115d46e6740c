"""The agent loop's pure core (swarm.core.agent) and its in-memory driver
(swarm.core.agent_driver): the unit contract's errors, Converse's rules in every request, the
limits, and resuming from the log after a kill at each point of a turn without calling a
recorded turn again, running a recorded tool again, or billing a turn twice."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from swarm.core import agent
from swarm.core.agent import AgentSpec, Tool, ToolCall
from swarm.core.agent_driver import (
    Killed,
    KillPoint,
    LoopRunner,
    MemoryLogStore,
    MemoryTurnBooks,
    ToolOutcome,
    log_key,
)
from swarm.core.clock import VirtualClock
from swarm.core.errors import Contended, InvalidInput
from swarm.core.ports import ModelThrottled

OBJECT = {"type": "object", "properties": {"x": {"type": "number"}}}
REGISTRY = {
    "add": Tool("add", "Adds one to x.", OBJECT),
    "note": Tool("note", "Writes a note.", OBJECT),
    "secret": Tool("secret", "Reads a secret.", OBJECT),
}


def spec_of(value: Any, projected: int = 100_000, **kwargs: Any) -> AgentSpec:
    return agent.parse_agent_input(
        value, batch="b1", unit="u1", projected_tokens=projected, registry=REGISTRY, **kwargs
    )


def talk(*tools: str, **extra: Any) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": [{"text": "Add one to 1, twice."}]}],
        "tools": list(tools),
        **extra,
    }


def answer(text: str, usage: int = 10) -> dict[str, Any]:
    return {
        "output": {"message": {"role": "assistant", "content": [{"text": text}]}},
        "stopReason": "end_turn",
        "usage": {"inputTokens": usage, "outputTokens": 5, "cacheReadInputTokens": 3},
    }


def calls(*uses: tuple[str, str, dict[str, Any]], stop: str = "tool_use") -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"text": "Calling."}]
    content += [{"toolUse": {"toolUseId": i, "name": n, "input": x}} for i, n, x in uses]
    return {
        "output": {"message": {"role": "assistant", "content": content}},
        "stopReason": stop,
        "usage": {"inputTokens": 20, "outputTokens": 7, "cacheWriteInputTokens": 2},
    }


@dataclass
class Scripted:
    """A model that answers by how many assistant messages the request holds, so a request sent
    again (a lost turn) gets the same answer; it counts its calls and what they billed."""

    script: list[dict[str, Any]]
    requests: list[dict[str, Any]] = field(default_factory=list)
    billed: int = 0

    def __call__(self, request: dict[str, Any]) -> Mapping[str, Any]:
        assert agent.request_problem(request) is None
        self.requests.append(json.loads(json.dumps(request)))
        position = sum(1 for m in request["messages"] if m["role"] == "assistant")
        response = self.script[min(position, len(self.script) - 1)]
        self.billed += agent.billed_of(response["usage"])
        return response


@dataclass
class Counting:
    """A tool executor honouring idempotency keys: effects counted per key, once."""

    effects: Counter[str] = field(default_factory=Counter)
    done: dict[str, ToolOutcome] = field(default_factory=dict)
    fail: bool = False

    def __call__(self, call: ToolCall) -> ToolOutcome:
        if call.key in self.done:
            return self.done[call.key]
        if self.fail:
            raise RuntimeError("disk full")
        self.effects[call.key] += 1
        outcome = ToolOutcome("success", {"x": call.input["x"] + 1})
        self.done[call.key] = outcome
        return outcome


def runner(
    spec: AgentSpec,
    model: Scripted,
    tools: Counting | None = None,
    store: MemoryLogStore | None = None,
    books: MemoryTurnBooks | None = None,
    kill: Any = None,
) -> LoopRunner:
    return LoopRunner(
        spec,
        store if store is not None else MemoryLogStore(),
        model,
        tools if tools is not None else Counting(),
        books if books is not None else MemoryTurnBooks(),
        VirtualClock(),
        kill if kill is not None else (lambda point, turn: False),
    )


TWO_TOOLS = [
    calls(("t1", "add", {"x": 1}), ("t2", "note", {"x": 5})),
    calls(("t3", "add", {"x": 2})),
    answer("It is 3."),
]


# ------------------------------------------------------------------ the unit contract


@pytest.mark.parametrize(
    ("value", "field", "says"),
    [
        (talk("nope"), "input.tools[0]", "'nope' is not a tool"),
        (talk("add", "add"), "input.tools[1]", "listed twice"),
        (talk("add", toolChoice="some"), "input.toolChoice", '"auto", "any"'),
        (talk("add", toolChoice={"tool": "note"}), "input.toolChoice.tool", "not one of"),
        (talk(toolChoice="any"), "input.toolChoice", "needs tools"),
        (talk("add", limits={"max_turns": 0}), "input.limits.max_turns", "from 1 to 100"),
        (talk("add", limits={"max_turns": 101}), "input.limits.max_turns", "from 1 to 100"),
        (talk("add", limits={"max_turns": True}), "input.limits.max_turns", "integer"),
        (talk("add", limits={"turns": 3}), "input.limits.turns", "is not a limit"),
        (talk("add", followUps=[" "]), "input.followUps[0].messages[0].content[0].text", "text"),
        (talk("add", followUps="more"), "input.followUps", "list of user messages"),
        ({"tools": ["add"]}, "input.messages", "is required"),
    ],
)
def test_bad_agent_input_names_the_field(value: Any, field: str, says: str) -> None:
    with pytest.raises(InvalidInput) as e:
        spec_of(value)
    assert e.value.field == field
    assert says in e.value.message


def test_a_tool_the_tenant_may_not_use_is_refused() -> None:
    with pytest.raises(InvalidInput, match=r"input.tools\[1\]: the tenant may not use 'secret'"):
        spec_of(talk("add", "secret"), allowed=frozenset({"add", "note"}))


@pytest.mark.parametrize(
    ("model_id", "takes"),
    [
        ("anthropic.claude-3-5-haiku-20241022-v1:0", ("auto", "any", "tool")),
        ("us.anthropic.claude-3-7-sonnet-20250219-v1:0", ("auto", "any", "tool")),
        ("global.anthropic.claude-sonnet-4-5-20250929-v1:0", ("auto", "any", "tool")),
        ("anthropic.claude-opus-4-1-20250805-v1:0", ("auto", "any", "tool")),
        ("amazon.nova-pro-v1:0", ("auto", "any", "tool")),
        ("eu.amazon.nova-lite-v1:0", ("auto", "any", "tool")),
        ("mistral.mistral-large-2407-v1:0", ("auto", "any")),
        ("mistral.mistral-small-2402-v1:0", ("auto",)),
        ("meta.llama3-1-70b-instruct-v1:0", ("auto",)),
        ("us.meta.llama3-3-70b-instruct-v1:0", ("auto",)),
        ("cohere.command-r-plus-v1:0", ("auto",)),
        ("amazon.titan-text-premier-v1:0", ("auto",)),
        ("anthropic.claude-v2:1", ("auto",)),
        ("anthropic.claude-instant-v1", ("auto",)),
    ],
)
def test_the_tool_choices_a_model_takes_follow_its_family(
    model_id: str, takes: tuple[str, ...]
) -> None:
    assert agent.model_tool_choices(model_id) == takes


@pytest.mark.parametrize(
    ("model_id", "choice", "says"),
    [
        ("mistral.mistral-large-2407-v1:0", {"tool": "add"}, 'takes "auto" and "any" from it'),
        ("meta.llama3-1-70b-instruct-v1:0", {"tool": "add"}, 'takes "auto" from it; use that'),
        ("meta.llama3-1-70b-instruct-v1:0", "any", '"any" is not supported'),
    ],
)
def test_a_tool_choice_the_deployments_model_does_not_take_is_refused_naming_the_field(
    model_id: str, choice: Any, says: str
) -> None:
    with pytest.raises(InvalidInput) as e:
        spec_of(talk("add", toolChoice=choice), model_id=model_id)
    assert e.value.field == "input.toolChoice"
    assert says in e.value.message and f"model ({model_id})" in e.value.message
    assert "leave toolChoice out" in e.value.message


def test_a_tool_choice_the_model_takes_or_none_at_all_is_accepted() -> None:
    claude = "anthropic.claude-3-5-haiku-20241022-v1:0"
    forced = spec_of(talk("add", toolChoice={"tool": "add"}), model_id=claude)
    assert forced.tool_choice == {"tool": "add"}
    nova = spec_of(talk("add", toolChoice="any"), model_id="amazon.nova-micro-v1:0")
    assert nova.tool_choice == "any"
    llama = "meta.llama3-1-70b-instruct-v1:0"
    assert spec_of(talk("add", toolChoice="auto"), model_id=llama).tool_choice == "auto"
    assert spec_of(talk("add"), model_id=llama).tool_choice == "auto"  # none given: auto
    # and without a model id (the in-memory driver's tests) nothing is checked
    assert spec_of(talk("add", toolChoice={"tool": "add"})).tool_choice == {"tool": "add"}


def test_an_agent_input_has_defaults() -> None:
    spec = spec_of(talk("add"))
    assert (spec.max_turns, spec.tool_choice, spec.follow_ups) == (20, "auto", ())
    assert agent.is_agent_input(talk("add")) and not agent.is_agent_input({"messages": []})
    assert spec_of({**talk(), "followUps": ["and?"]}).follow_ups == (({"text": "and?"},),)


# ------------------------------------------------------------------ the loop


def test_a_loop_runs_tools_and_keeps_converse_rules_on_every_turn() -> None:
    model, tools = Scripted(TWO_TOOLS), Counting()
    run = runner(spec_of(talk("add", "note")), model, tools)
    end = run.run()
    assert (end.reason, end.answer) == ("completed", "It is 3.")
    assert len(model.requests) == 3
    assert all("toolConfig" in r for r in model.requests)  # every turn, tools or not
    second = model.requests[1]["messages"]
    # the two results go back in one user message, in the order the model asked
    assert [b["toolResult"]["toolUseId"] for b in second[-1]["content"]] == ["t1", "t2"]
    assert second[-1]["content"][0]["toolResult"]["content"] == [{"json": {"x": 2}}]
    assert sorted(tools.effects) == ["b1/u1/t1", "b1/u1/t2", "b1/u1/t3"]  # the keys
    log = run.store.read("b1/u1")
    assert agent.summary(log)["tool_calls"] == 3 and agent.summary(log)["turns"] == 3
    assert run.books.spent("b1", "u1") == agent.spent(log) == model.billed  # type: ignore[attr-defined]


def test_a_forced_tool_choice_holds_until_a_tool_was_called() -> None:
    model = Scripted(TWO_TOOLS)
    runner(spec_of(talk("add", "note", toolChoice={"tool": "add"})), model).run()
    choices = [r["toolConfig"]["toolChoice"] for r in model.requests]
    assert choices == [{"tool": {"name": "add"}}, {"auto": {}}, {"auto": {}}]


def test_follow_ups_are_sent_one_by_one_after_each_answer() -> None:
    model = Scripted([answer("one"), answer("two")])
    end = runner(spec_of({**talk(), "followUps": ["next?"]}), model).run()
    assert end.answer == "two"
    assert [m["role"] for m in model.requests[1]["messages"]] == ["user", "assistant", "user"]
    assert model.requests[1]["messages"][-1]["content"] == [{"text": "next?"}]
    assert "toolConfig" not in model.requests[0]  # no tools declared


def test_an_unknown_tool_or_a_failing_tool_is_an_error_result_the_model_reads() -> None:
    model = Scripted([calls(("t1", "rm", {"x": 1}), ("t2", "add", {"x": 1})), answer("ok")])
    run = runner(spec_of(talk("add")), model, Counting(fail=True))
    run.run()
    results = [e for e in run.store.read("b1/u1") if e["type"] == "tool_result"]
    assert [r["status"] for r in results] == ["error", "error"]
    assert "there is no tool 'rm'; the tools are: add" in results[0]["content"][0]["text"]
    assert "RuntimeError: disk full" in results[1]["content"][0]["text"]


def test_an_empty_tool_result_is_never_sent_empty() -> None:
    assert agent.result_content("", "error") == [{"text": agent.EMPTY_ERROR}]
    assert agent.result_content("  ", "success") == [{"text": agent.EMPTY_RESULT}]
    assert agent.result_content([1, 2], "success") == [{"text": "[1, 2]"}]
    # what JSON cannot hold goes as text, so the log's store can keep it
    assert agent.result_content({"x": float("nan")}, "success") == [{"text": "{'x': nan}"}]
    assert agent.result_content(float("inf"), "success") == [{"text": "inf"}]


@pytest.mark.parametrize(
    ("messages", "config", "problem"),
    [
        ([("assistant", [{"text": "hi"}])], True, "must start with a user"),
        ([("user", [{"text": "a"}]), ("assistant", [{"toolUse": {"toolUseId": "t1"}}])], True,
         "must end with a user"),
        ([("user", [{"text": "a"}]), ("assistant", [{"toolUse": {"toolUseId": "t 1"}}]),
          ("user", [{"text": "b"}])], True, "toolUseId 't 1'"),
        ([("user", [{"text": "a"}]), ("assistant", [{"toolUse": {"toolUseId": "t1"}}]),
          ("user", [{"text": "b"}])], True, "does not answer toolUse ['t1']"),
        ([("user", [{"text": "a"}]), ("assistant", [{"toolUse": {"toolUseId": "t1"}}]),
          ("user", [{"toolResult": {"toolUseId": "t1", "content": []}}])], True, "empty content"),
        ([("user", [{"text": "a"}]), ("assistant", [{"toolUse": {"toolUseId": "t1"}}]),
          ("user", [{"toolResult": {"toolUseId": "t1", "content": [{"text": "1"}]}}])], False,
         "no toolConfig"),
        ([("user", [{"toolResult": {"toolUseId": "t9", "content": [{"text": "1"}]}}])], True,
         "was not asked"),
    ],
)  # fmt: skip
def test_requests_that_break_converse_are_named(
    messages: list[tuple[str, list[dict[str, Any]]]], config: bool, problem: str
) -> None:
    request: dict[str, Any] = {"messages": [{"role": r, "content": c} for r, c in messages]}
    if config:
        request["toolConfig"] = {"tools": []}
    assert problem in (agent.request_problem(request) or "")


# ------------------------------------------------------------------ limits


def test_max_turns_stops_the_loop_without_calling_another_turn() -> None:
    model = Scripted([calls((f"t{i}", "add", {"x": i})) for i in range(10)])
    end = runner(spec_of(talk("add", limits={"max_turns": 3})), model).run()
    assert (end.reason, len(model.requests)) == ("limit_turns", 3)


def test_a_turn_that_cannot_fit_the_cap_is_not_called() -> None:
    spec = spec_of({**talk("add", "note"), "inferenceConfig": {"maxTokens": 100}})
    first = agent.next_step([], spec)
    assert isinstance(first, agent.CallModel) and first.output_bound == 100
    assert first.draw == first.input_estimate + 100
    # turn 1 fits exactly; the model bills 29, which leaves less than turn 2's draw (what the
    # model counted for turn 1, plus the results sent since, plus the output bound)
    spec = spec_of({**talk("add", "note"), "inferenceConfig": {"maxTokens": 100}}, first.draw)
    model = Scripted(TWO_TOOLS)
    run = runner(spec, model)
    end = run.run()
    assert end.reason == "limit_tokens", end
    assert end.detail.startswith("turn 2 needs")
    assert f"the unit has {first.draw - 29:,} of its {first.draw:,} left" in end.detail
    assert len(model.requests) == 1
    assert agent.spent(run.store.read("b1/u1")) == 29


def test_a_cap_too_small_for_the_first_turn_is_refused_at_submission() -> None:
    with pytest.raises(InvalidInput) as e:
        spec_of({**talk("add"), "inferenceConfig": {"maxTokens": 100}}, projected=120)
    assert e.value.field == "projected_tokens"
    assert "turn 1 needs" in e.value.message and "of its 120 left" in e.value.message
    assert "lower inferenceConfig.maxTokens" in e.value.message


@pytest.mark.parametrize("stop", ["guardrail_intervened", "content_filtered", "max_tokens"])
def test_a_refused_or_cut_answer_fails_the_unit_and_is_billed(stop: str) -> None:
    model = Scripted([calls(("t1", "add", {"x": 1}), stop=stop)])
    tools = Counting()
    run = runner(spec_of(talk("add")), model, tools)
    end = run.run()
    assert (end.reason, end.detail) == ("failed", stop)
    assert not tools.effects  # a refused turn's tool calls never run
    assert run.books.spent("b1", "u1") == 29  # type: ignore[attr-defined]


# ------------------------------------------------------------------ kills and resume


@pytest.mark.parametrize("point", list(KillPoint))
@pytest.mark.parametrize("turn", [1, 2])
def test_a_killed_loop_resumes_from_its_log(point: KillPoint, turn: int) -> None:
    model, tools = Scripted(TWO_TOOLS), Counting()
    store, books = MemoryLogStore(), MemoryTurnBooks()
    spec = spec_of(talk("add", "note"))
    kills = {(point, turn)}

    def kill(p: KillPoint, t: int) -> bool:
        if (p, t) in kills:
            kills.discard((p, t))  # each kill once
            return True
        return False

    with pytest.raises(Killed):
        runner(spec, model, tools, store, books, kill).run()
    end = runner(spec, model, tools, store, books, kill).run()  # the next worker
    again = runner(spec, model, tools, store, books).run()  # a duplicate delivery after the end
    assert end == again and end.reason == "completed"
    log = store.read(log_key(spec))
    state = agent.read_log(log)
    # every tool call had its effect once; each toolUseId has one recorded result
    assert set(tools.effects.values()) == {1} and len(tools.effects) == 3
    lost = [t for t in state.turns if t.settled and t.settled["lost"]]
    called_not_recorded = point in (KillPoint.BEFORE_MODEL_CALL, KillPoint.AFTER_MODEL_CALL)
    assert len(lost) == (1 if called_not_recorded else 0)
    # a recorded turn is never called again: one call per turn, the lost one's included
    calls_made = len(model.requests)
    made_before_kill = 0 if point is KillPoint.BEFORE_MODEL_CALL else 1
    assert calls_made == 3 + (made_before_kill if called_not_recorded else 0)
    # the books: each turn once, a lost turn at what was drawn for it, equal to the log's
    assert books.spent("b1", "u1") == agent.spent(log)
    recorded = sum(agent.billed_of(t.usage) for t in state.turns if t.message is not None)
    assert agent.spent(log) == recorded + sum(t.drawn for t in lost)
    assert len(books.billed) == len(state.turns)
    assert books.duplicates == (1 if point is KillPoint.AFTER_BOOKS else 0)


def test_a_zombie_worker_records_nothing() -> None:
    model, tools = Scripted(TWO_TOOLS), Counting()
    store, books = MemoryLogStore(), MemoryTurnBooks()
    spec = spec_of(talk("add", "note"))
    live = runner(spec, model, tools, store, books)
    for _ in range(1):  # turn 1 called and recorded: its tools are next
        log = store.read("b1/u1")
        live.advance(log, agent.next_step(log, spec))
    stale = store.read("b1/u1")
    step = agent.next_step(stale, spec)
    assert isinstance(step, agent.RunTools)
    live.run()
    zombie = runner(spec, model, tools, store, books)
    with pytest.raises(Contended):
        zombie.advance(stale, step)  # its tools answer from their keys; its append is refused
    assert set(tools.effects.values()) == {1}
    agent.read_log(store.read("b1/u1"))  # still a log the loop wrote


def test_a_log_no_loop_writes_is_refused() -> None:
    spec = spec_of(talk("add", "note"))
    run = runner(spec, Scripted(TWO_TOOLS))
    run.run()
    log = run.store.read("b1/u1")
    result = next(e for e in log if e["type"] == "tool_result")
    with pytest.raises(agent.CorruptLog, match="a second tool_result for 't1'"):
        agent.next_step([*log[:4], result, *log[4:]], spec)
    with pytest.raises(agent.CorruptLog, match="turn 2 started; expected 1"):
        agent.next_step([{**log[0], "turn": 2}], spec)


@pytest.mark.parametrize(
    ("script", "says"),
    [
        ([calls(("t 1", "add", {"x": 1}))], "toolUseId 't 1', which breaks"),
        ([calls(("t1", "add", {"x": 1})), calls(("t1", "add", {"x": 2}))], "'t1' twice"),
        ([calls(("t1", "add", {"x": 1}), ("t1", "add", {"x": 2}))], "'t1' twice"),
    ],
)
def test_tool_uses_whose_results_cannot_be_sent_fail_the_unit_unrun(
    script: list[dict[str, Any]], says: str
) -> None:
    tools = Counting()
    run = runner(spec_of(talk("add")), Scripted(script), tools)
    end = run.run()
    assert end.reason == "failed" and says in end.detail
    assert len(tools.effects) == len(script) - 1  # the turn at fault ran nothing
    assert run.books.spent("b1", "u1") == 29 * len(script)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("response", "says"),
    [
        ({"output": {}}, "no assistant message"),
        ({"output": {"message": {"role": "assistant", "content": "hi"}}}, "no content list"),
        ({"output": {"message": {"role": "assistant", "content": ["hi"]}}}, "not a content"),
        (
            {"output": {"message": {"role": "assistant", "content": [{"toolUse": {"name": "a"}}]}}},
            "no name or toolUseId",
        ),
    ],
)
def test_a_response_the_loop_cannot_record_is_refused(response: dict[str, Any], says: str) -> None:
    with pytest.raises(agent.BadModelResponse, match=says):
        agent.model_turn(1, response, 0.0, 0.0)


def test_a_throttled_call_is_settled_at_nothing_and_not_counted_as_a_turn() -> None:
    script = Scripted([calls(("t1", "add", {"x": 1})), answer("done")])
    refusals = [1, 2]  # the first two calls are refused for quota

    def model(request: dict[str, Any]) -> Mapping[str, Any]:
        if refusals:
            refusals.pop()
            raise ModelThrottled("quota")
        return script(request)

    store, books = MemoryLogStore(), MemoryTurnBooks()
    spec = spec_of(talk("add", limits={"max_turns": 2}))
    for _ in range(2):
        with pytest.raises(ModelThrottled):
            LoopRunner(spec, store, model, Counting(), books, VirtualClock()).run()
    end = LoopRunner(spec, store, model, Counting(), books, VirtualClock()).run()
    log = store.read("b1/u1")
    # two refused turns, then the two the unit may have: it completes within max_turns 2
    assert end.reason == "completed"
    assert agent.summary(log)["turns"] == 4 and agent.summary(log)["refused_turns"] == 2
    assert books.spent("b1", "u1") == agent.spent(log) == script.billed


# ------------------------------------------------------------------ any script, any kills

from hypothesis import HealthCheck, assume, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@st.composite
def scripts(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A model's answers by position: tool calls (to known and unknown tools), answers, and now
    and then a refusal."""
    out: list[dict[str, Any]] = []
    for position in range(draw(st.integers(1, 7))):
        kind = draw(st.sampled_from(["tools", "tools", "answer", "stop", "refused"]))
        if kind == "tools":
            names = draw(st.lists(st.sampled_from(["add", "note", "rm"]), min_size=1, max_size=3))
            out.append(calls(*[(f"p{position}-{j}", n, {"x": j}) for j, n in enumerate(names)]))
        elif kind == "refused":
            out.append(calls(("r1", "add", {"x": 0}), stop="guardrail_intervened"))
        else:
            out.append({**answer(f"answer {position}"), "stopReason": "end_turn"})
    return out


@settings(
    max_examples=150,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    script=scripts(),
    follow_ups=st.integers(0, 2),
    max_turns=st.integers(1, 8),
    projected=st.integers(150, 600),
    kills=st.sets(st.tuples(st.sampled_from(list(KillPoint)), st.integers(1, 8)), max_size=4),
    throttles=st.sets(st.integers(0, 8), max_size=3),
)
def test_any_script_with_any_kills_keeps_the_books_and_runs_each_tool_once(
    script: list[dict[str, Any]],
    follow_ups: int,
    max_turns: int,
    projected: int,
    kills: set[tuple[KillPoint, int]],
    throttles: set[int],
) -> None:
    value = {
        **talk("add", "note", limits={"max_turns": max_turns}),
        "inferenceConfig": {"maxTokens": 50},
        "followUps": [f"and then {i}?" for i in range(follow_ups)],
    }
    try:
        spec = spec_of(value, projected=projected)
    except InvalidInput:
        assume(False)
    scripted, tools = Scripted(script), Counting()
    store, books = MemoryLogStore(), MemoryTurnBooks()
    left, fired = set(kills), Counter[KillPoint]()
    arrivals = [0]  # calls that reached the model plane, refused ones too

    def model(request: dict[str, Any]) -> Mapping[str, Any]:
        arrivals[0] += 1
        if arrivals[0] - 1 in throttles:  # the plane refuses this call for quota
            raise ModelThrottled("quota")
        return scripted(request)

    def kill(point: KillPoint, turn: int) -> bool:
        if (point, turn) in left:
            left.discard((point, turn))
            fired[point] += 1
            return True
        return False

    for _ in range(len(kills) + len(throttles) + 1):
        try:
            end = LoopRunner(spec, store, model, tools, books, VirtualClock(), kill).run()
            break
        except (Killed, ModelThrottled):
            continue
    else:
        pytest.fail("the unit did not end")
    log = store.read(log_key(spec))
    state = agent.read_log(log)
    assert end.reason in agent.STOP_REASONS
    assert agent.turns_used(state) <= max_turns
    if end.reason == "limit_turns":
        assert agent.turns_used(state) == max_turns
    # every request the model saw kept Converse's rules (Scripted asserts it), and one call per
    # recorded turn, plus the calls made and lost
    recorded = [t for t in state.turns if t.message is not None]
    assert len(scripted.requests) == len(recorded) + fired[KillPoint.AFTER_MODEL_CALL]
    refused = [t for t in state.turns if t.settled and t.settled.get("refused")]
    assert all(t.settled and t.settled["billed"] == 0 for t in refused)
    lost = [t for t in state.turns if t.message is None and t not in refused]
    assert len(lost) == fired[KillPoint.BEFORE_MODEL_CALL] + fired[KillPoint.AFTER_MODEL_CALL]
    # the books: each turn once, exact, within the cap
    assert sorted(t for (_, _, t) in books.billed) == [t.n for t in state.turns]
    billed = sum(agent.billed_of(t.usage) for t in recorded) + sum(t.drawn for t in lost)
    assert books.spent("b1", "u1") == agent.spent(log) == billed <= projected
    # every turn was started only if its draw fit what was left of the cap then
    for seq, event in enumerate(log):
        if event["type"] == "turn_started":
            assert event["drawn"] <= projected - agent.spent(log[:seq])
    # each tool call had its effect once, and only calls the loop ran had any
    assert set(tools.effects.values()) <= {1}
    ran = {r["key"] for t in state.turns for r in t.results.values() if r["status"] == "success"}
    assert set(tools.effects) == ran


def test_the_transcript_holds_every_message_call_and_usage() -> None:
    model = Scripted(TWO_TOOLS)
    run = runner(spec_of(talk("add", "note")), model)
    run.run()
    out = agent.transcript(run.store.read("b1/u1"))
    assert out["answer"] == "It is 3." and out["stop"] == {"reason": "completed", "detail": ""}
    assert (out["turns"][0]["turn"], len(out["turns"])) == (1, 3)
    first = out["turns"][0]
    assert first["message"] == TWO_TOOLS[0]["output"]["message"]
    assert [c["toolUseId"] for c in first["tool_calls"]] == ["t1", "t2"]
    assert first["tool_calls"][0] == {
        "toolUseId": "t1",
        "name": "add",
        "input": {"x": 1},
        "status": "success",
        "content": [{"json": {"x": 2}}],
        "latency_s": 0.0,
    }
    assert sum(t["billed"] for t in out["turns"]) == out["billed"] == model.billed
    assert out["usage"]["cacheReadInputTokens"] == 3 and out["usage"]["cacheWriteInputTokens"] == 4
    json.dumps(out, allow_nan=False)  # JSON, as the results carry it


def test_blank_text_from_the_model_is_not_sent_back_and_an_empty_message_fails() -> None:
    blank_then_call = calls(("t1", "add", {"x": 1}))
    blank_then_call["output"]["message"]["content"][0] = {"text": "\n\n"}
    model = Scripted([blank_then_call, answer("fine")])
    end = runner(spec_of(talk("add")), model).run()
    assert end.reason == "completed"  # Scripted refuses any request that breaks Converse
    assert model.requests[1]["messages"][1]["content"] == [
        {"toolUse": {"toolUseId": "t1", "name": "add", "input": {"x": 1}}}
    ]
    blank = answer(" ")
    model = Scripted([blank, answer("never")])
    end = runner(spec_of({**talk(), "followUps": ["more?"]}), model).run()
    assert (end.reason, end.detail) == ("failed", "the model answered with an empty message")
    assert len(model.requests) == 1
