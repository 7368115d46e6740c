"""BFCL's 200 multi_turn_base entries as agent units through the in-memory loop, with workers
killed at every point of a turn and stale duplicates on top: every unit's final backend state
equals the state its ground truth produces when BFCL executes it directly (BFCL's own
state_checker), no turn is billed twice, and the books are exact. And the oracle can fail: a
tool run twice or lost is seen.

All 200 entries take about 3 seconds here, so the whole set runs in the unit tier. Never skipped:
`make setup` installs bfcl-eval (requirements-nodeps.txt), so a missing install fails here."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest
from jsonschema import Draft202012Validator  # type: ignore[import-untyped]

from swarm.core import agent
from swarm.core.agent import ToolCall
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
from swarm.core.errors import InvalidInput
from swarm.workloads import bfcl

POINTS = list(KillPoint)
JSON_TYPES = {"object", "array", "string", "number", "integer", "boolean", "null"}


def types_in(schema: Any) -> list[str]:
    """Every "type" a schema names, nested ones too."""
    if isinstance(schema, dict):
        found = [schema["type"]] if isinstance(schema.get("type"), str) else []
        return found + [t for v in schema.values() for t in types_in(v)]
    if isinstance(schema, list):
        return [t for v in schema for t in types_in(v)]
    return []


@dataclass
class Plan:
    """Two kills per unit, at points and turns that rotate with the unit's index, each once;
    while tools run, after the first tool of the turn for even units, the second for odd ones
    (when the turn has a second)."""

    index: int
    fired: Counter[KillPoint] = field(default_factory=Counter)
    seen: Counter[int] = field(default_factory=Counter)  # tools run per turn, while planned

    def __post_init__(self) -> None:
        i = self.index
        self.left = {(POINTS[i % 5], 1 + i % 3), (POINTS[(i + 2) % 5], 2 + i % 4)}

    def __call__(self, point: KillPoint, turn: int) -> bool:
        if (point, turn) not in self.left:
            return False
        if point is KillPoint.WHILE_TOOLS:
            self.seen[turn] += 1
            if self.seen[turn] < 1 + self.index % 2:
                return False
        self.left.discard((point, turn))
        self.fired[point] += 1
        return True


def test_every_entry_becomes_a_unit_with_converse_tools() -> None:
    entries = bfcl.entries()
    assert len(entries) == 200
    for entry in entries:
        spec = bfcl.unit_spec(entry, "b1")
        assert len(spec.follow_ups) == len(entry.user_turns) - 1
        assert not set(entry.excluded) & {t.name for t in spec.tools}
        for tool in spec.tools:  # JSON Schema a validator accepts, with JSON Schema's types
            Draft202012Validator.check_schema(tool.input_schema)
            assert set(types_in(tool.input_schema)) <= JSON_TYPES, tool.name
    with pytest.raises(InvalidInput, match="'multi_turn_long' is not served"):
        bfcl.entries("multi_turn_long")


def test_all_200_entries_survive_kills_at_every_point_with_exact_books() -> None:
    store, books, journals = MemoryLogStore(), MemoryTurnBooks(), bfcl.MemoryJournals()
    fired: Counter[KillPoint] = Counter()
    began = time.perf_counter()
    runs = []
    for index, entry in enumerate(bfcl.entries()):
        plan = Plan(index)
        run = bfcl.run_in_memory(entry, "b1", store, books, journals, VirtualClock(), plan)
        fired += plan.fired
        runs.append((run, plan))
    took = time.perf_counter() - began
    print(f"\n200 BFCL units, {sum(fired.values())} kills: {took:.1f} s")  # measured, not asserted

    assert [r.verdict for r, _ in runs] == [{"valid": True}] * 200
    assert Counter(r.end.reason for r, _ in runs) == {"completed": 200}
    # kills at each point of a turn, and stale duplicates, really happened
    assert set(fired) == set(KillPoint) and min(fired.values()) >= 20
    assert sum(r.zombies_refused for r, _ in runs) >= 100
    assert sum(r.tool_repeats for r, _ in runs) >= 20  # tools called again, answered by key
    total = 0
    for run, plan in runs:
        state = agent.read_log(run.log)
        unit = run.spec.unit
        # no turn billed twice: the books hold each of the log's turns once
        assert sorted(t for (_, u, t) in books.billed if u == unit) == [t.n for t in state.turns]
        # exact books: what the model counted for each recorded turn, a lost one at its draw
        lost = [t for t in state.turns if t.message is None]
        recorded = sum(agent.billed_of(t.usage) for t in state.turns if t.message is not None)
        assert (
            books.spent("b1", unit) == agent.spent(run.log) == recorded + sum(t.drawn for t in lost)
        )
        assert all(t.settled is not None and t.settled["lost"] for t in lost)
        assert (
            len(lost)
            == plan.fired[KillPoint.BEFORE_MODEL_CALL] + plan.fired[KillPoint.AFTER_MODEL_CALL]
        )
        # a recorded turn is never called again: one call per recorded turn, plus the calls
        # made and lost
        assert run.model is not None
        assert (
            run.model.calls == len(state.turns) - len(lost) + plan.fired[KillPoint.AFTER_MODEL_CALL]
        )
        # every tool call had its effect once: the journal holds each key once, and it is
        # what the processes ran
        journal = journals.read(unit)
        keys = [done["key"] for done in journal]
        assert len(keys) == len(set(keys)) == run.tool_runs
        results = [e for e in run.log if e["type"] == "tool_result"]
        assert sorted(keys) == sorted(r["key"] for r in results)
        total += agent.spent(run.log)
    assert sum(books.billed.values()) == total


@dataclass
class Careless(bfcl.Backends):
    """A tool function that ignores its idempotency key: a call run again has its effect
    again."""

    def __call__(self, call: ToolCall) -> ToolOutcome:
        fresh = ToolCall(
            call.turn, call.tool_use_id, call.name, call.input, f"{call.key}#{id(self)}"
        )
        return super().__call__(fresh)


@dataclass
class Forgetful(bfcl.Backends):
    """A tool function that loses its first call's effect (and says it succeeded)."""

    def __call__(self, call: ToolCall) -> ToolOutcome:
        if call.tool_use_id == "c0-0":
            return ToolOutcome("success", "ok")
        return super().__call__(call)


