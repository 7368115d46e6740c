"""`swarm local up` and `down` around a stack's start: a stack stopped while it starts stops at
once (on SIGTERM, before it serves anything), and `up` says so in one line. A test suite's
cleanup after an early failure (ruff, say) relies on it: before, the stack went on starting,
unseen by `down`, and stopped only once it was ready."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from swarm.cli.local import _alive, down, running_pid, up
from swarm.client import LOCAL_TARGET_FILE
from swarm.core.errors import InvalidInput, SwarmError
from swarm.local.deploy import LocalOptions


def test_a_stack_stopped_while_it_starts_stops_on_sigterm_and_up_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "stack"
    outcome: dict[str, object] = {}

    def start() -> None:
        try:
            outcome["target"] = up(LocalOptions(), state, quiet=True)
        except SwarmError as e:
            outcome["error"] = str(e)

    starting = threading.Thread(target=start)
    starting.start()
    # Given a stack whose process runs (its pid written first) but serves nothing yet
    deadline = time.monotonic() + 60
    while (pid := running_pid(state)) is None:
        assert starting.is_alive() and time.monotonic() < deadline, outcome
        time.sleep(0.05)
    assert not (state / LOCAL_TARGET_FILE.name).exists()  # a start takes tens of seconds
    # (a second `up` there is refused, naming it)
    with pytest.raises(InvalidInput, match=rf"already up or starting \(pid {pid}\)"):
        up(LocalOptions(), state, quiet=True)
    # When it is brought down
    assert down(state)
    starting.join(60)
    # Then it stopped on SIGTERM (not killed after the wait), and `up` says what happened
    assert capsys.readouterr().out == f"local stack stopped (pid {pid})\n"
    assert not _alive(pid)
    assert outcome == {"error": "the local stack was stopped before it was ready"}
    assert "stopped while starting" in (state / "local.log").read_text()
    assert not (state / LOCAL_TARGET_FILE.name).exists() and running_pid(state) is None
