"""One write for a worker invocation's outcomes: a *page*.

The worker function runs its SQS batch's messages at once (functions/worker.py), and each message
that reaches the model keeps its attempt's outcome before it settles the attempt (a completed
unit always has its output: swarm.core.results). One ``PutObject`` per attempt was a billed
request per unit, and the finalizer's results file read each back (another). So an invocation's
outcomes are kept together: each message's thread hands its outcome to the invocation's
:class:`Page` and waits until every message of the batch has handed one or ended without; then
the outcomes are written, one object per run (``ResultStore.record_page``), and each thread
settles its attempt with the key of the object holding its outcome (``UnitRecord.outcome_key``):
the ledger names where each unit's outcome is, so a page written by a worker whose attempt was
settled otherwise (a duplicate delivery, a lost attempt's late answer) is never read as the
unit's.

The settlements are written together too: once the page is written, each message that kept an
outcome in it hands its claimed attempt's settlement to the page (:func:`settle_claimed`), and the
last to arrive settles them all in one write (``Ledger.settle_claimed_many``: one transaction,
each run's books written once, not once per unit); a settlement that write did not make (any of
its conditions failed: a unit changed, the run's last units) is made alone, as before.

The wait costs no Lambda time: the invocation lasts until its slowest message ends anyway. A
message's claim lease (the lanes' visibility timeout, six worker timeouts) covers it. An output
too long for a results page to inline is kept alone (its link reads exactly it). A write that
fails fails every message waiting on it: SQS redelivers them, as it would a failed single write.
Outside an invocation (tests, the simulator) an outcome is kept alone, as before.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

from swarm.core.ledger import Fate
from swarm.core.ports import ClaimedSettlement, Ledger, ResultStore
from swarm.core.results import MAX_PAGED_OUTPUT_BYTES, AttemptOutcome


@dataclass(eq=False)
class _Kept:
    outcome: AttemptOutcome
    store: ResultStore
    key: str | None = None


@dataclass(eq=False)
class Page:
    """The outcomes of one invocation's ``messages`` messages, written together."""

    messages: int
    _cond: threading.Condition = field(default_factory=threading.Condition, repr=False)
    _kept: list[_Kept] = field(default_factory=list, repr=False)
    _done: int = 0  # messages that handed an outcome or ended without one
    _state: str = "open"  # open -> writing -> written | failed
    _error: BaseException | None = None
    writes: int = 0  # objects written (for tests and logs)
    #: the settlements handed over (or None: a message that kept an outcome and ended without)
    _settling: list[tuple[_Participant, Ledger, ClaimedSettlement] | None] = field(
        default_factory=list, repr=False
    )
    _settled: dict[int, Fate | None] | None = field(default=None, repr=False)  # by participant
    together: int = 0  # settlements written together (for tests and logs)

    @contextmanager
    def message(self) -> Iterator[None]:
        """One message's turn: its outcome, if it keeps one (:func:`keep_outcome`), waits for
        the page; if it ends without, the page stops waiting for it."""
        token = _Participant(self)
        reset = _CURRENT.set(token)
        try:
            yield
        finally:
            _CURRENT.reset(reset)
            if not token.kept:
                self._arrive(None)
            elif not token.settling and self._state == "written":
                self._hand(None)  # kept an outcome, ended without settling: not waited for

    def _arrive(self, kept: _Kept | None) -> None:
        with self._cond:
            if kept is not None:
                self._kept.append(kept)
            self._done += 1
            last = self._done == self.messages
            if last:
                self._state = "writing"
        if last:
            self._write()

    def _write(self) -> None:
        error: BaseException | None = None
        try:
            by_run: dict[tuple[int, str], list[_Kept]] = {}
            for kept in self._kept:
                if len(kept.outcome.output.encode()) > MAX_PAGED_OUTPUT_BYTES:
                    kept.key = kept.store.record(kept.outcome)  # alone: its link reads it only
                    continue
                by_run.setdefault((id(kept.store), kept.outcome.run_id), []).append(kept)
            for (_, run_id), group in by_run.items():
                key = group[0].store.record_page(run_id, [k.outcome for k in group])
                self.writes += 1
                for kept in group:
                    kept.key = key
        except BaseException as e:  # every waiting message fails with it
            error = e
        with self._cond:
            self._state = "failed" if error is not None else "written"
            self._error = error
            self._cond.notify_all()

    def _keep(self, outcome: AttemptOutcome, store: ResultStore) -> str | None:
        kept = _Kept(outcome, store)
        self._arrive(kept)
        with self._cond:
            while self._state in ("open", "writing"):
                self._cond.wait()
            if self._error is not None:
                raise self._error
        return kept.key

    def _hand(self, item: tuple[_Participant, Ledger, ClaimedSettlement] | None) -> None:
        """A settlement handed over (or a message that will hand none); the last settles all."""
        with self._cond:
            self._settling.append(item)
            last = len(self._settling) == len(self._kept)
        if not last:
            return
        handed = [i for i in self._settling if i is not None]
        self.together = len(handed)
        settled: dict[int, Fate | None] = {}
        by_ledger: dict[int, list[tuple[_Participant, Ledger, ClaimedSettlement]]] = {}
        for entry in handed:
            by_ledger.setdefault(id(entry[1]), []).append(entry)
        for group in by_ledger.values():
            try:
                fates = group[0][1].settle_claimed_many([c for _, _, c in group])
            except Exception:  # each settles alone, and meets the error itself if it persists
                fates = [None] * len(group)
            settled.update({id(p): f for (p, _, _), f in zip(group, fates, strict=True)})
        with self._cond:
            self._settled = settled
            self._cond.notify_all()

    def _settle(
        self, participant: _Participant, ledger: Ledger, c: ClaimedSettlement
    ) -> Fate | None:
        participant.settling = True
        self._hand((participant, ledger, c))
        with self._cond:
            while self._settled is None:
                self._cond.wait()
            return self._settled[id(participant)]


@dataclass(eq=False)
class _Participant:
    page: Page
    kept: bool = False
    settling: bool = False


_CURRENT: ContextVar[_Participant | None] = ContextVar("swarm_outcome_page", default=None)


def keep_outcome(store: ResultStore, outcome: AttemptOutcome) -> str | None:
    """Keep an attempt's outcome: in the invocation's page when the message runs in one (then
    the key of the object holding it), else alone under the attempt's own key (then None: the
    ledger's default for a unit's outcome). Called once per message, before its settlement."""
    participant = _CURRENT.get()
    if participant is None or participant.kept:
        store.record(outcome)
        return None
    participant.kept = True
    return participant.page._keep(outcome, store)


def settle_claimed(ledger: Ledger, claimed: ClaimedSettlement) -> Fate | None:
    """Settle a claimed attempt (``Ledger.settle_claimed``): together with the other messages'
    settlements when its outcome was kept in the invocation's page, else alone. None if it was
    not settled: the caller settles it with ``Ledger.settle`` (which reads and decides)."""
    participant = _CURRENT.get()
    if participant is not None and participant.kept and not participant.settling:
        page = participant.page
        fate = page._settle(participant, ledger, claimed)
        if fate is not None or page.together <= 1:
            return fate
        # the write of them all failed: alone, as before
    c = claimed
    return ledger.settle_claimed(
        c.claimed,
        c.attempt,
        c.tokens,
        c.succeeded,
        c.now,
        c.outcome_key,
        retry=c.retry,
        priced=c.priced,
    )
