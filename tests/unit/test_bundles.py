"""Bundles (swarm.core.lanes.bundle): units due together travel as one lane message, so they
reach one worker invocation together whatever SQS's pollers do; and their message (codec)."""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarm.core import codec
from swarm.core.errors import InvalidInput
from swarm.core.governor import Ticket
from swarm.core.lanes import Bundle, Bundling, QueuedUnit, bundle
from swarm.core.records import Lane


def unit(name: str, run: str = "r-1", tenant: str = "acme", lane: Lane = Lane.NORMAL) -> QueuedUnit:
    return QueuedUnit(run, name, tenant, lane, 0, 10_000, input=f"input of {name}")


def ids(bundles: list[Bundle]) -> list[tuple[list[str], float]]:
    return [([u.unit_id for u in b.units], b.delay_s) for b in bundles]


def test_units_due_within_the_window_go_together_delayed_until_the_last_is_due() -> None:
    units = [unit(f"u{i}") for i in range(6)]
    delays = [0.0, 2.5, 5.0, 7.5, 10.0, 12.5]
    # a 5 s window: a bundle holds the units due within 5 s of its first
    assert ids(bundle(units, delays, window_s=5, max_units=10)) == [
        (["u0", "u1", "u2"], 5.0),
        (["u3", "u4", "u5"], 12.5),
    ]
    # at most max_units each
    assert ids(bundle(units, delays, window_s=60, max_units=4)) == [
        (["u0", "u1", "u2", "u3"], 7.5),
        (["u4", "u5"], 12.5),
    ]
    # max_units 1, or a window of 0 with distinct delays: each alone, with its own delay
    assert ids(bundle(units, delays, 60, 1)) == [([f"u{i}"], d) for i, d in enumerate(delays)]
    assert ids(bundle(units, delays, 0, 10)) == [([f"u{i}"], d) for i, d in enumerate(delays)]


def test_a_bundle_deep_in_a_queue_gathers_for_a_fraction_of_its_wait_up_to_the_longest() -> None:
    # units due 4 s apart, from now to 200 s out; a 5 s window, stretched to a tenth of the
    # first unit's delay, at most 12 s
    units = [unit(f"u{i}") for i in range(51)]
    delays = [4.0 * i for i in range(51)]
    got = ids(bundle(units, delays, 5, 25, stretch=0.1, max_window_s=12))
    # near the front of the queue the window is 5 s: two units a bundle
    assert got[:2] == [(["u0", "u1"], 4.0), (["u2", "u3"], 12.0)]
    # 56 s out, a tenth is 5.6 s: still two units (4 s apart); 80 s out, 8 s: three
    by_first = {b[0][0]: b for b in got}
    assert by_first["u14"] == (["u14", "u15"], 60.0)
    assert by_first["u20"] == (["u20", "u21", "u22"], 88.0)
    # 160 s out, a tenth is 16 s, cut to the longest window: four units within 12 s
    assert by_first["u40"] == (["u40", "u41", "u42", "u43"], 172.0)
    assert got[-1] == (["u48", "u49", "u50"], 200.0)
    # without a stretch, the window alone, as before
    plain = ids(bundle(units, delays, 5, 25))
    assert all(len(b[0]) <= 2 for b in plain)
    with pytest.raises(InvalidInput, match="max_window_s >= window_s"):
        bundle(units, delays, 5, 25, stretch=0.1, max_window_s=4)
    with pytest.raises(InvalidInput, match="stretch >= 0"):
        bundle(units, delays, 5, 25, stretch=-0.1)


def test_a_bundle_is_one_run_lane_and_tenant_in_the_order_units_are_due() -> None:
    units = [
        unit("a2", tenant="a"),
        unit("b1", tenant="b"),
        unit("a1", tenant="a"),
        unit("h1", lane=Lane.HIGH),
        unit("x1", run="r-2"),
    ]
    got = ids(bundle(units, [2.0, 1.0, 1.0, 0.0, 0.0], window_s=10, max_units=10))
    assert got == [(["a1", "a2"], 2.0), (["b1"], 1.0), (["h1"], 0.0), (["x1"], 0.0)]


