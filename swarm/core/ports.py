"""Every port of the control plane: the interfaces the services depend on, and their values.

The services and the simulator see the outside world only through these Protocols; the AWS
adapters (:mod:`swarm.adapters`) implement them against DynamoDB, SQS, S3, SSM, Step Functions,
EventBridge, Lambda and Bedrock, and :mod:`swarm.core.memory` implements every one in memory
(the simulator's backends and the unit tests' twins).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from swarm.core.agent import Tool, ToolCall, ToolOutcome
from swarm.core.errors import InvalidInput, SwarmError
from swarm.core.governor import Draw, GovernorConfig, GovernorSnapshot, Grant, Ticket, TrueUp
from swarm.core.lanes import Bundle, QueuedUnit
from swarm.core.ledger import (
    DEFAULT_LEASE_S,
    Admission,
    Claim,
    Fate,
    Settlement,
    TopUp,
    TurnSettlement,
)
from swarm.core.pricing import Priced, Usage
from swarm.core.prompts import Prompt
from swarm.core.records import AttemptRecord, Lane, RunRecord, RunSpec, RunState, UnitRecord
from swarm.core.results import AttemptOutcome, FileLines, always


@dataclass(frozen=True)
class ModelRequest:
    run_id: str
    unit_id: str
    attempt: int
    projected_tokens: int
    input: Prompt = ""  # swarm.core.prompts: a prompt text or a Converse-shaped request
    #: the most the call may bill (a provider's maxTokens): the unit's reservation. None: no cap
    max_tokens: int | None = None
    #: the model to call (its Bedrock id: the unit's model of the registry); None: the plane's own
    model_id: str | None = None


@dataclass(frozen=True)
class ModelResult:
    """What one model call gave: the answer and what the provider counted for it."""

    succeeded: bool
    tokens: int  # billed tokens (input + output), failed calls included
    output: str = ""  # the answer's text (empty when the call failed)
    error: str = ""  # why the call failed (empty when it succeeded)
    stop_reason: str = ""  # the provider's, e.g. end_turn, max_tokens
    input_tokens: int = 0  # the provider's usage, when it reports it
    output_tokens: int = 0
    model_id: str = ""  # the model that answered
    #: the input tokens read from and written to the prompt cache (Converse's
    #: cacheReadInputTokens, cacheWriteInputTokens: apart from input_tokens)
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    def usage(self) -> Usage:
        """The usage the call is priced by (swarm.core.pricing): each kind of token as the
        provider reported it; a call that reported none but billed tokens (an answer lost in
        transit, billed at its cap) counts them as output, the dearest kind."""
        reported = Usage(
            self.input_tokens, self.output_tokens, self.cache_read_tokens, self.cache_write_tokens
        )
        if reported.tokens == 0 and self.tokens > 0:
            return Usage(output=self.tokens)
        return reported


class ModelThrottled(SwarmError):
    """The model plane refused the call for quota; nothing was billed."""


@dataclass(frozen=True)
class ConverseCall:
    """One model turn of an agent unit: a Converse request (``system``, ``messages``,
    ``inferenceConfig``, ``toolConfig``) built by :func:`swarm.core.agent.next_step`."""

    run_id: str
    unit_id: str
    turn: int
    request: Mapping[str, Any]
    #: the model to call (its Bedrock id); None: the plane's own
    model_id: str | None = None


class ModelPlane(Protocol):
    def invoke(self, request: ModelRequest) -> ModelResult: ...

    def converse(self, call: ConverseCall) -> Mapping[str, Any]:
        """The Converse response to ``call.request`` (``output.message``, ``stopReason``,
        ``usage``); ModelThrottled when the plane refused it for quota (nothing billed); any
        other exception: the call failed, and may have been billed."""
        ...


class ToolsUnavailable(RuntimeError):
    """The tools a unit names cannot be looked up now (an MCP server that cannot list its
    tools): the unit waits in its lane and tries again, uncalled."""


class ToolRunner(Protocol):
    """The deployment's tools (the registry in cdk.json) as the worker runs them."""

    def specs(self) -> Mapping[str, Tool]:
        """Every registered tool by name: what a unit's ``input.tools`` may name."""
        ...

    def timeout_s(self, name: str) -> float:
        """The longest a call of tool ``name`` may take (its function's timeout)."""
        ...

    def in_order(self, name: str) -> bool:
        """Whether calls of ``name`` must run one after another, in the order the model gave
        them, with the turn's other such calls (tools sharing state, e.g. BFCL's backends);
        other calls run in parallel."""
        ...

    def run(self, call: ToolCall, tenant: str) -> ToolOutcome:
        """Run ``call`` for ``tenant`` with its idempotency key; a tool's failure, a timeout or
        a refusal is an error outcome, never an exception."""
        ...