@pytest.mark.parametrize(("executor", "kill"), [(Careless, True), (Forgetful, False)])
def test_the_oracle_sees_a_tool_run_twice_or_lost(executor: Any, kill: bool) -> None:
    invalid = 0
    for entry in bfcl.entries():
        spec = bfcl.unit_spec(entry, "b1")
        store, journals = MemoryLogStore(), bfcl.MemoryJournals()
        model = bfcl.ScriptedModel(entry)
        # after the first tool of every turn (each kill once), the worker dies
        kills = {(KillPoint.WHILE_TOOLS, n) for n in range(1, 40)} if kill else set()

        def hook(point: KillPoint, turn: int, kills: set[Any] = kills) -> bool:
            if (point, turn) in kills:
                kills.discard((point, turn))
                return True
            return False

        while True:  # the killed worker, then the next
            tools = executor(entry, spec.unit, journals)
            runner = LoopRunner(spec, store, model, tools, MemoryTurnBooks(), VirtualClock(), hook)
            try:
                runner.run()
                break
            except Killed:
                continue
        assert agent.read_log(store.read(log_key(spec))).stopped is not None
        final = bfcl.Backends(entry, spec.unit, journals).instances()
        invalid += not bfcl.judge(entry, final)["valid"]
    print(f"\n{executor.__name__}: {invalid} of 200 judged wrong")
    assert invalid >= 10, invalid


def test_the_command_prints_the_verdicts_and_refuses_a_bad_limit(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert bfcl.main(["--limit", "3", "--kills"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("3/3 final states equal to BFCL's ground truth;") and " kills, " in out
    with pytest.raises(SystemExit):
        bfcl.main(["--limit", "0"])
    assert "--limit: '0': give a whole number of entries, at least 1" in capsys.readouterr().err


@dataclass
class Racing(bfcl.MemoryJournals):
    """Journals where another process appends first, once, just before this one does."""

    other: Any = None

    def append(self, unit: str, seq: int, entry: dict[str, Any]) -> None:
        if self.other is not None:
            other, self.other = self.other, None
            other()
        super().append(unit, seq, entry)


def test_two_processes_running_one_call_at_once_have_one_effect() -> None:
    entry = bfcl.entries(limit=1)[0]
    spec = bfcl.unit_spec(entry, "b1")
    name, arguments = bfcl.parse_call(entry.ground_truth[0][1], entry)  # mkdir(dir_name='temp')
    call = ToolCall(1, "c0-1", name, arguments, agent.idempotency_key(spec, "c0-1"))
    journals = Racing()
    first, second = (bfcl.Backends(entry, spec.unit, journals) for _ in range(2))
    outcomes: list[ToolOutcome] = []
    journals.other = lambda: outcomes.append(second(call))
    outcomes.append(first(call))  # `second` journals first; `first` then answers its outcome
    assert outcomes[0] == outcomes[1] == ToolOutcome("success", "None")
    assert (first.ran, second.ran, first.repeats) == (0, 1, 1)
    assert [done["key"] for done in journals.read(spec.unit)] == ["b1/multi-turn-base-0/c0-1"]


def test_the_bfcl_toolset_declarations_are_bfcls_function_docs() -> None:
    # the file the stack deploys (functions/tools/bfcl.tools.json) is what bfcl-eval's docs give
    # today: a new bfcl-eval pin must rewrite it (`python -m swarm.workloads.bfcl
    # --write-declarations functions/tools/bfcl.tools.json`)
    from infra.constants import ROOT

    shipped = (ROOT / bfcl.DECLARATIONS_FILE).read_text(encoding="utf-8")
    assert shipped == bfcl.declarations_text()
    declared = bfcl.declarations()
    assert len(declared) == 128 and all(d["effect"] == "write" for d in declared.values())


def test_the_judge_of_a_journal_sees_a_call_run_twice_or_lost() -> None:
    # Given an entry whose unit sends a message (each send adds one), run to its end, and its
    # journal as the stack's table holds it
    effects = {"send_message", "post_tweet", "place_order"}
    entry = next(e for e in bfcl.entries() if any(c.split("(")[0] in effects
                                                  for g in e.ground_truth for c in g))  # fmt: skip
    journals = bfcl.MemoryJournals()
    run = bfcl.run_in_memory(
        entry, "b", MemoryLogStore(), MemoryTurnBooks(), journals, VirtualClock(), zombies=False
    )
    journal = journals.read(run.spec.unit)
    assert run.verdict == {"valid": True}
    assert bfcl.judge_journal(entry, journal) == {"valid": True}
    # Then the same journal with that call lost, or run twice, judges invalid
    at = next(i for i, done in enumerate(journal) if done["name"] in effects)
    assert journal[at]["status"] == "success"
    lost, twice = journal[:at] + journal[at + 1 :], journal[: at + 1] + journal[at:]
    assert bfcl.judge_journal(entry, lost).get("valid") is False
    assert bfcl.judge_journal(entry, twice).get("valid") is False
