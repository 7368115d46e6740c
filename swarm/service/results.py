"""The work's product: reading a run's unit outcomes, and writing its results file at closure.

A unit's outcome is the ledger's record (state, attempts, tokens) joined with the stored record of
its last settled attempt (:func:`swarm.core.results.unit_result`). Pages are read live, so the
partial results of an open, exhausting or exhausted run are readable at any time; the results file
is written by the finalizer when the run closes (one per closure: an exhausted run that is resumed
and closes again gets a new one) and offered as a short-lived download.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from swarm.api.models import (
    MAX_RESULTS_PAGE_BYTES,
    ResultsDownload,
    ResultsPage,
    ResultsQuery,
    Transcript,
    UnitResult,
    response_bytes,
)
from swarm.core import agent
from swarm.core.errors import InvalidInput, NotFound
from swarm.core.ports import Ledger, ResultStore
from swarm.core.records import RunRecord, RunState, UnitRecord, check_id
from swarm.core.results import (
    MAX_INLINE_OUTPUT_BYTES,
    always,
    attempt_key,
    last_attempt,
    results_file_key,
    unit_result,
)

#: units the ledger is asked for at a time while filtering by state (one Query each)
SCAN_PAGE = 1_000
#: units one page may look at while filtering by state: a rare state in a big batch answers in
#: several short requests (each with a next_token) rather than one that times out
SCAN_BUDGET = 20_000
#: a results file reads its units' attempt records in chunks of this many units
FILE_CHUNK = 1_000
#: the default lifetime of a download URL (``results.download_url_seconds`` in cdk.json)
DOWNLOAD_URL_S = 300


def results_file_name(state: RunState, epoch: int) -> str:
    """One file per closure, as the closure's summary (``<state>-<epoch>.json``)."""
    return f"{state.value}-{epoch}.jsonl"


def encode_token(unit_id: str) -> str:
    return base64.urlsafe_b64encode(unit_id.encode()).decode().rstrip("=")


def decode_token(token: str) -> str:
    padded = token + "=" * (-len(token) % 4)
    try:
        unit_id = base64.urlsafe_b64decode(padded.encode("ascii")).decode()
        return check_id("next_token", unit_id)
    except (InvalidInput, UnicodeError, binascii.Error, ValueError):
        raise InvalidInput(
            "next_token", "is not a token this API gave: pass a page's next_token unchanged"
        ) from None


#: the figures of a transcript (swarm.core.agent.summary) its answer carries
AGENT_FIGURES = ("turns", "lost_turns", "refused_turns", "tool_calls", "tool_errors", "usage")


