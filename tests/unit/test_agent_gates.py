"""Human gates (docs/agents.md, "Human gates"): a gated tool call parks its agent unit until a
person decides. The pure part (next_step over a log with approval events, the unit contract's
``limits.approve_tools``, the transcript) and the whole flow through the worker and the
approvals service on in-memory ports: parked units hold no message and no worker, decisions
send them back, approved calls run once, rejected ones reach the model as errors with their
reason, undecided ones time out, and the books stay exact."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from swarm.core import agent
from swarm.core.agent import AskApproval, AwaitApproval, RunTools, SettleTurn, Tool
from swarm.core.errors import Conflict, InvalidInput, NotFound
from swarm.core.memory import MemoryRunWatch
from swarm.core.records import RunState, UnitState
from swarm.service.approvals import TIMEOUT_DECIDER, Gates
from swarm.service.batches import UnitInput, results_key
from swarm.service.finalizer import Finalizer
from swarm.service.results import Results
from swarm.service.sweeper import SweepConfig, Sweeper
from tests.unit.test_agent_worker import (
    CALC,
    NOTES_READ,
    NOTES_WRITE,
    AgentPlane,
    Tools,
    assert_books_exact,
)

REGISTRY = {t.name: t for t in (CALC, NOTES_WRITE, NOTES_READ)}
ALICE = "arn:aws:sts::123456789012:assumed-role/swarm-tenant-acme/alice"


def spec(approve: list[str] | None = None, registry: dict[str, Tool] = REGISTRY) -> agent.AgentSpec:
    value: dict[str, Any] = {
        "messages": [{"role": "user", "content": [{"text": "keep a note"}]}],
        "tools": ["calculator", "notes_write"],
    }
    if approve is not None:
        value["limits"] = {"approve_tools": approve}
    return agent.parse_agent_input(
        value, batch="b", unit="u", projected_tokens=50_000, registry=registry
    )


def answered(uses: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """A log whose turn 1 was answered with these (toolUseId, tool name) calls."""
    content: list[dict[str, Any]] = [{"text": "working"}]
    content += [{"toolUse": {"toolUseId": i, "name": n, "input": {"name": "k"}}} for i, n in uses]
    response = {"output": {"message": {"role": "assistant", "content": content}}}
    response |= {"stopReason": "tool_use", "usage": {"inputTokens": 10, "outputTokens": 5}}
    return [
        {"type": "turn_started", "turn": 1, "drawn": 100, "at": 0.0},
        agent.model_turn(1, response, 0.1, 1.0),
    ]


# ------------------------------------------------------------------ the pure part


def test_a_gated_call_is_asked_then_awaited_and_nothing_of_its_turn_runs() -> None:
    s = spec(["notes_write"])
    log = answered([("t1", "calculator"), ("t2", "notes_write")])
    step = agent.next_step(log, s)
    # the gated call is asked for a decision; the calculator beside it waits with it
    assert isinstance(step, AskApproval) and [c.tool_use_id for c in step.calls] == ["t2"]
    log.append(agent.approval_requested(step.calls[0], at=10.0))
    assert agent.next_step(log, s) == AwaitApproval(1, ("t2",))
    assert [e["toolUseId"] for e in agent.waiting_approvals(log)] == ["t2"]
    # approved: every call of the turn runs, the gated one as it was asked
    approved = agent.approval_decided(log[-1], "approve", "ok", ALICE, at=70.0)
    step = agent.next_step([*log, approved], s)
    assert isinstance(step, RunTools)
    assert [(c.tool_use_id, c.refused) for c in step.calls] == [("t1", None), ("t2", None)]
    assert approved["waited_s"] == 60.0 and approved["by"] == ALICE
    assert agent.waiting_approvals([*log, approved]) == []


def test_a_rejected_call_gets_an_error_result_with_the_reason_and_the_loop_goes_on() -> None:
    s = spec(["notes_write"])
    log = answered([("t2", "notes_write")])
    asked = agent.next_step(log, s)
    assert isinstance(asked, AskApproval)
    log.append(agent.approval_requested(asked.calls[0], at=10.0))
    log.append(agent.approval_decided(log[-1], "reject", "not that note", ALICE, at=20.0))
    step = agent.next_step(log, s)
    assert isinstance(step, RunTools)
    (call,) = step.calls
    assert call.refused is not None and "not that note" in call.refused
    assert "rejected" in call.refused
    # its result (written without running) lets the turn settle and the next turn be called
    log.append(agent.tool_result(call, "error", call.refused, 0.0, 21.0))
    settle = agent.next_step(log, s)
    assert isinstance(settle, SettleTurn) and not settle.lost
    log.append(agent.turn_settled(settle, 22.0))
    follow = agent.next_step(log, s)
    assert isinstance(follow, agent.CallModel)
    sent = follow.request["messages"][-1]["content"][0]["toolResult"]
    assert sent["status"] == "error" and "not that note" in sent["content"][0]["text"]
    # and the transcript shows who decided, when, why and how long it waited
    (turn,) = agent.transcript(log)["turns"]
    assert turn["tool_calls"][0]["approval"] == {
        "decision": "reject",
        "reason": "not that note",
        "by": ALICE,
        "at": 20.0,
        "waited_s": 10.0,
    }


def test_a_registry_gated_tool_waits_without_the_units_asking() -> None:
    gated = {**REGISTRY, "notes_write": replace(NOTES_WRITE, approval=True)}
    s = spec(registry=gated)
    step = agent.next_step(answered([("t1", "calculator"), ("t2", "notes_write")]), s)
    assert isinstance(step, AskApproval) and [c.name for c in step.calls] == ["notes_write"]
    # an ungated unit runs its calls at once
    assert isinstance(agent.next_step(answered([("t2", "notes_write")]), spec()), RunTools)
    # a call of an unknown tool is refused without asking anyone
    odd = agent.next_step(answered([("t3", "nope")]), spec(["notes_write"]))
    assert isinstance(odd, RunTools) and odd.calls[0].refused is not None


@pytest.mark.parametrize(
    ("approve", "field", "text"),
    [
        (["notes_read"], "input.limits.approve_tools[0]", "not one of the unit's tools"),
        (["notes_write", "notes_write"], "input.limits.approve_tools[1]", "twice"),
        ("notes_write", "input.limits.approve_tools", "must be a list"),
    ],
)
def test_approve_tools_names_the_units_own_tools(approve: Any, field: str, text: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        spec(approve)
    assert caught.value.field == field and text in str(caught.value)


def test_a_log_with_approvals_out_of_order_is_corrupt() -> None:
    log = answered([("t2", "notes_write")])
    call = agent.ToolCall(1, "t2", "notes_write", {"name": "k"}, "b/u/t2")
    requested = agent.approval_requested(call, 1.0)
    decided = agent.approval_decided(requested, "approve", "", ALICE, 2.0)
    with pytest.raises(agent.CorruptLog, match="never requested"):
        agent.read_log([*log, decided])
    with pytest.raises(agent.CorruptLog, match="second approval_requested"):
        agent.read_log([*log, requested, requested])
    with pytest.raises(agent.CorruptLog, match="never asked"):
        agent.read_log([*log, {**requested, "toolUseId": "zz"}])
    with pytest.raises(InvalidInput, match="decision"):
        agent.approval_decided(requested, "maybe", "", ALICE, 2.0)


# ------------------------------------------------------------------ through the worker


def gated_units(n: int) -> list[UnitInput]:
    """Units of two turns: turn 1 writes note ``note-1``, gated; turn 2 answers."""
    return [
        UnitInput(
            f"g{i:02d}",
            40_000,
            {
                "system": [{"text": "Keep notes. turns=2"}],
                "messages": [{"role": "user", "content": [{"text": f"unit {i}"}]}],
                "inferenceConfig": {"maxTokens": 256},
                "tools": ["notes_write"],
                "limits": {"approve_tools": ["notes_write"]},
            },
        )
        for i in range(n)
    ]


def gated_plane() -> tuple[AgentPlane, Gates]:
    ap = AgentPlane()
    p = ap.plane
    p.worker = replace(p.worker, events=p.events)
    return ap, Gates(p.ledger, p.queue, p.blobs, lease_s=p.worker.config.lease_s)


def test_gated_units_park_without_a_message_and_complete_with_the_decided_effects_only() -> None:
    ap, approvals = gated_plane()
    p = ap.plane
    run_id = ap.submit(gated_units(4))
    ap.pump()
    # Then every unit is parked: no message in the lanes, its tokens still reserved
    run = p.ledger.run(run_id)
    assert (run.state, run.awaiting, run.in_flight, run.completed) == (RunState.OPEN, 4, 0, 0)
    assert p.queue.receive() is None and not p.queue.delayed
    assert run.reserved == sum(
        u.reservation.held for u in p.ledger.units(run_id) if u.reservation is not None
    )
    tools: Tools = ap.tools
    assert tools.calls == 0  # nothing of a gated turn ran
    announced = [d for t, d in p.events.published if t == "unit.awaiting_approval"]
    assert sorted(d["unit_id"] for d in announced) == ["g00", "g01", "g02", "g03"]
    # the batch lists the four calls
    waiting, token = approvals.waiting(run, p.clock.now())
    assert token is None  # one page holds them
    assert [(w["unit_id"], w["tool"], w["toolUseId"]) for w in waiting] == [
        (f"g0{i}", "notes_write", "t1-1-0") for i in range(4)
    ]
    # When two are approved and two rejected
    now = p.clock.now()
    for unit_id in ("g00", "g01"):
        decided = approvals.decide(run, unit_id, "t1-1-0", "approve", "", ALICE, now + 5)
        assert decided.recorded and decided.queued and decided.unit_state == "in_flight"
    for unit_id in ("g02", "g03"):
        approvals.decide(run, unit_id, "t1-1-0", "reject", "wrong note", ALICE, now + 5)
    # the same decision again answers the recorded one; a different one is a conflict
    again = approvals.decide(run, "g00", "t1-1-0", "approve", "", ALICE, now + 9)
    assert not again.recorded and again.event["at"] == now + 5
    with pytest.raises(Conflict, match="decided already: approve"):
        approvals.decide(run, "g00", "t1-1-0", "reject", "no", ALICE, now + 9)
    with pytest.raises(NotFound):
        approvals.decide(run, "g00", "t9", "approve", "", ALICE, now + 9)
    ap.pump()
    # Then every unit completes; only the approved writes happened, each once
    run = p.ledger.run(run_id)
    assert run.state is RunState.COMPLETED and run.completed == 4 and run.reserved == 0
    assert sorted(k.split("/")[1] for k in tools.effects) == ["g00", "g01"]
    assert set(tools.effects.values()) == {1}
    assert_books_exact(ap, run_id)
    logs = ap.logs(run_id)
    for unit_id in ("g02", "g03"):
        (result,) = [e for e in logs[unit_id] if e["type"] == "tool_result"]
        assert result["status"] == "error" and "wrong note" in result["content"][0]["text"]
    transcript = agent.transcript(logs["g01"])
    assert transcript["turns"][0]["tool_calls"][0]["approval"]["decision"] == "approve"
    assert transcript["turns"][0]["tool_calls"][0]["approval"]["by"] == ALICE


def test_an_undecided_call_times_out_through_the_sweep_and_a_lost_send_is_sent_again() -> None:
    ap, approvals = gated_plane()
    p = ap.plane
    p.worker = replace(p.worker, config=replace(p.worker.config, approval_timeout_s=3_600.0))
    run_id = ap.submit(gated_units(2))
    ap.pump()
    assert p.ledger.run(run_id).awaiting == 2
    # a sweep before the timeout decides nothing
    approvals.sweep(run_id, p.clock.now() + 10, lambda: True)
    assert p.ledger.run(run_id).awaiting == 2
    # g00 is approved but its message is lost on the way to its lane
    run = p.ledger.run(run_id)
    approvals.decide(run, "g00", "t1-1-0", "approve", "", ALICE, p.clock.now())
    assert p.queue.receive() is not None  # (the message, dropped)
    # When the sweep runs past the timeout and the decided unit's lease
    p.clock.t += 3_700
    approvals.sweep(run_id, p.clock.now(), lambda: True)
    # Then g01 is rejected by the timeout, and both are back in their lane
    log = p.ledger.read_log(run_id, "g01")
    assert log[-1]["decision"] == "reject" and log[-1]["by"] == TIMEOUT_DECIDER
    assert "timed out" in log[-1]["reason"]
    ap.pump()
    run = p.ledger.run(run_id)
    assert run.state is RunState.COMPLETED and run.completed == 2
    tools: Tools = ap.tools
    assert [k.split("/")[1] for k in tools.effects] == ["g00"]
    assert_books_exact(ap, run_id)


def test_a_drained_budget_leaves_a_parked_unit_and_its_late_decision_joins_the_remainder() -> None:
    ap, approvals = gated_plane()
    p = ap.plane
    run_id = ap.submit(gated_units(3), budget=100_000)  # two caps: the third is refused
    ap.pump()
    p.finalizer.finalize(run_id, p.clock.now())
    run = p.ledger.run(run_id)
    assert run.state is RunState.EXHAUSTED and run.awaiting == 2 and run.remainder == 1
    parked = [u.unit_id for u in p.ledger.units(run_id) if u.state is UnitState.AWAITING_APPROVAL]
    # a decision after exhaustion runs no turn: the unit joins the remainder, its tokens freed
    decided = approvals.decide(run, parked[0], "t1-1-0", "approve", "", ALICE, p.clock.now())
    assert not decided.queued and decided.unit_state == "remainder"
    assert p.queue.receive() is None
    run = p.ledger.run(run_id)
    assert run.remainder == 2 and run.awaiting == 1
    tools: Tools = ap.tools
    assert tools.calls == 0
    assert_books_exact(ap, run_id)


def test_an_exhausted_runs_parked_units_stay_in_its_remainder_and_still_time_out() -> None:
    """Exhaustion closes the run; its parked units are in the remainder with their calls still
    waiting, the sweeper times them out after the closure, and a top-up's resume runs them."""
    ap, approvals = gated_plane()
    p = ap.plane
    timeout_s = p.worker.config.approval_timeout_s
    watch = MemoryRunWatch(p.ledger, grace_s=30.0)
    results = Results(p.ledger, p.results)
    finalizer = Finalizer(
        p.ledger, p.queue, p.blobs, p.events, results, watch=watch, approvals=approvals
    )
    sweeper = Sweeper(p.ledger, watch, p.executions, finalizer, SweepConfig(interval_s=60.0))
    run_id = ap.submit(gated_units(3), budget=100_000)  # two caps: the third is refused
    ap.pump()
    parked_at = p.clock.now()
    finalizer.finalize(run_id, parked_at)
    p.executions.statuses[run_id] = "SUCCEEDED"  # its execution ended with the closure
    run = p.ledger.run(run_id)
    assert run.state is RunState.EXHAUSTED and run.awaiting == 2 and run.remainder == 1
    # Then the results hold the parked units in the remainder, marked as awaiting a decision
    summary = p.blobs.get_json(results_key(run_id, run.state, run.exhaustions))
    parked = sorted(u for u, doc in summary["units"].items() if doc.get("awaiting_approval"))
    assert len(parked) == 2 and set(parked) <= set(summary["remainder"])
    assert len(summary["remainder"]) == 3
    # and the sweeper still watches the run, due when the first parked call times out
    watched = watch.get(run_id)
    assert watched is not None and parked_at < watched.sweep_at <= parked_at + timeout_s
    # When one is decided after the closure, and the other is left
    approvals.decide(run, parked[0], "t1-1-0", "approve", "", ALICE, p.clock.now())
    sweeper.sweep(p.clock.now() + 60)  # not due yet: nothing times out
    assert p.ledger.run(run_id).awaiting == 1
    p.clock.t += timeout_s + 1
    sweeper.sweep(p.clock.now())
    # Then the sweeper rejected the undecided call after its timeout, and forgot the run
    log = p.ledger.read_log(run_id, parked[1])
    assert log[-1]["decision"] == "reject" and log[-1]["by"] == TIMEOUT_DECIDER
    run = p.ledger.run(run_id)
    assert (run.state, run.awaiting, run.remainder, run.reserved) == (RunState.EXHAUSTED, 0, 3, 0)
    assert watch.get(run_id) is None
    # and a top-up's resume runs the remainder: the two decided units to their end, the third
    # (refused at the exhaustion) to its own gate
    p.batches.resume("acme", run_id, 10**6, p.clock.now())
    p.fan_out()
    ap.pump()
    run = p.ledger.run(run_id)
    assert (run.state, run.completed, run.awaiting) == (RunState.OPEN, 2, 1), run
    [third] = [u for u in summary["remainder"] if u not in parked]
    approvals.decide(run, third, "t1-1-0", "approve", "", ALICE, p.clock.now())
    ap.pump()
    run = p.ledger.run(run_id)
    assert run.state is RunState.COMPLETED and run.completed == 3 and run.reserved == 0, run
    tools: Tools = ap.tools
    assert sorted(k.split("/")[1] for k in tools.effects) == sorted([parked[0], third])
    assert_books_exact(ap, run_id)