class Governor(Protocol):
    """The port. Implementations must never grant more than the bucket holds, under any
    number of concurrent callers."""

    config: GovernorConfig

    def draw(
        self, amount: int, lane: Lane, now: float, ticket: Ticket | None = None, tenant: str = ""
    ) -> Draw:
        """Draw ``amount`` for ``lane`` (for ``tenant``: a lane that keeps a reserve may queue
        its tenants apart). Granted: ``Draw.grant`` is what the true-up after the call needs.
        Refused: ``Draw.wait_s`` is when the tokens will really be there for it (the queue
        booked ahead included); an implementation that books ahead returns the booking, or a
        place in the tenant's queue, as ``Draw.ticket``, which the caller keeps (a unit carries
        it back to its lane) and presents to any client of the same bucket: a booking is
        granted without a request once ready, a place is drawn ahead of the tenant's queue."""
        ...

    def true_up(self, grant: Grant, used: int, now: float) -> TrueUp:
        """Settle a grant with what the model really counted: give back what it did not use
        (never so much that the bucket could give out more than capacity plus refill of what
        the model really used), draw what it used beyond the grant (that debit always lands)."""
        ...

    def report_throttle(self, now: float) -> None: ...

    def snapshot(self, now: float) -> GovernorSnapshot: ...


class PlaceBooker(Protocol):
    """Places in a tenant's queue booked before its units are sent (the fan-out's), so that a
    unit comes to its lane when its tokens are there instead of coming once to be told when
    (docs/explanation/governor.md, "Places booked at the fan-out")."""

    def book_places(
        self, amounts: Sequence[int], lane: Lane, tenant: str, now: float
    ) -> list[Draw]:
        """One refused Draw per amount, in order: its ``ticket`` the unit's place (None: none
        booked), its ``wait_s`` how long until the unit should come (0: now)."""
        ...


class TicketBooker(Protocol):
    """Tokens booked together for the units a worker received on a lane without a reserve, so
    that those that must wait are due back to back and go back to their lane together
    (docs/explanation/governor.md, "Tickets booked together"). Tokens are not queued tenant by
    tenant (only a reserved lane's places are): the units of every tenant are booked together."""

    def book_tickets(self, amounts: Sequence[int], lane: Lane, now: float) -> list[Draw]:
        """One refused Draw per amount, in order: its ``ticket`` the unit's tokens (ready at
        its ``ready_at``, perhaps now; None: none booked), its ``wait_s`` how long until they
        are there (0 and no ticket: nothing booked, the unit draws on its own)."""
        ...


@dataclass(frozen=True)
class UnitsPage:
    units: list[UnitRecord]
    last: str | None  # the last unit id read, when there may be more; None at the end


@dataclass(frozen=True, order=True)
class LeaseKey:
    """A position in the ledger's lease index: a unit's entry, ordered as the index lists
    them (its lease, :attr:`~swarm.core.records.Reservation.swept_from`, then its unit id)."""

    lease: float
    unit_id: str


@dataclass(frozen=True)
class LeasesPage:
    keys: list[LeaseKey]  # in the index's order
    more: bool  # entries may follow the last key (False: the index holds no more of them)


@dataclass(frozen=True)
class TenantQueued:
    """A tenant's queued units as a decision reads them, with the version of the tenant's
    holds: :meth:`Ledger.hold_queue` writes only if no other decision held since, and each of
    its open runs' progress: (when it opened, its units drained: completed or dead-lettered), from
    which a 429's Retry-After measures how fast the tenant's queue drains
    (:func:`swarm.core.backpressure.drain_rate`)."""

    units: int
    version: int
    progress: tuple[tuple[float, int], ...] = ()


@dataclass(frozen=True)
class ClaimedSettlement:
    """One claimed attempt to settle (:meth:`Ledger.settle_claimed`'s arguments)."""

    claimed: UnitRecord  # the unit its claim wrote
    attempt: int
    tokens: int
    succeeded: bool
    now: float
    outcome_key: str | None = None
    #: False: a failed attempt ends the unit dead-lettered, not retried (Ledger.settle)
    retry: bool = True
    #: its usage priced (Ledger.settle's ``priced``)
    priced: Priced | None = None


