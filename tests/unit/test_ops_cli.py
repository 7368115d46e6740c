"""Operator CLI pieces that need no server: the progress bar, generated units, targets."""

from __future__ import annotations

import argparse
from decimal import Decimal
from pathlib import Path

import pytest

from swarm.cli.ops import generated_units, progress_line, usd_amount
from swarm.client import Target, json_body
from swarm.core.errors import InvalidInput


def status(
    done: int, dead: int, in_flight: int, pending: int, spent: int, running: int = 0
) -> dict[str, object]:
    return {
        "units": 400,
        "counts": {
            "completed": done,
            "dead_lettered": dead,
            "remainder": 0,
            "running": running,
            "queued": in_flight - running,
            "pending": pending,
        },
        "tokens": {"spent": spent, "budget": 6_000_000},
    }


def test_progress_line_shows_completion_flight_queue_and_spend() -> None:
    line = progress_line(status(100, 0, 50, 250, 1_200_000), width=20)
    assert line.startswith("[#####...............] 100/400 done")
    assert "0 running | 50 queued | 250 waiting | 1.20M of 6.00M tokens (20%)" in line


def test_progress_line_shows_spend_in_dollars_too() -> None:
    priced = {**status(100, 0, 50, 250, 1_200_000), "usd": {"spent": "1.234567"}}
    assert progress_line(priced).endswith("1.20M of 6.00M tokens (20%), $1.234567")
    in_dollars = {
        **status(100, 0, 50, 250, 1_200_000),
        "tokens": {"spent": 1_200_000},
        "usd": {"spent": "1.250000", "budget": "5.000000", "reserved": "0.5",
                "available": "3.25"},
    }  # fmt: skip
    assert progress_line(in_dollars).endswith("$1.250000 of $5.000000 (25%), 1.20M tokens")


@pytest.mark.parametrize(
    ("text", "ok"), [("1.5", True), ("0.000001", True), ("0", False), ("1.0000001", False)]
)
def test_dollar_amounts_on_the_command_line_are_exact(text: str, ok: bool) -> None:
    if ok:
        assert usd_amount(text) == Decimal(text)
    else:
        with pytest.raises(argparse.ArgumentTypeError):
            usd_amount(text)


def test_a_dollar_amount_is_sent_as_the_exact_json_number() -> None:
    body = json_body({"top_up_usd": Decimal("0.100000"), "x": [Decimal("12.5")]})
    assert body == b'{"top_up_usd": 0.100000, "x": [12.5]}'


def test_progress_line_of_a_batch_being_opened_shows_the_units_written() -> None:
    doc = {**status(0, 0, 0, 400, 0), "state": "opening", "units_written": 150}
    assert progress_line(doc) == "opening: 150/400 units written | nothing admitted yet"


def test_generated_units_look_like_lab_61() -> None:
    units = generated_units(400, seed=0, min_tokens=8_000, max_tokens=16_000)
    assert len({u["unit_id"] for u in units}) == 400
    assert all(8_000 <= u["projected_tokens"] <= 16_000 for u in units)
    assert units == generated_units(400, seed=0, min_tokens=8_000, max_tokens=16_000)


def test_a_missing_local_target_explains_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="swarm local up"):
        Target.load(tmp_path / "nope.json")
    target = Target("http://127.0.0.1:1", "us-east-1", "/swarm/local/drain", "http://x", "demo")
    target.save(tmp_path / "t.json")
    assert Target.load(tmp_path / "t.json") == target


def test_the_waiting_calls_are_listed_one_a_line_with_how_to_decide() -> None:
    from swarm.cli.ops import approvals_lines

    doc = {
        "batch_id": "b-1",
        "waiting": [
            {
                "unit_id": "u-1",
                "toolUseId": "t1-1-0",
                "tool": "notes_write",
                "input": {"name": "plan", "value": "x" * 300},
                "turn": 1,
                "requested_at": 10.0,
                "waited_s": 95.4,
                "deciders": "tenant",
            },
            {
                "unit_id": "u-2",
                "toolUseId": "t1-1-0",
                "tool": "notes_publish",
                "input": {},
                "turn": 1,
                "requested_at": 11.0,
                "waited_s": 94.0,
                "deciders": ["swarm-operator-a", "swarm-operator-b"],
            },
        ],
    }
    head, call, other, how = approvals_lines(doc)
    assert head == "batch b-1: 2 tool call(s) wait for a decision"
    assert call.startswith("  u-1  t1-1-0  notes_write  decided by tenant  waited 95 s  {")
    assert call.endswith("...") and len(call) < 220  # a long input is cut
    # whose turn it is: a tool naming its own deciders shows them
    assert other == (
        "  u-2  t1-1-0  notes_publish  decided by swarm-operator-a,swarm-operator-b  "
        "waited 94 s  {}"
    )
    assert "swarm approve b-1 UNIT TOOLUSE" in how and "swarm reject b-1" in how
    assert approvals_lines({"batch_id": "b-1", "waiting": []}) == [
        "batch b-1: no tool call waits for a decision"
    ]