def test_a_bundle_fits_a_message() -> None:
    big = [replace_input(unit(f"u{i}"), "x" * 100_000) for i in range(5)]
    bundles = bundle(big, [0.0] * 5, 10, 10, codec.bundle_size, 262_144)
    assert [len(b.units) for b in bundles] == [2, 2, 1]
    assert all(codec.bundle_size(b.units) <= 262_144 for b in bundles)


def replace_input(item: QueuedUnit, text: str) -> QueuedUnit:
    return replace(item, input=text)


def test_bad_arguments_are_named() -> None:
    with pytest.raises(InvalidInput, match="delays"):
        bundle([unit("u")], [], 1, 1)
    with pytest.raises(InvalidInput, match="max_units"):
        bundle([unit("u")], [0.0], 1, 0)
    with pytest.raises(InvalidInput, match="at least one unit"):
        Bundle(())


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["a", "b"]), st.floats(0, 100, allow_nan=False)),
        min_size=1,
        max_size=30,
    ),
    st.floats(0, 20, allow_nan=False),
    st.integers(1, 6),
    st.floats(0, 1, allow_nan=False),
    st.floats(0, 30, allow_nan=False),
)
def test_every_unit_goes_once_never_before_it_is_due_and_at_most_a_window_late(
    due: list[tuple[str, float]], window: float, most: int, stretch: float, more: float
) -> None:
    units = [unit(f"u{i}", tenant=t) for i, (t, _) in enumerate(due)]
    delays = [d for _, d in due]
    longest = window + more
    bundles = Bundling(window, most, stretch=stretch, max_window_s=longest).of(units, delays)
    sent = [u.unit_id for b in bundles for u in b.units]
    assert sorted(sent) == sorted(u.unit_id for u in units)  # each once
    own = {u.unit_id: d for u, d in zip(units, delays, strict=True)}
    for b in bundles:
        assert 1 <= len(b.units) <= most
        assert len({u.tenant for u in b.units}) == 1
        for u in b.units:
            # late by at most the window, or the stretch of its own wait, never the longest
            late = min(max(window, stretch * own[u.unit_id]), longest)
            assert own[u.unit_id] <= b.delay_s <= own[u.unit_id] + late


def test_a_bundles_message_carries_each_unit_as_it_was() -> None:
    ticket = Ticket("g", 0, 10_000, Lane.NORMAL, 5.0, Decimal(1), Decimal(0), 1.0, slot=True)
    waiting = replace(unit("u3"), tools_down_since=12.5)  # its tools unlisted since then
    units = (
        unit("u0"),
        replace(unit("u1"), ticket=ticket),
        replace_input(unit("u2"), ""),
        waiting,
    )
    body = codec.bundle_body(units)
    assert codec.parse_message(body) == units
    # shared fields once: smaller than the units' own messages together
    assert len(body) < sum(len(codec.message_body(u)) for u in units)
    # one unit's message is the unit's own, read by both parsers
    one = codec.bundle_body(units[:1])
    assert one == codec.message_body(units[0])
    assert codec.parse_message(one) == units[:1] and codec.parse_message_body(one) == units[0]
    with pytest.raises(InvalidInput, match="a bundle of 4 units"):
        codec.parse_message_body(body)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ('{"run_id": "r", "tenant": "t", "lane": "normal", "units": []}', "units"),
        ('{"run_id": "r", "tenant": "t", "lane": "normal", "units": [1]}', "units"),
        ('{"tenant": "t", "lane": "normal", "units": [{"unit_id": "u", "attempt": 0}]}', "run_id"),
        ('{"run_id": "r", "tenant": "t", "lane": "normal", "units": [{"attempt": 0}]}', "unit_id"),
    ],
)
def test_a_malformed_bundle_is_named(body: str, field: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        codec.parse_message(body)
    assert refused.value.field == field


def test_a_bundle_of_mixed_runs_is_refused() -> None:
    with pytest.raises(InvalidInput, match="share their run"):
        codec.bundle_body([unit("u0"), unit("u1", run="r-2")])
