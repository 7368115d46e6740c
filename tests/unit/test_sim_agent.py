"""The simulator's agent units (`swarm sim run --turns`): the growth model, per-turn draws with a
bounded hold that sends a unit back to its lane, the cap, per-turn failures, exact books, and
`swarm plan --turns`."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import replace
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarm.core.errors import InvalidInput
from swarm.core.records import RunState
from swarm.core.scheduling import Schedule
from swarm.sim.agent import AgentSimulation, AgentStats
from swarm.sim.engine import FleetConfig, SimResult, crossover_workers, simulate
from swarm.sim.workload import TurnModel, Workload
from tests.unit.helpers import run_cli

FLEET = FleetConfig(workers=20, quota_tpm=120_000, budget=50_000_000)
AGENT = Workload(units=40, turns=TurnModel(turns_min=3, turns_max=6))


def _agent(result: SimResult) -> AgentStats:
    assert result.agent is not None
    return result.agent


def test_one_turn_is_the_one_call_simulator() -> None:
    """--turns 1 takes the one-call path whatever the other turn options: Lab 6.1 unchanged."""
    one_call = Workload(turns=TurnModel(tool_seconds=60, tool_tokens=999, output_tokens=7))
    a, b = simulate(one_call, FleetConfig()), simulate(Workload(), FleetConfig())
    assert a.agent is None and a.floor == b.floor
    assert (a.elapsed, a.run.spent, a.run.retries) == (b.elapsed, b.run.spent, b.run.retries)
    assert b.run.spent == 4_905_337


def test_the_growth_model() -> None:
    t = TurnModel(turns_min=5, turns_max=5, output_bound=300, output_tokens=100, tool_tokens=50)
    w = Workload(units=3, turns=t)
    for index in range(w.units):
        plan = w.turn_plan(index)
        assert len(plan) == 5
        for before, turn in pairwise(plan):
            # each turn reads the last one's input, what the model wrote and a tool result
            assert turn.input_tokens == before.input_tokens + 100 + 50
        for turn in plan:
            assert turn.draw == turn.input_tokens + 300
            assert turn.billed == turn.input_tokens + 100
        assert [turn.tool_s for turn in plan] == [5, 5, 5, 5, 0]  # the last turn answers
        # the default prompt fits the whole loop (its last turn drawn) in 90% of the cap
        fit = int(w.tokens(index) * 0.9)
        need = sum(turn.billed for turn in plan[:-1]) + plan[-1].draw
        assert fit - 5 < need <= fit
        # the model time is the one-call service time spread over the turns
        one_call = w.service_s(w.appetite(index))
        assert one_call - 5 <= sum(turn.model_s for turn in plan) <= one_call


def test_turn_counts_are_deterministic_per_seed_and_in_range() -> None:
    counts = [AGENT.turn_count(i) for i in range(AGENT.units)]
    assert counts == [AGENT.turn_count(i) for i in range(AGENT.units)]
    assert set(counts) == {3, 4, 5, 6}
    assert counts != [AGENT.with_seed(1).turn_count(i) for i in range(AGENT.units)]


def test_a_run_is_deterministic_and_its_books_are_exact() -> None:
    a, b = simulate(AGENT, FLEET), simulate(AGENT, FLEET)
    assert a.run.state is RunState.COMPLETED
    assert _agent(a).turns == _agent(b).turns and a.elapsed == b.elapsed
    stats = _agent(a)
    # spent is the sum of every turn's billed tokens, lost ones at their draw
    assert a.run.spent == stats.billed == sum(t.billed for t in stats.turns)
    by_unit: defaultdict[str, int] = defaultdict(int)
    for t in stats.turns:
        by_unit[t.unit_id] += t.billed
    sim = AgentSimulation.fresh(AGENT, FLEET)
    sim.run_until(FLEET.horizon_s)
    for index in range(AGENT.units):
        unit = sim.ledger.unit("sim-run", AGENT.unit_id(index))
        assert unit.spent == by_unit[unit.unit_id] <= AGENT.tokens(index)
    assert stats.model_turns == sum(stats.turns_per_unit)
    doc = stats.doc()
    assert doc["model_turns"] == stats.model_turns and doc["billed_by_turns"] == a.run.spent


def test_a_lost_turn_is_billed_at_its_draw_and_called_again() -> None:
    w = replace(AGENT, failure_rate=0.3)
    stats = _agent(simulate(w, replace(FLEET, max_attempts=10)))
    lost = [t for t in stats.turns if t.lost]
    assert lost
    for t in lost:
        assert t.billed == t.drawn
        assert w.turn_fails(w.index_of(t.unit_id), t.attempt, t.turn)
        # the next attempt calls the same turn again, unless the cap stopped the unit
        again = [
            u
            for u in stats.turns
            if (u.unit_id, u.turn, u.attempt) == (t.unit_id, t.turn, t.attempt + 1)
        ]
        assert len(again) <= 1
    retried = sum(
        1
        for t in lost
        if any(
            (u.unit_id, u.turn) == (t.unit_id, t.turn) and u.attempt > t.attempt
            for u in stats.turns
        )
    )
    assert retried > 0
    # no (unit, attempt, turn) is billed twice
    keys = Counter((t.unit_id, t.attempt, t.turn) for t in stats.turns)
    assert max(keys.values()) == 1


def test_a_turn_that_cannot_fit_the_cap_is_not_called() -> None:
    # every unit starts from a 3,000-token prompt: 6 turns of it need more than 8,000-16,000
    t = TurnModel(turns_min=6, turns_max=6, prompt_tokens=3_000)
    w = Workload(units=30, failure_rate=0.0, turns=t)
    result = simulate(w, FLEET)
    stats = _agent(result)
    assert result.run.state is RunState.COMPLETED
    assert stats.limit_tokens == 30  # none can make all six turns
    made = Counter(turn.unit_id for turn in stats.turns)
    for index in range(w.units):
        plan, cap = w.turn_plan(index), w.tokens(index)
        n = made[w.unit_id(index)]
        billed = sum(turn.billed for turn in plan[:n])
        assert n < 6 and billed == w.appetite(index)
        assert billed + plan[n].draw > cap  # the next turn would have broken the cap
        assert billed <= cap
    assert result.run.spent == stats.billed


def test_a_turn_the_bounded_hold_cannot_cover_goes_back_to_the_lane() -> None:
    # 475 tokens/s: the large unit's turns (some 18,000 tokens) wait longer than a 5 s hold,
    # the small one's (some 1,000) do not
    fleet = FleetConfig(workers=1, quota_tpm=30_000, budget=10**9)
    turns = TurnModel(3, 3, hold_seconds=5)
    w = Workload.from_sizes([60_000, 3_000], failure_rate=0.0, turns=turns)
    stats = _agent(simulate(w, fleet))
    assert stats.requeues > 0
    # the large unit is fanned out first; its worker was freed while it waited in the lane,
    # so the one worker ran the small unit's turns first
    assert stats.turns[0].unit_id == "unit-00001"
    # a hold long enough for every wait never sends a unit back: the worker waits instead
    patient = replace(w, turns=replace(w.turns, hold_seconds=10_000))
    waited = _agent(simulate(patient, fleet))
    assert waited.requeues == 0 and waited.held_waiting_s > 0
    assert [t.unit_id for t in waited.turns] == ["unit-00000"] * 3 + ["unit-00001"] * 3


def test_tool_time_holds_workers_and_raises_n_star() -> None:
    base = Workload(units=40, turns=TurnModel(4, 4, tool_seconds=0))
    slow = replace(base, turns=replace(base.turns, tool_seconds=60))
    fleet = FleetConfig()
    assert crossover_workers(slow, fleet) > crossover_workers(base, fleet)
    assert slow.held_s(0) == base.held_s(0) + 3 * 60
    assert (
        simulate(slow, replace(fleet, workers=5)).elapsed
        > simulate(base, replace(fleet, workers=5)).elapsed
    )


def test_a_cap_too_small_for_its_turns_is_a_clear_error() -> None:
    w = Workload(units=10, turns=TurnModel(12, 12))
    with pytest.raises(InvalidInput) as e:
        simulate(w, FleetConfig())
    assert e.value.field == "turns"
    assert "cannot hold 12 turns" in e.value.message and "--prompt-tokens" in e.value.message


def test_the_schedule_still_orders_the_fan_out() -> None:
    stats = _agent(simulate(AGENT, replace(FLEET, workers=1, schedule=Schedule.BOOK)))
    first = [t.unit_id for t in stats.turns if t.turn == 0 and t.attempt == 0]
    assert first[0] == "unit-00000"
    stats = _agent(simulate(AGENT, replace(FLEET, workers=1)))
    largest = max(range(AGENT.units), key=lambda i: (AGENT.tokens(i), -i))
    assert stats.turns[0].unit_id == AGENT.unit_id(largest)


@settings(max_examples=25, deadline=None)
@given(
    units=st.integers(1, 12),
    turns=st.tuples(st.integers(1, 4), st.integers(0, 2)),
    prompt=st.one_of(st.none(), st.integers(100, 6_000)),
    workers=st.integers(1, 8),
    failure=st.sampled_from([0.0, 0.1, 0.4]),
    hold=st.integers(0, 30),
    tool_s=st.integers(0, 20),
    budget=st.integers(20_000, 400_000),
    seed=st.integers(0, 1_000),
)
def test_property_books_exact_and_caps_hold(
    units: int,
    turns: tuple[int, int],
    workers: int,
    failure: float,
    hold: int,
    tool_s: int,
    budget: int,
    seed: int,
    prompt: int | None,
) -> None:
    low, extra = turns
    model = TurnModel(
        low, low + extra, tool_seconds=tool_s, hold_seconds=hold, prompt_tokens=prompt
    )
    w = Workload(units=units, failure_rate=failure, seed=seed, turns=model)
    fleet = FleetConfig(workers=workers, quota_tpm=60_000, budget=budget)
    result = simulate(w, fleet)
    assert result.run.state.closed
    run = result.run
    assert run.completed + run.dead_lettered + run.remainder == units
    if result.agent is None:
        return
    assert run.spent == result.agent.billed
    spent: defaultdict[str, int] = defaultdict(int)
    for t in result.agent.turns:
        spent[t.unit_id] += t.billed
    for index in range(units):
        assert spent[w.unit_id(index)] <= w.tokens(index)


def test_cli_run_with_turns(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["sim", "run", "--units", "40", "--quota-tpm", "120000", "--turns", "3-6"]
    code, out, _ = run_cli([*args, "--json"], capsys)
    doc = json.loads(out)
    assert code == 0 and doc["state"] == "completed" and doc["floor"] is None
    agent = doc["agent"]
    assert agent["turns_per_unit"]["min"] >= 3 and agent["model_turns"] > 40 * 3
    assert agent["billed_by_turns"] == doc["spent"]
    code, out, _ = run_cli(args, capsys)
    lines = out.splitlines()
    assert lines[0].startswith("run.completed: completed 40/40")
    assert lines[1].startswith(f"model turns {agent['model_turns']:,} (")
    assert "turns/min" in lines[1] and "tokens per turn" in lines[1]
    code, out, _ = run_cli(["sim", "run", "--turns", "1", "--json"], capsys)
    one = json.loads(out)
    assert one["agent"] is None and one["spent"] == 4_905_337


def test_cli_refuses_bad_turns(capsys: pytest.CaptureFixture[str]) -> None:
    for bad in ("0", "6-4", "3-x", "101"):
        code, _, err = run_cli(["sim", "run", "--turns", bad], capsys)
        assert code == 2 and "argument --turns" in err
    code, _, err = run_cli(["sim", "run", "--turns", "12"], capsys)
    assert code != 0 and "cannot hold 12 turns" in err
    code, _, err = run_cli(["sim", "run", "--turns", "4", "--state", "x.json"], capsys)
    assert code != 0 and "not simulated for agent units" in err


def test_plan_sizes_a_fleet_of_agent_units(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["plan", "--units", "60", "--seeds", "2", "--json"]
    code, out, _ = run_cli([*base, "--turns", "4", "--tool-seconds", "0"], capsys)
    released = json.loads(out)
    code, out, _ = run_cli([*base, "--turns", "4", "--tool-seconds", "30"], capsys)
    held = json.loads(out)
    assert code == 0 and held["turns"]["min"] == 4 and held["turns"]["tool_seconds"] == 30
    # the worker held across 3 tool calls of 30 s: 90 s more per unit, the same tokens
    assert held["profile"]["mean_seconds"] == released["profile"]["mean_seconds"] + 90
    assert held["n_star"] > released["n_star"]
    assert held["expected"]["agent"]["model_turns"] >= 60 * 4
    code, out, _ = run_cli(["plan", "--units", "60", "--seeds", "2", "--json"], capsys)
    assert json.loads(out)["turns"] is None
