"""The local stack's watchdog: a stall of the process and a request in flight too long are named
in its log, the latter with the frames every thread is in."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from swarm.local.watchdog import Watchdog


def _held_lock_waiter(lock: threading.Lock, entered: threading.Event) -> None:
    entered.set()
    with lock:  # waits until the test lets go
        pass


def test_a_request_in_flight_too_long_is_logged_once_with_the_stacks_of_every_thread(
    caplog: pytest.LogCaptureFixture,
) -> None:
    dog = Watchdog(request_s=30.0)
    lock = threading.Lock()
    entered = threading.Event()
    caplog.set_level(logging.WARNING, logger="swarm.local")
    with lock:
        waiter = threading.Thread(target=_held_lock_waiter, args=(lock, entered), name="api-7")
        waiter.start()
        entered.wait()
        with dog.request("GET /batches/b-1"):
            now = time.monotonic()
            dog.check(0.0, now + 29.0)
            assert caplog.records == []  # not yet overdue
            dog.check(0.0, now + 31.0)
            dog.check(0.0, now + 60.0)  # reported once
    waiter.join()
    [record] = caplog.records
    text = record.getMessage()
    assert '"request": "GET /batches/b-1"' in text
    assert "_held_lock_waiter" in text  # the frame that waits for the lock is named


def test_a_request_done_in_time_and_a_short_overrun_are_not_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    dog = Watchdog(stall_s=5.0, request_s=30.0)
    caplog.set_level(logging.WARNING, logger="swarm.local")
    with dog.request("GET /batches/b-1"):
        pass
    dog.check(4.9, time.monotonic() + 3600)
    assert caplog.records == []


def test_a_stalled_process_is_logged_with_how_late_the_watchdog_woke(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="swarm.local")
    Watchdog(stall_s=5.0).check(12.34, time.monotonic())
    [record] = caplog.records
    assert record.getMessage() == 'process stalled {"late_s": 12.3}'