class Ledger(Protocol):
    """The run books. Every method is atomic with respect to every other caller."""

    def open_run(self, spec: RunSpec, now: float) -> RunRecord:
        """Create the books for a run and every unit record at once (:meth:`begin_open`, then
        :meth:`open_units` to the end); idempotent for the same spec, Conflict for another."""
        ...

    def begin_open(self, spec: RunSpec, spec_key: str, now: float) -> RunRecord:
        """Record the run as ``opening``: its run-level spec (``spec_key``: the S3 object with
        its unit list) and books, O(1) writes whatever its size; nothing is admitted until
        :meth:`open_units` has written every unit. Idempotent for the same spec (the run as it
        stands, opening or open), Conflict for another."""
        ...

    def open_units(
        self,
        spec: RunSpec,
        cursor: int,
        limit: int,
        now: float,
        keep_going: Callable[[], bool] = ...,
    ) -> int:
        """Write up to ``limit`` unit records from ``spec.units[cursor]`` (``spec`` with its unit
        list) while ``keep_going()``; the run is open once the last is written. Returns the next
        cursor, ``spec.units_total`` once open; idempotent from any cursor, and a run already
        open is left alone."""
        ...

    def run(self, run_id: str, opening: bool = False) -> RunRecord:
        """The run's books; NotFound for a run being opened unless ``opening`` (its status:
        state ``opening``, ``units_written`` so far)."""
        ...

    def unit(self, run_id: str, unit_id: str) -> UnitRecord: ...

    def units(self, run_id: str) -> list[UnitRecord]:
        """Every unit with its *effective* state (remainder included), in spec order."""
        ...

    def units_page(self, run_id: str, after: str | None, limit: int) -> UnitsPage:
        """Up to ``limit`` units with their effective state, in unit id order, starting after
        the unit id ``after`` (None: from the first)."""
        ...

    def attempts(self, run_id: str) -> list[AttemptRecord]: ...

    def queued_units(self, tenant: str) -> int:
        """The tenant's queued units: its open runs' units not yet terminal (pending or in
        flight; a remainder is not queued). Cheap: it reads the tenant's own open runs only,
        and may lag a run opened or closed a moment ago (an index read)."""
        ...

    def tenant_queue(self, tenant: str, now: float) -> TenantQueued:
        """:meth:`queued_units` for a decision to admit more of the tenant's work: it also
        counts the runs held (:meth:`hold_queue`) in the last ``HOLD_WINDOW_S``, which the
        index may not show yet (a held run not created yet counts its held units), and reads
        the holds' version."""
        ...

    def hold_queue(self, tenant: str, version: int, run_id: str, units: int, now: float) -> None:
        """Record that ``run_id`` is about to queue ``units`` of the tenant's work, if no other
        decision held since ``version`` was read (else :class:`~swarm.core.errors.Contended`):
        two submissions deciding on the same count cannot both pass the tenant's cap. Holds
        older than ``HOLD_WINDOW_S`` are dropped; at most ``MAX_HOLDS`` are kept."""
        ...

    def admit(
        self,
        run_id: str,
        unit_id: str,
        attempt: int,
        now: float,
        lease_s: float = DEFAULT_LEASE_S,
        by_scan: bool = False,
    ) -> Admission:
        """Reserve the attempt's projected tokens for ``lease_s``, or refuse. ``by_scan``: its
        reservation is not in the lease index; the run's scan horizon covers it (``RunRecord.
        scan_at``): for the fan-out's admissions, whose messages carry them."""
        ...

    def admit_many(
        self,
        run_id: str,
        unit_ids: Sequence[str],
        now: float,
        lease_s: float = DEFAULT_LEASE_S,
        by_scan: bool = False,
    ) -> list[Admission]:
        """Admit each unit's next attempt (its reservation's, if it holds one: admitted already;
        else its attempt count), in order: the decisions :meth:`admit` would make one by one,
        one Admission per unit. The DynamoDB ledger writes many in one transaction."""
        ...

    def settle(
        self,
        run_id: str,
        unit_id: str,
        attempt: int,
        tokens: int,
        succeeded: bool,
        now: float,
        outcome_key: str | None = None,
        *,
        retry: bool = True,
        priced: Priced | None = None,
    ) -> Settlement:
        """Settle the attempt once (a repeat answers the first settlement, ``duplicate``);
        ``priced``: the money ``tokens`` cost and the prices it was priced at, spent and kept
        with the attempt (None: unpriced, 0);
        ``outcome_key``: where its outcome is kept, the unit's from now on. ``retry`` False: a
        failed attempt ends the unit dead-lettered, whatever attempts it has left (a model that
        refused). An agent loop's attempt (claimed with ``loop``): ``tokens`` is what is billed
        beyond its turns settled already (:meth:`settle_turn`; 0 when every turn went through
        it), and the attempt's record bills both."""
        ...

    def settle_turn(
        self,
        run_id: str,
        unit_id: str,
        attempt: int,
        turn: int,
        tokens: int,
        now: float,
        events: Sequence[tuple[int, Mapping[str, Any]]] = (),
        known: UnitRecord | None = None,
        priced: Priced | None = None,
    ) -> TurnSettlement:
        """Settle model turn ``turn`` of an agent loop's attempt (claimed with ``loop``), once,
        with the log events ``events`` (``(seq, event)``, each only if its seq is free), in one
        atomic write: the turn's ``tokens`` spent, released from the reservation as far as it
        holds them. A turn settled before: ``settled`` False, nothing written. Conflict unless
        the unit holds the attempt's loop reservation and has settled ``turn - 1`` turns;
        :class:`~swarm.core.errors.Contended` (nothing written) when a seq is taken. Any run
        state: the answer carries it, and the loop stops at this boundary unless it is open.
        ``known``: the unit as the caller's last write left it (a claim's, a turn's): the
        DynamoDB ledger then decides without reading, and reads only when the unit or the
        books moved since."""
        ...

    def pause(self, run_id: str, unit_id: str, attempt: int, now: float) -> RunRecord:
        """An agent loop stopped at a turn boundary because its run is no longer open: release
        its reservation (what its turns did not use), the unit pending again with its attempts,
        turns and spent (the remainder while the run exhausts); the run as it stands after, maybe
        closed (the caller wakes the finalizer). A unit no longer holding it is left alone, and
        so is one whose run is open again (a top-up since): the answer is open, the loop goes on."""
        ...

    def park(
        self,
        run_id: str,
        unit_id: str,
        attempt: int,
        now: float,
        until: float,
        events: Sequence[tuple[int, Mapping[str, Any]]] = (),
    ) -> RunRecord:
        """An agent loop waits for a person's decision on a tool call: the unit goes to
        ``awaiting_approval`` with its reservation kept and unclaimed (lease ``until``), with
        ``events`` (its ``approval_requested`` events) appended in the same write (each only if
        its seq is free: Contended otherwise). A unit parked already is left as it is. The run
        as it stands after (an exhausting run may close: the caller wakes the finalizer)."""
        ...

    def unpark(
        self,
        run_id: str,
        unit_id: str,
        now: float,
        lease_s: float,
        events: Sequence[tuple[int, Mapping[str, Any]]],
    ) -> tuple[RunRecord, UnitRecord, bool]:
        """Record ``events`` (the decisions that leave none pending) and move the parked unit
        out of ``awaiting_approval`` in one write: in flight again with a fresh unclaimed lease
        on an open run (True: send it to its lane), else into the remainder, its reservation
        released (False). Contended when an event's seq is taken; Conflict when the unit is not
        parked."""
        ...

    def read_log(self, run_id: str, unit_id: str) -> list[dict[str, Any]]:
        """The unit's event log: every event, in seq order (DynamoDB: a strongly consistent
        Query)."""
        ...

    def append_log(
        self, run_id: str, unit_id: str, seq: int, events: Sequence[Mapping[str, Any]]
    ) -> None:
        """Append ``events`` to the unit's log at ``seq``, ``seq + 1``, ...: all of them, each
        only if its seq is free, or none (:class:`~swarm.core.errors.Contended`). An event
        whose item would pass DynamoDB's 400 KB is refused (InvalidInput naming its seq)."""
        ...

    def settle_claimed(
        self,
        claimed: UnitRecord,
        attempt: int,
        tokens: int,
        succeeded: bool,
        now: float,
        outcome_key: str | None = None,
        *,
        retry: bool = True,
        priced: Priced | None = None,
    ) -> Fate | None:
        """Settle the attempt a worker claimed without reading first: ``claimed`` is the unit
        its claim wrote (:class:`Claim`'s ``unit``). One write, which holds only if the unit is
        still exactly that, the run is open and this unit is not its last outstanding one
        (whose settlement closes the run: that needs the books), and the attempt was not settled
        yet; the attempt's fate then. None otherwise, and nothing written: the caller settles
        with :meth:`settle`, which reads and decides."""
        ...

    def settle_claimed_many(self, settlements: Sequence[ClaimedSettlement]) -> list[Fate | None]:
        """Settle several claimed attempts (a worker invocation's) as :meth:`settle_claimed`
        settles each, in as few writes as it can (DynamoDB: one transaction, each run's books
        written once, all or nothing). Each one's fate, in order, or None for one this call did
        not settle: the caller settles it alone (:meth:`settle_claimed`, then :meth:`settle`)."""
        ...

    def top_up(self, run_id: str, amount: int, now: float, max_budget: int | None = None) -> TopUp:
        """Add to the run's budget, refusing (InvalidInput) a total above ``max_budget``; the
        check and the write are one atomic step."""
        ...

    def claim(
        self,
        run_id: str,
        unit_id: str,
        attempt: int,
        now: float,
        lease_s: float,
        loop: bool = False,
    ) -> Claim:
        """Start the attempt: take its reservation's lease. ``loop``: an agent loop's attempt;
        its reservation is marked so (written with the claim), and a stale claim of it (its
        worker died) is taken over (``taken_over``) instead of answered ``stale``."""
        ...

    def claim_queued(
        self,
        run_id: str,
        unit_id: str,
        attempt: int,
        now: float,
        lease_s: float,
        loop: bool = False,
    ) -> Claim | None:
        """Claim attempt ``attempt`` of a unit waiting for it in its lane (in flight for that
        attempt, unclaimed: as a worker finds nearly every unit it draws tokens for) without
        reading it first: one conditional write (``loop`` as :meth:`claim`'s). None if the unit
        is in any other state (or unknown): the caller reads it and decides (:meth:`unit`,
        :meth:`admit`, :meth:`claim`)."""
        ...

    def unclaim(self, run_id: str, unit_id: str, attempt: int, now: float, lease_s: float) -> bool:
        """Hand a claimed attempt back (unstarted, or an agent loop's between deliveries: its
        turns settled so far stay with it); False if it is no longer in flight."""
        ...

    def expired_leases(self, run_id: str, now: float) -> list[str]:
        """The units of the run whose lease expired by ``now``, the oldest expiry first (ties by
        unit id): the lease index, which holds only units with a lease, so this reads only the
        expired ones, not every unit. May lag a write just made: callers re-read before acting."""
        ...

    def leases_page(
        self, run_id: str, until: float, after: LeaseKey | None, limit: int
    ) -> LeasesPage:
        """:meth:`expired_leases` a page at a time, with their positions: up to ``limit`` of
        the run's leases that end by ``until``, in the index's order, starting after ``after``
        (None: from the first). One keys-only read of the index, however many units the run
        has; as eventually consistent as :meth:`expired_leases`."""
        ...

    def reclaim_expired(
        self, run_id: str, now: float, keep_going: Callable[[], bool] = always
    ) -> list[Settlement]:
        """Settle claimed attempts whose lease expired as lost; release unclaimed ones, and
        an agent loop's claimed ones without charging (its settled turns stay spent) (those
        :meth:`expired_leases` lists, each decided again from its fresh record; and once the
        run's scan horizon passed, ``RunRecord.scan_at``, those of every unit read, the horizon
        then moved to the latest lease still live that the index does not hold). Stops when
        ``keep_going()`` turns False (the caller's time is up), after one unit at least so that
        every call makes progress; the horizon moves only once every expired unit the scan
        found is decided, so the next call scans again and goes on (a run whose messages are
        gone may have a great many)."""
        ...

    def reclaim_unit(self, run_id: str, unit_id: str, now: float) -> Settlement | None:
        """The same for one unit; returns the lost attempt's settlement, if there was one."""
        ...

    def dead_letter(self, run_id: str, unit_id: str, now: float) -> UnitRecord:
        """End a unit the queue gave up on; a claimed attempt is settled as lost first (an agent
        loop's is released: its settled turns stay spent)."""
        ...


