"""The governor's request bucket (``GovernorConfig.rpm``): one request per model call beside the
quota tokens, drawn in the same write, never over-granted (docs/explanation/governor.md, "Requests
per minute")."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from decimal import Decimal

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from swarm.bench.governor import over_grant_tolerance, over_granted
from swarm.core.errors import InvalidInput
from swarm.core.governor import (
    ZERO,
    GovernorConfig,
    Grant,
    Refund,
    ShardState,
    ShardWrite,
    Ticket,
    booking_ahead,
    cut_rate,
    initial_shard,
    micro,
    plan_write,
    rebase,
    requests_mark,
    ticket_from_doc,
    ticket_ready_at,
    ticket_to_doc,
    view_of,
)
from swarm.core.memory import InMemoryGovernor
from swarm.core.records import Lane

#: 600 requests per minute at share 1: 10 requests/s, a bucket of 600; tokens never bind here
RPM = GovernorConfig(300_000, 1.0, rpm=600)


# ---------------------------------------------------------------- configuration


@pytest.mark.parametrize("rpm", [0, -5, True, 1.5])
def test_a_bad_rpm_is_refused_naming_quota_rpm(rpm: object) -> None:
    with pytest.raises(InvalidInput) as error:
        GovernorConfig(300_000, rpm=rpm)  # type: ignore[arg-type]
    assert error.value.field == "quota_rpm"


def test_an_rpm_too_small_for_a_lanes_reserve_is_refused() -> None:
    with pytest.raises(InvalidInput, match="too few for one request of lane low"):
        GovernorConfig(300_000, 0.95, rpm=1, reserves={Lane.LOW: 0.2})
    GovernorConfig(300_000, 0.95, rpm=2, reserves={Lane.LOW: 0.2})  # 1.9 holds 1 + 0.38


def test_the_request_bucket_is_one_minute_of_the_governed_rpm() -> None:
    config = GovernorConfig(300_000, 0.95, rpm=1_000, reserves={Lane.LOW: 0.2})
    assert config.request_rate == pytest.approx(1_000 / 60 * 0.95)
    assert config.request_capacity == pytest.approx(950)
    assert config.request_reserve(Lane.LOW) == pytest.approx(190)
    assert GovernorConfig(300_000).request_rate is None  # no rpm: no request bucket


# ---------------------------------------------------------------- in memory


def test_small_draws_are_bound_by_requests_long_before_tokens() -> None:
    gov = InMemoryGovernor(replace(RPM, initial_fill=0.0), now=0.0)
    granted = sum(gov.draw(50, Lane.HIGH, i * 0.01).granted for i in range(1, 1_001))
    # 10 s at 10 requests/s: 100 calls of 50 tokens, where the tokens would allow 10,000
    assert granted == 100
    refused = gov.draw(50, Lane.HIGH, 10.0)
    # the wait is the later of the two buckets': the request's, about 0.1 s
    assert not refused.granted and 0 < refused.wait_s <= 0.1 + 1e-9


def test_the_wait_is_the_later_of_the_two_buckets() -> None:
    # tokens short by 10 s, requests by 1 s: wait 10 s; and the other way round
    config = GovernorConfig(60_000, 1.0, rpm=60, initial_fill=0.0)  # 1,000 tokens/s, 1 req/s
    gov = InMemoryGovernor(config, now=0.0)
    assert gov.draw(10_000, Lane.HIGH, 0.0).wait_s == pytest.approx(10.0)
    gov = InMemoryGovernor(config, now=0.0)
    assert gov.draw(10, Lane.HIGH, 0.0).wait_s == pytest.approx(1.0)


def test_after_idle_the_request_bucket_holds_its_capacity_not_more() -> None:
    gov = InMemoryGovernor(replace(RPM, initial_fill=1.0), now=0.0)  # full: 600 requests
    assert sum(gov.draw(10, Lane.HIGH, 0.0).granted for _ in range(700)) == 600
    # an hour idle refills 36,000 requests' worth: the bucket holds 600 of them
    assert sum(gov.draw(10, Lane.HIGH, 3_600.0).granted for _ in range(700)) == 600
    assert gov.snapshot(3_600.0).requests_available == pytest.approx(0.0)


def test_a_throttle_cuts_both_rates_and_both_recover() -> None:
    gov = InMemoryGovernor(replace(RPM, initial_fill=0.0), now=0.0)
    gov.report_throttle(0.0)
    snap = gov.snapshot(0.0)
    assert snap.effective_rate == pytest.approx(RPM.rate / 2)
    assert snap.effective_request_rate == pytest.approx(5.0)  # 10/s cut by half
    later = gov.snapshot(100.0)  # recovered: 1% of the rate per second
    assert later.effective_rate == RPM.rate and later.effective_request_rate == 10.0


def test_a_released_grant_gives_its_request_back_a_true_up_only_tokens() -> None:
    gov = InMemoryGovernor(replace(RPM, initial_fill=0.0), now=0.0)
    first = gov.draw(50, Lane.HIGH, 1.0)  # 10 requests in the bucket
    assert first.granted and first.grant is not None and first.grant.requests == 1
    level = gov.snapshot(1.0).requests_available
    gov.true_up(first.grant, 20, 1.0)  # the call went out: its request stays spent
    assert gov.snapshot(1.0).requests_available == pytest.approx(level)
    second = gov.draw(50, Lane.HIGH, 1.0)
    assert second.grant is not None
    gov.true_up(second.grant, 0, 1.0)  # released: the call never went out
    assert gov.snapshot(1.0).requests_available == pytest.approx(level)


def test_a_release_the_bucket_could_have_filled_without_is_dropped() -> None:
    gov = InMemoryGovernor(replace(RPM, initial_fill=1.0), now=0.0)  # full
    got = gov.draw(50, Lane.HIGH, 0.0)
    assert got.grant is not None
    # 0.1 s later the bucket is full again: giving the request back would mint one
    gov.true_up(got.grant, 0, 0.1)
    assert gov.snapshot(0.1).requests_available == pytest.approx(600.0)
    assert gov.state.requests_refunded == 0


def test_without_rpm_a_draw_counts_no_request() -> None:
    gov = InMemoryGovernor(GovernorConfig(300_000), now=0.0)
    got = gov.draw(50, Lane.HIGH, 1.0)
    assert got.grant is not None and got.grant.requests == 0
    assert got.grant.requests_mark is None
    assert gov.snapshot(0.0).requests_available is None


# ---------------------------------------------------------------- the cumulative form


def apply(s: ShardState, w: ShardWrite) -> ShardState | None:
    """What DynamoDB does with the write on the item ``s`` (None: a condition failed), request
    bucket included."""
    holds = s.lost <= w.lost and s.refunded <= w.refunded_max
    holds = holds and (w.drawn_max is None or s.drawn <= w.drawn_max)
    holds = holds and (w.drawn_min is None or s.drawn >= w.drawn_min)
    holds = holds and (w.base_time is None or s.base_time == w.base_time)
    holds = holds and (w.highs_is is None or s.highs == w.highs_is)
    r, rw = s.requests, w.requests
    if rw is not None:
        assert r is not None
        holds = holds and r.lost <= rw.lost and r.refunded <= rw.refunded_max
        holds = holds and (rw.drawn_max is None or r.drawn <= rw.drawn_max)
    if not holds:
        return None
    if r is not None and rw is not None:
        r = replace(r, drawn=r.drawn + rw.add, lost=rw.lost, refunded=r.refunded + rw.refund)
    return replace(
        s,
        drawn=s.drawn + w.add,
        lost=w.lost,
        refunded=s.refunded + w.refund,
        highs=s.highs + (1 if w.saw_high else 0),
        requests=r,
    )


def fresh(config: GovernorConfig = RPM, t: Decimal = ZERO) -> ShardState:
    return initial_shard(config, 1, 0, t)


def test_a_shard_carries_its_request_bucket_in_the_same_form() -> None:
    s = fresh(replace(RPM, initial_fill=0.5), Decimal(7))
    r = s.requests
    assert r is not None and r.rate == 10 and r.capacity == 600 and r.base_credit == 300
    assert r.base_time == s.base_time and r.recovery == micro(0.1)
    assert fresh(GovernorConfig(300_000)).requests is None


def test_one_write_draws_tokens_and_a_request_and_refuses_if_either_is_short() -> None:
    s = fresh(replace(RPM, initial_fill=0.0))
    t = Decimal(1)  # 5,000 tokens, 10 requests
    w = plan_write(s, t, add=50, requests=1)
    assert w.wait_s is None and w.requests is not None and w.requests.add == 1
    after = apply(s, w)
    assert after is not None and after.requests is not None
    assert after.requests.tokens(t) == 9 and after.tokens(t) == 4_950
    # the 11th request waits for the request bucket, not for the tokens
    s = replace(after, requests=replace(after.requests, drawn=Decimal(10)))
    short = plan_write(s, t, add=50, requests=1)
    assert short.wait_s == pytest.approx(0.1, abs=1e-5)
    # without requests (a debit), the request bucket is not touched
    assert plan_write(s, t, add=50, ahead=None).requests is None


def test_a_booking_is_ready_when_both_buckets_reach_it() -> None:
    s = fresh(replace(RPM, initial_fill=0.0))
    t = Decimal(1)
    ahead = booking_ahead(s, t, 60.0)
    # 20 units booked together: 1,000 tokens (there) and 20 requests (10 there, 10 in 1 s)
    w = plan_write(s, t, add=1_000, ahead=ahead, requests=20)
    after = apply(s, w)
    assert after is not None and after.requests is not None
    assert w.ready_at(after) == Decimal(2)  # the request bucket's time, the later one
    # a view with a newer rate function re-times the ticket by both credits
    ticket = Ticket(
        "g",
        0,
        1_000,
        Lane.HIGH,
        2.0,
        after.position,
        after.base_time,
        1.0,
        requests_position=after.requests.position,
        requests_mark=requests_mark(after.requests),
    )
    cut = rebase(after, Decimal("1.5"), micro(2_500), 5.0)
    assert cut is not None and cut.requests is not None
    assert cut.requests.cut_rate == 5  # cut in the same proportion as the tokens
    assert ticket_ready_at(ticket, cut) > 2.0
    assert ticket_from_doc(ticket_to_doc(ticket)) == ticket


def test_lost_keeps_the_request_bucket_at_its_capacity_after_idle() -> None:
    s = fresh(replace(RPM, initial_fill=1.0))  # full: 600 requests
    t = Decimal(3_600)  # an hour of refill, 36,000 requests' worth
    w = plan_write(s, t, add=50, requests=1)
    after = apply(s, w)
    assert after is not None and after.requests is not None
    assert after.requests.tokens(t) == 599


def test_writers_a_few_draws_apart_on_a_full_bucket_do_not_make_each_other_fail() -> None:
    """With requests binding, the token bucket sits full and every write raises its ``lost``.
    Raised exactly (as without a request bucket), a writer whose view is a draw older raises it
    higher than one whose view is newer, and the newer one's write then fails; on the 1% grid
    both write the same value and both hold (unless the two values straddle a multiple of the
    quantum: a chance of a draw in 1% of the capacity, here neither bucket's)."""

    def race(config: GovernorConfig) -> tuple[ShardState | None, ShardState]:
        s0 = fresh(config)  # full, at t=0
        ahead = booking_ahead(s0, ZERO, 900.0)
        n = 0 if config.rpm is None else 1

        def plan(s: ShardState, t: str) -> ShardWrite:
            return plan_write(s, Decimal(t), add=50, ahead=ahead, grid_s=0.5, requests=n)

        s1 = apply(s0, plan(s0, "10.2"))  # one writer drew; another still holds the view s0
        assert s1 is not None
        older, newer = plan(s0, "20.7"), plan(s1, "20.7")  # both see the bucket full again
        landed = apply(s1, older)
        assert landed is not None
        return apply(landed, newer), landed

    exact, _ = race(GovernorConfig(300_000, 1.0, initial_fill=1.0))
    assert exact is None  # without a request bucket: the newer view's write fails, as before
    both, landed = race(replace(RPM, initial_fill=1.0))
    assert both is not None  # with one: it holds
    # the quantum costs at most 1% of the capacity, and only while the bucket is full
    assert landed.tokens(Decimal("20.7")) >= RPM.bucket_capacity * 0.99 - 50


def test_a_released_request_goes_back_only_within_its_bound() -> None:
    s = fresh(replace(RPM, initial_fill=0.0))
    t = Decimal(1)
    w = plan_write(s, t, add=50, requests=1)
    after = apply(s, w)
    assert after is not None and after.requests is not None
    mark = requests_mark(after.requests)
    release = Refund(0, Decimal(50), after.refunded, after.highs, requests=1, requests_mark=mark)
    # soon after: it rides on the next draw, which then takes no request net
    w2 = plan_write(after, Decimal(2), add=50, refund=release, requests=1, margin_s=1.0)
    assert w2.requests is not None and w2.requests.refund == 1
    again = apply(after, w2)
    assert again is not None and again.requests is not None
    assert again.requests.refunded == 1 and again.requests.drawn == 2
    # a minute later the bucket would have filled without the draw: the request is dropped
    late = plan_write(after, Decimal(70), add=50, refund=release, requests=1)
    assert late.requests is not None and late.requests.refund == 0
    assert late.requests.dropped == 1  # and never will: the client drops it
    assert w2.requests.dropped == 0


def test_the_shards_view_shows_the_request_bucket() -> None:  # half full
    view = view_of([fresh(replace(RPM, initial_fill=0.5))], RPM, ZERO)
    snap = view.snapshot
    assert snap.request_rate == 10 and snap.request_capacity == 600
    assert snap.requests_available == 300 and snap.effective_request_rate == 10
    assert view_of([fresh(GovernorConfig(300_000))], RPM, ZERO).snapshot.request_rate is None


# ---------------------------------------------------------------- never over-granted


@dataclass
class Model:
    """One model's governor as the DynamoDB adapter drives it (one client: plan, apply): its
    grants as the over-grant check takes them, (asked, seen, amount)."""

    config: GovernorConfig
    horizon_s: float
    state: ShardState
    pending: Refund | None = None
    tickets: list[tuple[float, float, Grant]] = field(default_factory=list)  # ready, asked
    requests: list[tuple[float, float, int]] = field(default_factory=list)
    tokens: list[tuple[float, float, int]] = field(default_factory=list)
    held: list[tuple[float, float, Grant]] = field(default_factory=list)  # granted, not settled

    def collect(self, now: float) -> None:
        """Tickets ready by ``now`` are presented: granted at their ready time."""
        for ready, asked, grant in [x for x in self.tickets if x[0] <= now]:
            self.tickets.remove((ready, asked, grant))
            self.held.append((asked, ready, grant))

    def draw(self, now: float, amount: int) -> None:
        t = micro(now)
        s = self.state
        plan = plan_write(
            s,
            t,
            add=amount,
            ahead=booking_ahead(s, t, self.horizon_s),
            refund=self.pending,
            grid_s=0.5,
            requests=1,
        )
        if plan.wait_s is not None:
            return
        after = apply(s, plan)
        assert after is not None  # planned on the item as it is
        self.state = after
        if self.pending is not None:  # what rode on the write is back
            rw = plan.requests
            done = 0 if rw is None else int(rw.refund) + rw.dropped
            left = max(0, self.pending.requests - done)
            amount_left = self.pending.amount - plan.refund
            self.pending = (
                replace(self.pending, amount=amount_left, requests=left)
                if left > 0 or amount_left > 0
                else None
            )
        assert after.requests is not None
        grant = Grant(
            amount,
            Lane.HIGH,
            now,
            0,
            after.refunded,
            after.highs,
            requests=1,
            requests_mark=requests_mark(after.requests),
        )
        ready = plan.ready_at(after)
        if ready is None:
            self.held.append((now, now, grant))
        else:
            self.tickets.append((float(ready), now, grant))

    def settle(self, used_fraction: float, release: bool) -> None:
        """The oldest held grant's call: released (never went out), or used a fraction."""
        if not self.held:
            return
        asked, seen, grant = self.held.pop(0)
        used = 0 if release else max(1, int(grant.amount * used_fraction))
        if not release:
            self.requests.append((asked, seen, 1))
            self.tokens.append((asked, seen, used))
        if used < grant.amount:
            self.pending = Refund(  # one pending refund at a time (an older one is dropped)
                0,
                Decimal(grant.amount - used),
                grant.refunded,
                grant.highs,
                requests=1 if release else 0,
                requests_mark=grant.requests_mark if release else None,
            )

    def throttle(self, now: float) -> None:
        t = micro(now)
        cut = rebase(
            self.state, t, cut_rate(self.config, 1, self.state, t), self.config.throttle_cooldown_s
        )
        if cut is not None:
            self.state = cut

    def check(self) -> None:
        """Neither bucket ever gave more than it held at the start plus its refill."""
        c = self.config
        assert c.request_rate is not None and c.request_capacity is not None
        for grants, initial, capacity, rate in (
            (
                self.requests,
                c.initial_fill * c.request_capacity,
                c.request_capacity,
                c.request_rate,
            ),
            (self.tokens, c.initial_fill * c.bucket_capacity, c.bucket_capacity, c.rate),
        ):
            over = over_granted(grants, 0.0, initial, capacity, rate)
            assert over <= over_grant_tolerance(rate) + 1e-6, (c, over)


OPS = st.lists(
    st.tuples(
        st.sampled_from(["draw", "draw", "burst", "settle", "release", "idle", "throttle"]),
        st.integers(0, 1),  # which model
        st.floats(0, 0.5),  # time passing before it
        st.integers(1, 3_000),  # a draw's quota tokens
        st.floats(0.05, 1.0),  # a true-up's fraction used
    ),
    max_size=120,
)


#: a grant of a full bucket released after the bucket could have filled without it, between
#: two bursts: giving that request back would mint one (sonnet's bucket starts full at fill 0)
RELEASED_LATE = [
    ("draw", 1, 0.5, 100, 1.0),
    ("idle", 1, 0.0, 100, 1.0),
    ("burst", 1, 0.0, 100, 1.0),
    ("release", 1, 0.0, 100, 1.0),
    ("burst", 1, 0.0, 100, 1.0),
]


@settings(max_examples=150, deadline=None)
@given(ops=OPS, fill=st.floats(0, 1), horizon=st.sampled_from([0.0, 2.0, 30.0]))
@example(ops=RELEASED_LATE, fill=0.0, horizon=0.0)
def test_two_models_never_over_grant_either_bucket(
    ops: list[tuple[str, int, float, int, float]], fill: float, horizon: float
) -> None:
    """Random draws and bursts of draws (booking tickets within the horizon), true-ups,
    releases, idles and throttles on two models' governors with their own tpm, rpm and
    burndown (the draws are in quota tokens: a burndown of 5 makes them output-heavy): over
    every window, neither bucket of either gave more than it held plus its refill."""
    haiku = GovernorConfig(60_000, 0.95, rpm=30, initial_fill=fill)
    sonnet = GovernorConfig(6_000, 0.9, rpm=6, output_burndown=5.0, initial_fill=1 - fill)
    models = [
        Model(haiku, horizon, initial_shard(haiku, 1, 0, ZERO)),
        Model(sonnet, horizon, initial_shard(sonnet, 1, 0, ZERO)),
    ]
    now = 0.0
    for op, which, gap, amount, used in ops:
        now += 30.0 if op == "idle" else gap
        model = models[which]
        model.collect(now)
        if op == "draw":
            model.draw(now, amount)
        elif op == "burst":  # a fleet drawing at once: 8 draws 10 ms apart
            for _ in range(8):
                now += 0.01
                model.collect(now)
                model.draw(now, amount)
        elif op in ("settle", "release"):
            model.settle(used, release=op == "release")
        elif op == "throttle":
            model.throttle(now)
    for model in models:
        model.collect(float("inf"))
        while model.held:
            model.settle(1.0, release=False)
        model.check()


@settings(max_examples=150, deadline=None)
@given(ops=OPS, fill=st.floats(0, 1))
@example(ops=RELEASED_LATE, fill=0.0)
def test_two_models_in_memory_never_over_grant_either_bucket(
    ops: list[tuple[str, int, float, int, float]], fill: float
) -> None:
    """The same on the in-memory governor (the simulator's and the reference)."""
    configs = [
        GovernorConfig(60_000, 0.95, rpm=30, initial_fill=fill),
        GovernorConfig(6_000, 0.9, rpm=6, output_burndown=5.0, initial_fill=1 - fill),
    ]
    govs = [InMemoryGovernor(c, now=0.0) for c in configs]
    requests: list[list[tuple[float, float, int]]] = [[], []]
    held: list[list[Grant]] = [[], []]
    now = 0.0
    for op, which, gap, amount, used in ops:
        now += 30.0 if op == "idle" else gap
        gov = govs[which]
        if op in ("draw", "burst"):
            for _ in range(8 if op == "burst" else 1):  # a burst: 8 draws 10 ms apart
                now += 0.01 if op == "burst" else 0.0
                got = gov.draw(amount, Lane.HIGH, now)
                if got.granted and got.grant is not None:
                    held[which].append(got.grant)
        elif op in ("settle", "release") and held[which]:
            grant = held[which].pop(0)
            release = op == "release"
            gov.true_up(grant, 0 if release else max(1, int(grant.amount * used)), now)
            if not release:
                requests[which].append((grant.since, grant.since, 1))
        elif op == "throttle":
            gov.report_throttle(now)
    for which, config in enumerate(configs):
        requests[which] += [(g.since, g.since, 1) for g in held[which]]
        assert config.request_rate is not None and config.request_capacity is not None
        initial = config.initial_fill * config.request_capacity
        over = over_granted(
            requests[which], 0.0, initial, config.request_capacity, config.request_rate
        )
        assert over <= 1e-6, (which, over)


# ---------------------------------------------------------------- swarm fleet / GET /fleet


def test_the_fleet_view_shows_the_request_bucket_when_there_is_one(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from typing import Any

    from swarm.cli import ops
    from tests.unit.helpers import run_cli
    from tests.unit.test_service_flow import Plane

    plane = Plane()
    assert plane.batches.fleet(plane.clock.now())["governor"]["requests"] is None  # no rpm
    config = GovernorConfig(600_000, 0.95, rpm=1_000, initial_fill=1.0)
    gov = InMemoryGovernor(config, plane.clock.now())
    plane.batches = replace(plane.batches, governor=gov)
    gov.draw(50, Lane.HIGH, plane.clock.now())
    doc = plane.batches.fleet(plane.clock.now())  # GET /fleet's body
    assert doc["governor"]["requests"] == {
        "available": 949,
        "capacity": 950,
        "rate_rps": 15.833,
        "effective_rate_rps": 15.833,
    }

    class Client:
        def fleet(self) -> dict[str, Any]:
            return doc

    monkeypatch.setattr(ops, "client_of", lambda args: Client())
    code, out, _ = run_cli(["fleet"], capsys)
    assert code == 0
    # under its model's line
    assert out.splitlines()[1] == "  requests: 949 of 950 available, rate 15.83/15.83 requests/s"


# ---------------------------------------------------------------- swarm bench governor --rpm


def test_the_benchs_request_figures_catch_requests_beyond_the_bucket() -> None:
    from swarm.bench.governor import BenchConfig, BenchRun, UnitGrant, WorkerReport, summarize

    cfg = BenchConfig(rpm=60, share=1.0, initial_fill=0.0, min_tokens=50, max_tokens=50)
    assert cfg.governor_config().rpm == 60  # 1 request/s, 60 held

    def figures(times: list[float]) -> dict[str, object]:
        grants = [UnitGrant(t, t, 50, 50, 0) for t in times]
        report = WorkerReport(grants=grants, waiting=[(0.0, 20.0)])
        return summarize(cfg, BenchRun([report], 0.0, 20.0, 30.0, 35.0))

    paced = figures([float(t) for t in range(1, 21)])  # one a second: what the bucket gives
    assert paced["requests_over_granted"] == 0 and paced["requests_utilization"] == 1.0
    assert paced["binding_limit"] == "rpm" and paced["requests_busiest_minute"] == 20
    burst = figures([1.0] * 5)  # five at once after one second: four beyond the bucket
    assert burst["requests_over_granted"] == pytest.approx(4.0)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rpm", "0"], "--rpm: 0 is out of range"),
        (["--output-burndown", "0.5"], "--output-burndown"),
        (["--output-burndown", "30"], "its quota draw must fit in one shard's capacity"),
    ],
)
def test_the_benchs_bad_rpm_or_burndown_gets_a_clear_error(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.unit.helpers import run_cli

    code, _, err = run_cli(["bench", "governor", *args], capsys)
    assert code == 2 and message in err and "Traceback" not in err