class _CountingLedger:
    """The ledger, noting which units the listing reads."""

    def __init__(self, ledger: Any) -> None:
        self._ledger = ledger
        self.read: list[str] = []

    def units(self, run_id: str) -> Any:
        raise AssertionError("the listing read every unit of the batch")

    def unit(self, run_id: str, unit_id: str) -> Any:
        self.read.append(unit_id)
        return self._ledger.unit(run_id, unit_id)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ledger, name)


def test_the_listing_reads_the_leased_units_only_never_every_unit_of_the_batch() -> None:
    ap, approvals = gated_plane()
    p = ap.plane
    plain = {
        "messages": [{"role": "user", "content": [{"text": "no tools"}]}],
        "inferenceConfig": {"maxTokens": 64},
    }
    # a batch of 3 gated units beside 12 single-call units, which complete
    run_id = ap.submit(
        [*gated_units(3), *(UnitInput(f"s{i:02d}", 1_000, plain) for i in range(12))]
    )
    ap.pump()
    run = p.ledger.run(run_id)
    assert (run.awaiting, run.completed) == (3, 12)
    counting = _CountingLedger(p.ledger)
    listing = replace(approvals, ledger=counting)  # type: ignore[arg-type]
    waiting, token = listing.waiting(run, p.clock.now())
    assert token is None
    # Then it lists the three waiting calls, having read those units alone (the lease index)
    assert [w["unit_id"] for w in waiting] == ["g00", "g01", "g02"]
    assert sorted(counting.read) == ["g00", "g01", "g02"]