class Lanes(Protocol):
    def push(self, item: QueuedUnit) -> None: ...

    def peek(self) -> QueuedUnit | None: ...

    def pop(self) -> QueuedUnit: ...

    def remove(self, run_id: str, unit_ids: set[str]) -> int: ...

    def depth(self, lane: Lane | None = None) -> int: ...


@dataclass(frozen=True)
class LaneDepth:
    visible: int  # waiting to be received
    in_flight: int  # received by a worker, not yet deleted
    delayed: int  # sent with a delay (backpressure returns), not yet visible

    @property
    def queued(self) -> int:
        return self.visible + self.delayed


#: SQS's longest DelaySeconds: a requeued unit comes back after at most this long
MAX_SQS_DELAY_S = 900
#: SendMessageBatch: at most 10 messages; their bodies together within 256 KiB (SQS now takes
#: 1 MiB for a batch, but the lanes' messages are bounded as a single message always was, and the
#: smaller bound holds on every queue and on the local stack)
SQS_BATCH_MESSAGES = 10
SQS_BATCH_BYTES = 262_144


#: SQS's longest VisibilityTimeout
MAX_SQS_VISIBILITY_S = 43_200


def sqs_seconds(seconds: float, time_scale: float = 1.0, at_most: int = MAX_SQS_DELAY_S) -> int:
    """``seconds`` on the caller's clock as the whole seconds SQS takes (``DelaySeconds``,
    ``VisibilityTimeout``), rounded up: SQS counts on AWS's clock, which a local stack's runs
    ``time_scale`` times slower than its own (so a quarter of a local second at x10 is 3 SQS
    seconds, not 1). 0 for none; any other duration is at least one SQS second and at most
    ``at_most``."""
    if seconds <= 0:
        return 0
    # the product of a float division and the scale it undoes: 2.9999999999999996 is 3
    return int(min(at_most, max(1, math.ceil(round(seconds * time_scale, 6)))))


