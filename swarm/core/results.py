"""What a unit produced: each settled attempt's outcome, as the results store keeps it.

The worker records an attempt's outcome (the model's answer or its error, and what the provider
counted) *before* it settles the attempt in the ledger, and the store keeps the first record of an
attempt and refuses any other (write-once). So:

* a completed unit has exactly one output: its last settled attempt is the one that succeeded
  (the ledger ends a unit at its first success), and that attempt's record was written by the
  worker that held its claim, before the settlement that completed the unit;
* a duplicate delivery, or a worker that outlived its lease and finishes an attempt the ledger
  already settled as lost, cannot change it: the attempt it would write is either already
  recorded (refused) or not the unit's completing attempt (never read as its output);
* resuming an exhausted run never touches a completed unit.

What a unit's outcome *is* comes from the ledger (its state, attempts, tokens) joined with the
record of its last attempt (:func:`unit_result`): a record the ledger does not back (an attempt
settled as lost whose worker still wrote its answer) is never shown as the unit's output.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from swarm.core.pricing import usd
from swarm.core.records import UnitRecord, UnitState

if TYPE_CHECKING:  # ports imports this module
    from swarm.core.ports import ModelResult

#: an answer longer than this (UTF-8 bytes) is not inlined in a results page: the page links to
#: it instead (a Lambda response is at most 6 MB); the stored record is never cut
MAX_INLINE_OUTPUT_BYTES = 1_048_576


@dataclass(frozen=True)
class AttemptOutcome:
    """One attempt's outcome as the model plane reported it."""

    run_id: str
    unit_id: str
    attempt: int
    succeeded: bool
    tokens: int  # billed, input + output
    output: str = ""
    error: str = ""
    stop_reason: str = ""
    input_tokens: int = 0
    output_tokens: int = 0
    model_id: str = ""
    recorded_at: float = 0.0
    #: an agent unit's loop: turns, tool calls and errors, usage by kind, the stop's reason and
    #: detail (swarm.service.agent_loop.agent_summary); None for a single model call
    agent: dict[str, Any] | None = None

    def as_doc(self) -> dict[str, Any]:
        doc = asdict(self)
        if self.agent is None:
            del doc["agent"]
        return doc

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> AttemptOutcome:
        return cls(
            run_id=str(doc["run_id"]),
            unit_id=str(doc["unit_id"]),
            attempt=int(doc["attempt"]),
            succeeded=bool(doc["succeeded"]),
            tokens=int(doc["tokens"]),
            output=str(doc.get("output", "")),
            error=str(doc.get("error", "")),
            stop_reason=str(doc.get("stop_reason", "")),
            input_tokens=int(doc.get("input_tokens", 0)),
            output_tokens=int(doc.get("output_tokens", 0)),
            model_id=str(doc.get("model_id", "")),
            recorded_at=float(doc.get("recorded_at", 0.0)),
            agent=dict(doc["agent"]) if isinstance(doc.get("agent"), dict) else None,
        )


def outcome_of(
    run_id: str, unit_id: str, attempt: int, result: ModelResult, now: float
) -> AttemptOutcome:
    """The record of an attempt the model plane answered."""
    return AttemptOutcome(
        run_id=run_id,
        unit_id=unit_id,
        attempt=attempt,
        succeeded=result.succeeded,
        tokens=result.tokens,
        output=result.output if result.succeeded else "",
        error="" if result.succeeded else (result.error or "failed"),
        stop_reason=result.stop_reason,
        input_tokens=result.input_tokens,
        output_tokens=result.output_tokens,
        model_id=result.model_id,
        recorded_at=now,
    )


def attempt_key(run_id: str, unit_id: str, attempt: int) -> str:
    """Where an attempt's outcome is kept alone: under the run's own prefix."""
    return f"results/{run_id}/attempts/{unit_id}/{attempt:05d}.json"


def page_key(run_id: str, page_id: str) -> str:
    """Where a page of a run's outcomes is kept: beside the attempts' own records, one level up
    (a unit id holds no ``/``, so a page's key is never an attempt's)."""
    return f"results/{run_id}/attempts/{page_id}.json"


#: an outcome whose output is longer than this is kept alone, not in a page: a results page
#: links to it (MAX_INLINE_OUTPUT_BYTES), and the link must read exactly that outcome
MAX_PAGED_OUTPUT_BYTES = MAX_INLINE_OUTPUT_BYTES