@dataclass
class Results:
    ledger: Ledger
    store: ResultStore
    download_url_s: int = DOWNLOAD_URL_S

    def page(self, run: RunRecord, query: ResultsQuery) -> dict[str, Any]:
        """One page of the run's unit outcomes, in unit id order, filtered by state."""
        after = decode_token(query.next_token) if query.next_token is not None else None
        if run.state is RunState.OPENING:  # no unit has an outcome yet (nor a record, maybe)
            wanted: list[UnitRecord] = []
            after = None
        else:
            wanted, after = self._select(run.run_id, query, after)
        units: list[UnitResult] = []
        size = 0
        for doc in self._docs(run.run_id, wanted):
            line = response_bytes(doc)
            if units and size + line > MAX_RESULTS_PAGE_BYTES:  # continue after the last one
                after = wanted[len(units) - 1].unit_id
                break
            units.append(UnitResult.model_validate(doc))
            size += line
        return ResultsPage(
            batch_id=run.run_id,
            state=run.state,
            units=units,
            next_token=None if after is None else encode_token(after),
            download=self._download(run),
        ).model_dump(mode="json", exclude_none=True)

    def _select(
        self, run_id: str, query: ResultsQuery, after: str | None
    ) -> tuple[list[UnitRecord], str | None]:
        """The page's units, and the unit id the next page starts after (None: no more)."""
        wanted: list[UnitRecord] = []
        scanned = 0
        while scanned < SCAN_BUDGET:
            ask = query.limit - len(wanted) if query.state is None else SCAN_PAGE
            page = self.ledger.units_page(run_id, after, ask)
            scanned += len(page.units)
            for i, unit in enumerate(page.units):
                after = unit.unit_id
                if query.state is None or unit.state is query.state:
                    wanted.append(unit)
                    if len(wanted) == query.limit:
                        last = i == len(page.units) - 1 and page.last is None
                        return wanted, None if last else after
            if page.last is None:
                return wanted, None
        return wanted, after

    def transcript(self, run: RunRecord, unit_id: str, from_turn: int = 1) -> dict[str, Any]:
        """An agent unit's transcript (:func:`swarm.core.agent.transcript`) from model turn
        ``from_turn``, as many turns as fit a response (:data:`MAX_RESULTS_PAGE_BYTES`), with
        ``next_turn`` when there are more: NotFound for a unit without one (not an agent unit,
        or not started yet)."""
        unit = self.ledger.unit(run.run_id, unit_id)  # NotFound for a unit of no such id
        events = self.ledger.read_log(run.run_id, unit.unit_id)
        if not events:
            raise NotFound(
                f"unit {unit_id!r} of batch {run.run_id} has no transcript: it is not an agent "
                "unit, or its first turn has not started yet"
            )
        whole, figures = agent.transcript(events), agent.summary(events)
        doc: dict[str, Any] = {
            "batch_id": run.run_id,
            "unit_id": unit_id,
            "figures": {
                **{k: figures[k] for k in AGENT_FIGURES},
                "stop": (whole["stop"] or {}).get("reason", ""),
                "detail": (whole["stop"] or {}).get("detail", ""),
            },
            "answer": whole["answer"],
            "stop": whole["stop"],
        }
        size = response_bytes(doc)
        kept: list[dict[str, Any]] = []
        for turn in (t for t in whole["turns"] if t["turn"] >= from_turn):
            size += response_bytes(turn) + 1
            if kept and size > MAX_RESULTS_PAGE_BYTES:
                doc["next_turn"] = turn["turn"]
                break
            kept.append(turn)
        doc["turns"] = kept
        return Transcript.model_validate(doc).model_dump(mode="json", exclude_none=True)

    def _docs(self, run_id: str, units: list[UnitRecord]) -> list[dict[str, Any]]:
        docs = self.unit_docs(run_id, units)
        for unit, doc in zip(units, docs, strict=True):
            output = doc.get("output")
            if output is not None and len(output.encode()) > MAX_INLINE_OUTPUT_BYTES:
                attempt = last_attempt(unit)
                assert attempt is not None
                # an output this long is kept alone, never in a page: the link reads it only
                key = unit.outcome_key or attempt_key(run_id, unit.unit_id, attempt)
                doc["output_url"] = self.store.download_url(key, self.download_url_s)
                del doc["output"]
        return docs

    def unit_docs(self, run_id: str, units: list[UnitRecord]) -> list[dict[str, Any]]:
        """Each unit's outcome (:func:`unit_result`), its attempt record read from the store."""
        settled = [(u, last_attempt(u)) for u in units]
        asked = [(u.unit_id, a, u.outcome_key) for u, a in settled if a is not None]
        found = iter(self.store.outcomes(run_id, asked))
        return [unit_result(u, next(found) if a is not None else None) for u, a in settled]

    def _download(self, run: RunRecord) -> ResultsDownload | None:
        if not run.state.closed:
            return None
        key = results_file_key(run.run_id, results_file_name(run.state, run.exhaustions))
        if not self.store.exists(key):
            return None  # the finalizer writes it within a poll of the closure
        return ResultsDownload(
            url=self.store.download_url(key, self.download_url_s),
            expires_in_s=self.download_url_s,
            location=self.store.location(key),
        )

    def write_file(
        self,
        run: RunRecord,
        units: Sequence[UnitRecord],
        keep_going: Callable[[], bool] = always,
    ) -> str | None:
        """The results file of the run's current closure: ``units`` (the finalizer's read of the
        closure, which its summary also holds), one JSON line each in unit id order, their
        attempt records read a chunk at a time; returns its key, or None when ``keep_going()``
        turned False before the file was whole (the next call goes on where this one stopped)."""
        name = results_file_name(run.state, run.exhaustions)
        ordered = sorted(units, key=lambda u: u.unit_id)
        ids = [u.unit_id for u in ordered]

        def lines(after: str | None) -> Iterator[tuple[str, bytes]]:
            start = 0 if after is None else bisect.bisect_right(ids, after)
            return self._lines(run.run_id, ordered[start:])

        return self.store.write_file(run.run_id, name, lines, keep_going)

    def _lines(self, run_id: str, units: list[UnitRecord]) -> Iterator[tuple[str, bytes]]:
        for start in range(0, len(units), FILE_CHUNK):
            chunk = units[start : start + FILE_CHUNK]
            for unit, doc in zip(chunk, self.unit_docs(run_id, chunk), strict=True):
                line = json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()
                yield unit.unit_id, line + b"\n"