#: a delay SQS rounds up to its shortest, one second: what a requeue waits at the least
SHORTEST_DELAY_S = 1e-3


def requeue_delay(seconds: float) -> float:
    """A requeued unit's delay on the caller's clock: never none (the SQS adapter rounds it up
    to whole SQS seconds, at least one, and at most :data:`MAX_SQS_DELAY_S` of them)."""
    return max(SHORTEST_DELAY_S, float(seconds))


def check_delays(items: Sequence[object], delays_s: Sequence[float]) -> Sequence[float]:
    """``send_many``'s delays: one per item, or none (every item undelayed)."""
    if not delays_s:
        return [0.0] * len(items)
    if len(delays_s) != len(items):
        raise InvalidInput("delays_s", f"{len(delays_s)} delays for {len(items)} items")
    return delays_s


class LaneQueue(Protocol):
    """The SQS lanes (one queue per lane, each with its DLQ)."""

    def send(self, item: QueuedUnit, delay_s: float = 0) -> None: ...

    def send_many(self, items: Sequence[QueuedUnit], delays_s: Sequence[float] = ()) -> None:
        """Send every item on its lane, in order per lane (SQS: SendMessageBatch, up to
        :data:`SQS_BATCH_MESSAGES` messages and :data:`SQS_BATCH_BYTES` of bodies per request;
        the entries SQS reports as failed are sent again), each delayed by its entry of
        ``delays_s`` (seconds on the caller's clock, rounded up to SQS's whole seconds:
        :func:`sqs_seconds`; none: no delay). Raises if one cannot be sent; the items sent
        before stay sent (a caller that retries sends those twice: the worker's claim absorbs a
        duplicate)."""
        ...

    def send_bundles(self, bundles: Sequence[Bundle]) -> None:
        """Send each bundle (swarm.core.lanes.bundle) as one message on its lane, delayed by its
        ``delay_s``, as :meth:`send_many` sends its items (a bundle of one is the unit's own
        message)."""
        ...

    def change_visibility(self, lane: Lane, receipt_handle: str, seconds: float) -> None:
        """Make a received message visible again after ``seconds`` (a failed attempt's retry;
        on the caller's clock, rounded up to SQS's whole seconds)."""
        ...

    def depths(self) -> Mapping[Lane, LaneDepth]: ...


