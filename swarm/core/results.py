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

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

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

    def as_doc(self) -> dict[str, Any]:
        return asdict(self)

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
    """Where an attempt's outcome is kept: under the run's own prefix."""
    return f"results/{run_id}/attempts/{unit_id}/{attempt:05d}.json"


def results_file_key(run_id: str, name: str) -> str:
    return f"results/{run_id}/{name}"


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
    if unit.state is UnitState.COMPLETED and outcome.succeeded:
        doc["output"] = outcome.output
    elif outcome.succeeded:  # the ledger settled this attempt as lost: its answer is not kept
        doc["error"] = LOST
    else:
        doc["error"] = outcome.error or "failed"
    return doc
