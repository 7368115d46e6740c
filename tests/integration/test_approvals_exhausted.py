"""An exhausted batch's parked units on moto, through the real handlers (docs/agents.md, "Human
gates", "Budget, drain and exhaustion"): the closure puts them in the remainder with their calls
still waiting, and the sweeper, which keeps watching the batch, rejects the calls nobody decided
once their timeout has passed, then forgets the batch."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from swarm.core.records import RunState
from swarm.service.approvals import TIMEOUT_DECIDER
from tests.integration.plane import ControlPlane, ledger
from tests.integration.test_approvals import gated_unit
from tests.integration.test_sweeper import stop, sweep, watched


def test_an_exhausted_batchs_parked_calls_time_out_through_the_sweeper(
    plane: ControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a batch whose budget holds two of its three gated units: two park, one is refused
    body: dict[str, Any] = {"units": [gated_unit(f"u{i}") for i in range(3)], "budget": 40_000}
    status, doc, _ = plane.api("POST", "/batches", body)
    assert status == 201, doc
    batch_id: str = doc["batch_id"]
    plane.run_state_machine()
    plane.work()
    closed = plane.finalize(batch_id)
    run = ledger(plane).run(batch_id)
    assert run.state is RunState.EXHAUSTED and run.awaiting == 2, (closed, run)
    stop(plane, batch_id)  # its execution ended with the closure
    # Then its results hold the parked units in the remainder, marked as waiting
    summary = plane.client("s3").get_object(Bucket=plane.bucket, Key=closed["results_key"])
    units = json.loads(summary["Body"].read())["units"]
    parked = sorted(u for u, d in units.items() if d.get("awaiting_approval"))
    assert len(parked) == 2 and all(units[u]["state"] == "remainder" for u in parked), units
    # and the sweeper still watches the batch, due when the calls time out (24 hours)
    entry = watched(plane, batch_id)
    assert entry is not None and entry.sweep_at > time.time() + 23 * 3600, entry
    # When the sweeper runs before that, nothing is decided
    sweep(plane, monkeypatch, ahead=3600)
    assert ledger(plane).run(batch_id).awaiting == 2
    # When it runs after the timeout
    sweep(plane, monkeypatch, ahead=24 * 3600 + 600)
    # Then each waiting call was rejected by the timeout, the units joined the remainder with
    # their reservations released, and the batch is no longer watched
    for unit_id in parked:
        log = ledger(plane).read_log(batch_id, unit_id)
        assert log[-1]["type"] == "approval_decided" and log[-1]["by"] == TIMEOUT_DECIDER, log
    run = ledger(plane).run(batch_id)
    assert (run.state, run.awaiting, run.remainder, run.reserved) == (RunState.EXHAUSTED, 0, 3, 0)
    assert watched(plane, batch_id) is None