@dataclass(frozen=True)
class SignedUpload:
    """A URL that writes exactly one object: a PUT with exactly ``headers`` (the store checks
    them: the object's size, its type, and that it does not exist yet)."""

    url: str
    headers: Mapping[str, str]


def upload_headers(size_bytes: int) -> dict[str, str]:
    """What an upload URL is signed with, and its client must send: the object's exact size
    (S3 does not enforce a size range on a presigned PUT, but it checks a signed
    Content-Length), its type, and write-once (a leaked URL cannot replace the upload)."""
    return {
        "Content-Type": "application/json",
        "Content-Length": str(size_bytes),
        "If-None-Match": "*",
    }


class BlobStore(Protocol):
    """The manifest/results bucket."""

    def put_json(self, key: str, doc: Any) -> None: ...

    def get_json(self, key: str, max_bytes: int | None = None) -> Any:
        """Raises NotFound when there is no such object, ReadDenied when the store will not say
        (S3's 403), ObjectTooLarge (nothing read) when it is over ``max_bytes``, InvalidInput
        (named by the key) when it is not JSON."""
        ...

    def upload_url(self, key: str, size_bytes: int, expires_s: int) -> SignedUpload:
        """A URL that creates the JSON object ``key`` once, of exactly ``size_bytes``, valid
        for ``expires_s`` seconds: whoever holds it needs no rights of its own on the store."""
        ...

    def exists(self, key: str) -> bool:
        """Raises ReadDenied when the store will not say (never reads a 403 as "no")."""
        ...