def page_doc(outcomes: Sequence[AttemptOutcome]) -> dict[str, Any]:
    return {"outcomes": [o.as_doc() for o in outcomes]}


def find_outcomes(
    run_id: str,
    attempts: Sequence[tuple[str, int, str | None]],
    read_many: Callable[[Sequence[str]], Mapping[str, Any]],
) -> list[AttemptOutcome | None]:
    """The outcomes of ``(unit id, attempt, key)`` (None key: the attempt's own), each object
    read once by ``read_many`` (key -> its JSON, None when missing): a page holds many
    attempts' outcomes, a record one."""
    keys = [key or attempt_key(run_id, unit_id, n) for unit_id, n, key in attempts]
    docs = read_many(sorted(set(keys)))
    found: list[AttemptOutcome | None] = []
    for (unit_id, n, _), key in zip(attempts, keys, strict=True):
        doc = docs.get(key)
        entries = doc["outcomes"] if isinstance(doc, dict) and "outcomes" in doc else [doc]
        match = next(
            (
                AttemptOutcome.from_doc(e)
                for e in entries
                if isinstance(e, dict) and e.get("unit_id") == unit_id and e.get("attempt") == n
            ),
            None,
        )
        found.append(match)
    return found


def results_file_key(run_id: str, name: str) -> str:
    return f"results/{run_id}/{name}"


#: a results file's lines: ``(unit id, line)`` for the units after the given unit id (None: from
#: the first), in unit id order
FileLines = Callable[[str | None], Iterable[tuple[str, bytes]]]


def always() -> bool:
    return True


def write_in_parts(
    lines: Iterable[tuple[str, bytes]],
    part_bytes: int,
    put_part: Callable[[bytes, str], None],
    keep_going: Callable[[], bool] = always,
) -> bytes | None:
    """Cut ``lines`` into parts of at least ``part_bytes``, each handed to ``put_part(part,
    the unit id of its last line)``; returns the tail (the last part, shorter, maybe empty)
    once the lines end, or None when ``keep_going()`` turned False after at least one part:
    the lines after that part's last unit are not kept (a later call starts after it). At
    least one part is kept per call, so a call always makes progress."""
    buffer = bytearray()
    parts = 0
    for unit_id, line in lines:
        if parts and not keep_going():
            return None
        buffer += line
        if len(buffer) >= part_bytes:
            put_part(bytes(buffer), unit_id)
            parts += 1
            buffer = bytearray()
    return bytes(buffer)


def last_attempt(unit: UnitRecord) -> int | None:
    """The unit's last settled attempt (attempts are numbered from 0), None before the first."""
    return unit.attempts - 1 if unit.attempts > 0 else None


LOST = "lost: the attempt's worker stopped before it finished (settled at its reservation)"


def unit_result(unit: UnitRecord, outcome: AttemptOutcome | None) -> dict[str, Any]:
    """A unit's outcome for a results page or file: the ledger's state, attempts and tokens, and
    the record of its last settled attempt (the output only if the unit completed)."""
    doc: dict[str, Any] = {
        "unit_id": unit.unit_id,
        "state": unit.state.value,
        "attempts": unit.attempts,
        "tokens": unit.spent,
    }
    if unit.spent_micro:  # its attempts were priced (docs/explanation/ledger.md, "Money")
        doc["usd"] = usd(unit.spent_micro)
    attempt = last_attempt(unit)
    if attempt is None:
        return doc
    doc["attempt"] = attempt
    if outcome is None or outcome.attempt != attempt:
        doc["error"] = LOST
        return doc
    doc.update(
        model_id=outcome.model_id,
        stop_reason=outcome.stop_reason,
        input_tokens=outcome.input_tokens,
        output_tokens=outcome.output_tokens,
    )
    if outcome.agent is not None:  # the transcript itself: GET .../units/{unit}/transcript
        doc["agent"] = outcome.agent
    if unit.state is UnitState.COMPLETED and outcome.succeeded:
        doc["output"] = outcome.output
    elif outcome.succeeded:  # the ledger settled this attempt as lost: its answer is not kept
        doc["error"] = LOST
    else:
        doc["error"] = outcome.error or "failed"
    return doc
