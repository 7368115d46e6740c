"""The manifest is written in chunks: one Distributed Map item (one child execution, one fan-out
invocation) admits and enqueues up to ``fanout.units_per_child`` units, each child's input
within 256 KiB to the byte, in the scheduling policy's order across chunks."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any

import pytest

from swarm.api.models import MAX_MAP_ITEM_BYTES
from swarm.core.errors import InvalidInput
from swarm.core.governor import Draw, Ticket
from swarm.core.memory import InMemoryLedger, MemoryQueue
from swarm.core.ports import sqs_seconds
from swarm.core.records import Lane, RunSpec, UnitSpec, UnitState
from swarm.service.batches import (
    SubmitRequest,
    UnitInput,
    check_fits_the_fan_out,
    child_input_bytes,
    chunk_units,
    manifest_items,
    manifest_key,
    manifest_unit,
    manifest_units,
    map_child_input,
)
from swarm.service.fanout import FanOut
from tests.unit.test_service_flow import Plane

NOW = 1_000.0


def _full_bytes(run_id: str, index: int, chunk: dict[str, Any]) -> int:
    """The child's input as Step Functions measures it: its whole JSON in UTF-8."""
    child = map_child_input(run_id, index, chunk)
    return len(json.dumps(child, separators=(",", ":"), ensure_ascii=False).encode())


def _units(n: int, text: str = "x") -> list[dict[str, Any]]:
    return [manifest_unit(f"u{i:04d}", f"{text}{i}") for i in range(n)]


# ------------------------------------------------------------------ the chunker


def test_chunks_hold_at_most_units_per_child_in_order() -> None:
    units = _units(250)
    chunks = chunk_units("b-1", units, 100)
    assert [len(c["units"]) for c in chunks] == [100, 100, 50]
    assert all(c["run_id"] == "b-1" for c in chunks)
    assert manifest_units(chunks) == units  # every unit once, in order


def test_one_unit_per_child_is_the_old_fan_out() -> None:
    chunks = chunk_units("b-1", _units(3), 1)
    assert [[u["unit_id"] for u in c["units"]] for c in chunks] == [["u0000"], ["u0001"], ["u0002"]]
    with pytest.raises(InvalidInput):
        chunk_units("b-1", _units(3), 0)


def test_the_measure_is_the_childs_whole_json_to_the_byte() -> None:
    # non-ASCII inputs (2-4 bytes each), a request, several chunk indexes of different widths
    units = [manifest_unit(f"u{i}", "漢字" * i + "é" * (i % 7)) for i in range(40)]
    units.append(manifest_unit("req", {"messages": [{"role": "user", "content": [{"text": "ü"}]}]}))
    for index, chunk in enumerate(chunk_units("b-1", units, 7)):
        assert child_input_bytes("b-1", index, chunk) == _full_bytes("b-1", index, chunk)