class ResultStore(Protocol):
    """Where attempts' outcomes and a closed run's results file are kept (the batch bucket,
    under ``results/<run>/``)."""

    def record(self, outcome: AttemptOutcome) -> str | None:
        """Keep the attempt's outcome under its own key, once: that key; None (and nothing
        written) if the attempt already has one."""
        ...

    def record_page(self, run_id: str, outcomes: Sequence[AttemptOutcome]) -> str:
        """Keep outcomes of a run's attempts in one new object (a *page*: one write for a worker
        invocation's outcomes); its key. A page is never rewritten: each has a key of its own."""
        ...

    def outcomes(
        self, run_id: str, attempts: Sequence[tuple[str, int, str | None]]
    ) -> list[AttemptOutcome | None]:
        """The recorded outcomes of ``(unit id, attempt, key)``: the attempt's record in the
        object at ``key`` (a page, or a record), or under the attempt's own key when ``key`` is
        None; None where there is none. Each object is read once."""
        ...

    def write_file(
        self,
        run_id: str,
        name: str,
        lines: FileLines,
        keep_going: Callable[[], bool] = always,
    ) -> str | None:
        """Write a run's results file from its lines (any size: streamed in parts); its key.
        A file too long for one call: when ``keep_going()`` turns False after at least one
        part, the parts so far are kept with the unit id they end after and None is returned;
        the next call with the same name asks ``lines`` for the units after it and goes on."""
        ...

    def exists(self, key: str) -> bool: ...

    def download_url(self, key: str, expires_s: int) -> str:
        """A URL that reads exactly this object, valid for ``expires_s`` seconds."""
        ...

    def location(self, key: str) -> str:
        """Where the object is, for people and events (e.g. ``s3://bucket/key``)."""
        ...


class TenantBindings(Protocol):
    """Each tenant bound to the unique id of the role that first called as it: a role deleted
    and recreated under the same name (or created by anyone allowed to create roles) does not
    inherit the tenant until an operator re-binds it."""

    def bind(self, tenant: str, role_id: str, now: float) -> bool:
        """Bind at first use; True if the tenant is (now) bound to ``role_id``, False if it is
        bound to another role. A binding already there is confirmed with a read; only the
        first binding writes (conditionally: a concurrent first binding of another role loses)."""
        ...

    def unbind(self, tenant: str) -> bool:
        """Forget the binding (the next call binds afresh); False if there was none."""
        ...


class Executions(Protocol):
    """The fan-out state machine."""

    def start(self, name: str, payload: Mapping[str, Any]) -> bool:
        """Start an execution; False (and nothing new) if one with this name already exists."""
        ...


@dataclass(frozen=True)
class DrainState:
    on: bool
    #: when every reader's cache has seen this value, and a worker that read the old one has
    #: written its entry in the register of running work (the switch's last change plus twice
    #: the caches' lifetime, epoch seconds); None when the switch does not know when it changed
    settled_at: float | None = None

    def settled(self, now: float) -> bool:
        return self.settled_at is None or now >= self.settled_at


class DrainSwitch(Protocol):
    """The drain parameter in SSM Parameter Store. Readers cache it for a few seconds (SSM's
    standard throughput is 40 reads per second for the whole account and region)."""

    def draining(self, fresh: bool = False) -> bool:
        """``fresh`` bypasses the cache (an operator's view, the drain controller)."""
        ...

    def state(self) -> DrainState:
        """An exact read, with when the value has reached every cached reader."""
        ...

    def set(self, draining: bool) -> None: ...


@dataclass(frozen=True)
class RunningUnits:
    """The work running now: the units held by live worker invocations that are claiming or
    running attempts (:class:`RunningWork`). Queued, delayed and hidden messages are not in it."""

    units: int = 0
    invocations: int = 0
    by_run: Mapping[str, int] = field(default_factory=dict)


class RunningWork(Protocol):
    """The register of running work: each worker invocation enters it before its first claim
    (after its drain check) with the units it holds, and leaves it once its settlements are
    written. An entry counts until ``expires_at`` (the invocation's claims' lease), so a worker
    that died stops counting by itself. The drain view and the batch status read it."""

    def enter(
        self, invocation: str, runs: Mapping[str, int], expires_at: float, now: float
    ) -> None:
        """Register ``invocation`` holding ``runs`` (units by run id) until ``expires_at``."""
        ...

    def leave(self, invocation: str) -> None:
        """The invocation's settlements are written: it no longer counts (idempotent)."""
        ...

    def running(self, now: float) -> RunningUnits:
        """An exact (consistent) read of the entries that have not expired at ``now``."""
        ...


def check_entry(invocation: str, runs: Mapping[str, int]) -> None:
    """What the register takes: a non-empty invocation id and positive unit counts."""
    if not invocation:
        raise InvalidInput("invocation", "an invocation id is required")
    for run_id, units in runs.items():
        if not run_id or units < 1:
            raise InvalidInput("runs", f"{run_id!r}: {units} units (at least 1 per run)")


def tally(entries: Iterable[Mapping[str, int]]) -> RunningUnits:
    """The running work of live entries (each an invocation's units by run)."""
    by_run: dict[str, int] = {}
    invocations = 0
    for runs in entries:
        invocations += 1
        for run_id, units in runs.items():
            by_run[run_id] = by_run.get(run_id, 0) + units
    return RunningUnits(sum(by_run.values()), invocations, by_run)


class Events(Protocol):
    """EventBridge."""

    def publish(self, detail_type: str, detail: Mapping[str, Any]) -> None: ...


@dataclass(frozen=True)
class MappingState:
    lane: Lane
    uuid: str
    state: str  # Enabled | Disabled | Enabling | Disabling | ...

    @property
    def enabled(self) -> bool:
        return self.state in ("Enabled", "Enabling")


class Mappings(Protocol):
    """The workers' SQS event source mappings, one per lane."""

    def set_enabled(self, enabled: bool) -> list[MappingState]: ...

    def states(self) -> list[MappingState]: ...


@dataclass(frozen=True)
class WatchedRun:
    """A run the sweeper watches, as the ``OpenRuns`` index (or the books) holds it."""

    run_id: str
    sweep_at: float
    execution: str | None = None  # the last execution that reached the finalize loop
    repairs: int = 0  # restarts by the sweeper so far


class RunWatch(Protocol):
    """Runs that still need a finalizer: open, or closed but not yet announced."""

    def due(self, now: float, limit: int) -> list[WatchedRun]:
        """Up to ``limit`` watched runs whose ``sweep_at`` has passed, most overdue first."""
        ...

    def get(self, run_id: str) -> WatchedRun | None:
        """The run's watch entry, read consistently; None if it is not watched."""
        ...

    def record(self, run_id: str, execution: str) -> bool:
        """``execution`` reached the run's finalize loop; False if the run is not watched."""
        ...

    def check(
        self,
        run_id: str,
        sweep_at: float,
        *,
        repairs: int | None = None,
        forget_execution: bool = False,
    ) -> bool:
        """Looked at: look again at ``sweep_at`` (a restart also sets ``repairs``)."""
        ...

    def release(self, run_id: str, state: RunState, epoch: int) -> bool:
        """The closure (``state``, exhaustion ``epoch``) is announced: stop watching, unless a
        top-up reopened the run meanwhile (then False)."""
        ...


class Closures(Protocol):
    """The finalize loop waits for its run's closure instead of polling for it: it keeps a task
    token, and whoever closes the run hands it back (statemachines/fanout.asl.json, ``Poll``)."""

    def wait(self, run_id: str, token: str, now: float) -> None:
        """Keep ``token``: the task of the execution waiting for the run's closure (the latest
        one kept replaces the one before)."""
        ...

    def notify(self, run_id: str) -> bool:
        """The run closed: wake the execution waiting for it. False when none is (no token
        kept, or its wait is over: it timed out and polls again)."""
        ...


class SweptExecutions(Protocol):
    """The fan-out state machine, as the sweeper uses it."""

    def start(self, name: str, payload: Mapping[str, Any]) -> bool:
        """Start an execution; False (and nothing new) if one with this name already exists."""
        ...

    def status(self, name: str) -> str | None:
        """RUNNING, SUCCEEDED, FAILED, TIMED_OUT, ABORTED, PENDING_REDRIVE; None if there is no
        execution of that name."""
        ...