def test_the_byte_bound_is_exact_at_the_limit() -> None:
    # Given two units whose chunk of both is exactly 256 KiB as the child carries it
    run_id = "b-edge"
    empty = _full_bytes(
        run_id, 0, {"run_id": run_id, "units": [manifest_unit("a", ""), manifest_unit("b", "")]}
    )
    room = MAX_MAP_ITEM_BYTES - empty
    fill = [manifest_unit("a", "x" * (room // 2)), manifest_unit("b", "x" * (room - room // 2))]
    assert _full_bytes(run_id, 0, {"run_id": run_id, "units": fill}) == MAX_MAP_ITEM_BYTES
    # Then they share one chunk (the limit is inclusive, as Step Functions' is)
    (chunk,) = chunk_units(run_id, fill, 100)
    assert len(chunk["units"]) == 2
    # and one byte more splits them, each child under the limit
    over = [fill[0], manifest_unit("b", "x" * (room - room // 2 + 1))]
    chunks = chunk_units(run_id, over, 100)
    assert [len(c["units"]) for c in chunks] == [1, 1]
    assert all(_full_bytes(run_id, i, c) <= MAX_MAP_ITEM_BYTES for i, c in enumerate(chunks))


def test_every_chunk_fits_whatever_the_inputs() -> None:
    # units of ~40 KB of 3-byte characters: six fit a child, never seven
    units = [manifest_unit(f"u{i}", "漢" * 13_000 + str(i)) for i in range(20)]
    chunks = chunk_units("b-1", units, 100)
    sizes = [_full_bytes("b-1", i, c) for i, c in enumerate(chunks)]
    assert all(size <= MAX_MAP_ITEM_BYTES for size in sizes)
    assert [len(c["units"]) for c in chunks] == [6, 6, 6, 2]
    # greedy: the next unit would not have fitted a full chunk
    for i, c in enumerate(chunks[:-1]):
        grown = {**c, "units": [*c["units"], chunks[i + 1]["units"][0]]}
        assert _full_bytes("b-1", i, grown) > MAX_MAP_ITEM_BYTES
    assert manifest_units(chunks) == units


def test_a_unit_that_cannot_fit_alone_is_refused_naming_it() -> None:
    run_id = "b-1"
    units = _units(3)
    alone = _full_bytes(run_id, 2, {"run_id": run_id, "units": [manifest_unit("u0001", "")]})
    units[1] = manifest_unit("u0001", "x" * (MAX_MAP_ITEM_BYTES - alone + 1))
    with pytest.raises(InvalidInput, match="'u0001' is 262,145 bytes") as refused:
        check_fits_the_fan_out(run_id, units)
    assert refused.value.field == "units[1].input"
    # at exactly the limit (measured at the last index a chunk could have) it is accepted
    units[1] = manifest_unit("u0001", "x" * (MAX_MAP_ITEM_BYTES - alone))
    check_fits_the_fan_out(run_id, units)
    assert len(chunk_units(run_id, units, 100)) == 3  # alone in its chunk


def test_the_manifest_keeps_the_fan_out_order_across_chunks() -> None:
    spec = RunSpec(
        "b-1",
        "acme",
        Lane.NORMAL,
        10**9,
        tuple(UnitSpec(f"u{i:02d}", 1_000 + (i * 37) % 11) for i in range(25)),
    )
    chunks = manifest_items(spec, {f"u{i:02d}": f"in {i}" for i in range(25)}, 4)
    assert [len(c["units"]) for c in chunks] == [4, 4, 4, 4, 4, 4, 1]
    tokens = {u.unit_id: u.projected_tokens for u in spec.units}
    order = [u["unit_id"] for u in manifest_units(chunks)]
    # largest first across the chunks, equal sizes in submission order (a stable sort)
    assert order == sorted(tokens, key=lambda unit_id: -tokens[unit_id])
    # only what the fan-out needs: the ledger has the tenant, lane and projection
    assert all(set(u) == {"unit_id", "input"} for u in manifest_units(chunks))


def test_a_manifest_from_before_chunks_is_read_unit_by_unit() -> None:
    old = [{"run_id": "b-1", "unit_id": "u1", "tenant": "acme", "lane": "low", "input": "a"}]
    assert manifest_units(old) == old
    assert manifest_units([*old, {"run_id": "b-1", "units": [{"unit_id": "u2"}]}]) == [
        *old,
        {"unit_id": "u2"},
    ]


# ------------------------------------------------------------------ the fan-out of a chunk


def _open(units: int, budget: int = 10**9) -> tuple[InMemoryLedger, RunSpec]:
    ledger = InMemoryLedger()
    spec = RunSpec(
        "b-1", "acme", Lane.LOW, budget, tuple(UnitSpec(f"u{i}", 1_000) for i in range(units))
    )
    ledger.open_run(spec, NOW)
    return ledger, spec


def test_a_chunk_is_admitted_and_sent_in_one_batch() -> None:
    ledger, spec = _open(5)
    queue = MemoryQueue()
    (chunk,) = manifest_items(spec, {u.unit_id: f"p {u.unit_id}" for u in spec.units}, 100)
    result = FanOut(ledger, queue, 600).admit_and_enqueue_chunk(chunk, NOW, "b-1")
    assert result["counts"] == {"enqueued": 5}
    assert result["units"] == [
        {"unit_id": f"u{i}", "outcome": "enqueued", "attempt": 0} for i in range(5)
    ]
    assert queue.batches == [5]  # one send_many for the chunk
    assert [(q.unit_id, q.input, q.lane, q.tenant) for q in queue.sent] == [
        (f"u{i}", f"p u{i}", Lane.LOW, "acme") for i in range(5)
    ]
    assert ledger.run("b-1").reserved == 5_000
    # a retry of the whole chunk (Step Functions) admits nothing twice
    again = FanOut(ledger, queue, 600).admit_and_enqueue_chunk(chunk, NOW, "b-1")
    assert again["counts"] == {"enqueued": 5}
    assert ledger.run("b-1").reserved == 5_000


def test_a_chunk_past_the_budget_admits_what_fits_and_names_the_remainder() -> None:
    ledger, spec = _open(5, budget=3_000)
    queue = MemoryQueue()
    (chunk,) = manifest_items(spec, {}, 100)
    result = FanOut(ledger, queue, 600).admit_and_enqueue_chunk(chunk, NOW, "b-1")
    assert result["counts"] == {"enqueued": 3, "remainder": 2}
    assert [(u["unit_id"], u.get("reason")) for u in result["units"][3:]] == [
        ("u3", "budget"),
        ("u4", "exhausting"),
    ]
    assert [q.unit_id for q in queue.sent] == ["u0", "u1", "u2"]


def test_a_malformed_or_foreign_chunk_writes_nothing() -> None:
    ledger, spec = _open(3)
    queue = MemoryQueue()
    fanout = FanOut(ledger, queue, 600)
    (chunk,) = manifest_items(spec, {}, 100)
    with pytest.raises(InvalidInput, match="in the execution of batch 'b-other'"):
        fanout.admit_and_enqueue_chunk(chunk, NOW, "b-other")
    broken = {**chunk, "units": [*chunk["units"][:2], {"input": "no id"}]}
    with pytest.raises(InvalidInput, match=r"chunk\.units\[2\]\.unit_id: missing"):
        fanout.admit_and_enqueue_chunk(broken, NOW, "b-1")
    assert queue.sent == [] and ledger.run("b-1").reserved == 0


@dataclass
class FlakyLedger:
    """The in-memory ledger, whose admission of some units fails (a DynamoDB error) once, and
    whose batched admission of a batch holding one fails."""

    inner: InMemoryLedger
    failing: set[str]
    failed: list[str] = field(default_factory=list)
    batches: int = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def admit_many(self, run_id: str, unit_ids: Any, *args: Any, **kw: Any) -> Any:
        self.batches += 1
        if self.failing & set(unit_ids):
            raise RuntimeError("TransactionConflict")
        return self.inner.admit_many(run_id, unit_ids, *args, **kw)

    def admit(self, run_id: str, unit_id: str, *args: Any, **kw: Any) -> Any:
        if unit_id in self.failing:
            self.failing.discard(unit_id)
            self.failed.append(unit_id)
            raise RuntimeError(f"ProvisionedThroughputExceeded ({unit_id})")
        return self.inner.admit(run_id, unit_id, *args, **kw)


def test_a_unit_that_fails_does_not_lose_the_others_and_the_retry_finishes_the_chunk() -> None:
    inner, spec = _open(6)
    ledger = FlakyLedger(inner, {"u2"})
    queue = MemoryQueue()
    fanout = FanOut(ledger, queue, 600)  # type: ignore[arg-type]
    (chunk,) = manifest_items(spec, {}, 100)
    # When the batched admission fails, then u2's own admission, the chunk fails (Step
    # Functions retries it) ...
    with pytest.raises(RuntimeError, match="u2"):
        fanout.admit_and_enqueue_chunk(chunk, NOW, "b-1")
    assert ledger.batches == 1 and ledger.failed == ["u2"]
    # ... after the five others were admitted and sent
    assert sorted(q.unit_id for q in queue.sent) == ["u0", "u1", "u3", "u4", "u5"]
    assert inner.unit("b-1", "u2").state is UnitState.PENDING
    # and the retry admits u2; the others are admitted again idempotently (sent again: the
    # worker's claim absorbs the duplicates), nothing is reserved twice
    result = fanout.admit_and_enqueue_chunk(chunk, NOW, "b-1")
    assert result["counts"] == {"enqueued": 6}
    assert ledger.batches == 2  # the retry's batched admission went through
    assert inner.run("b-1").reserved == 6_000
    assert all(u.state is UnitState.IN_FLIGHT for u in inner.units("b-1"))


def test_the_service_fans_a_batch_out_one_chunk_per_map_item() -> None:
    plane = Plane()
    plane.batches.config = replace(plane.batches.config, units_per_child=10)
    units = [UnitInput(f"u{i:02d}", 1_000 + i, f"in {i}") for i in range(23)]
    request = SubmitRequest(lane=Lane.NORMAL, budget=10**8, max_attempts=3, units=units)
    run = plane.batches.submit("acme", request, None, plane.clock.now()).run
    manifest = plane.blobs.get_json(manifest_key(run.run_id))
    assert [len(c["units"]) for c in manifest] == [10, 10, 3]
    plane.fan_out()
    assert plane.queue.batches == [10, 10, 3]
    assert [q.unit_id for q in plane.queue.sent] == [f"u{i:02d}" for i in reversed(range(23))]


@dataclass
class Booker:
    """Places as a governor would book them: unit i's ready ``i * spacing_s`` from now, the
    ones from ``horizon`` on without a place; or a booking that fails."""

    spacing_s: float = 0.75
    horizon: int = 100
    fail: bool = False
    calls: list[tuple[list[int], Lane, str]] = field(default_factory=list)

    def book_places(
        self, amounts: Sequence[int], lane: Lane, tenant: str, now: float
    ) -> list[Draw]:
        self.calls.append((list(amounts), lane, tenant))
        if self.fail:
            raise RuntimeError("throttled")
        draws = []
        for i, amount in enumerate(amounts):
            wait = i * self.spacing_s
            ticket = None
            if i < self.horizon:
                ticket = Ticket(
                    "g", 0, amount, lane, now + wait, Decimal(i), Decimal(0), now, slot=True
                )
            draws.append(Draw(False, wait, 0.0, ticket=ticket))
        return draws


def _fan_out_with(booker: Booker, n: int = 6) -> Plane:
    plane = Plane()
    plane.fanout = replace(plane.fanout, places=booker, hold_s=1.0, clock=plane.clock.now)
    units = [UnitInput(f"u{i:02d}", 1_000 + i, f"in {i}") for i in range(n)]
    request = SubmitRequest(lane=Lane.LOW, budget=10**8, max_attempts=3, units=units)
    plane.batches.submit("acme", request, None, plane.clock.now())
    plane.fan_out()
    return plane


def test_each_unit_goes_with_its_place_delayed_until_it_is_ready() -> None:
    booker = Booker(horizon=4)
    plane = _fan_out_with(booker)
    # one booking for the chunk: its tenant, its lane, its units' tokens in the order sent
    sent = plane.queue.sent
    assert booker.calls == [([q.tokens for q in sent], Lane.LOW, "acme")]
    # each with its place, bound to its attempt; none past the horizon
    assert [q.ticket is not None for q in sent] == [True] * 4 + [False] * 2
    assert all(q.ticket.tag == str(q.attempt) for q in sent if q.ticket is not None)
    # ready within the second the worker holds on: at once; later: when it is ready (SQS rounds
    # that up to its whole seconds)
    assert [q.unit_id for q in plane.queue.lanes[Lane.LOW]] == [q.unit_id for q in sent[:2]]
    delayed = [(delay, q.unit_id) for delay, q in plane.queue.delayed]
    # 1.5 s, 2.25 s; then past the horizon, when their tokens would be there: 3.0 s, 3.75 s
    assert delayed == [
        (1.5, sent[2].unit_id),
        (2.25, sent[3].unit_id),
        (3.0, sent[4].unit_id),
        (3.75, sent[5].unit_id),
    ]
    assert [sqs_seconds(delay) for delay, _ in delayed] == [2, 3, 3, 4]


def test_a_failed_booking_sends_the_units_at_once() -> None:
    plane = _fan_out_with(Booker(fail=True))
    assert not plane.queue.delayed and all(q.ticket is None for q in plane.queue.sent)
    assert len(plane.queue.lanes[Lane.LOW]) == 6
    assert all(
        u.state is UnitState.IN_FLIGHT for u in plane.ledger.units(plane.queue.sent[0].run_id)
    )
