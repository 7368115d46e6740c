"""The drain switch as the functions read it: cached, throttle-tolerant, and honest about when a
change has reached every cache."""

from __future__ import annotations

import datetime
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from botocore.exceptions import ClientError

from swarm.adapters.aws import SsmDrainSwitch


class Ssm:
    """GetParameter as SSM answers it; ``throttle`` makes the next reads fail as SSM does past
    its throughput."""

    def __init__(self, value: str, changed: float) -> None:
        self.value, self.changed = value, changed
        self.reads = 0
        self.throttle = False

    def get_parameter(self, Name: str) -> dict[str, Any]:
        self.reads += 1
        if self.throttle:
            error = {"Error": {"Code": "ThrottlingException", "Message": "Rate exceeded"}}
            raise ClientError(error, "GetParameter")  # type: ignore[arg-type]
        changed = datetime.datetime.fromtimestamp(self.changed, tz=datetime.UTC)
        return {"Parameter": {"Value": self.value, "LastModifiedDate": changed}}


def switch(ssm: Ssm, clock: list[float]) -> SsmDrainSwitch:
    return SsmDrainSwitch(ssm, "/swarm/dev/drain", ttl_s=5.0, clock=lambda: clock[0])


def test_reads_are_cached_for_the_ttl_and_fresh_reads_bypass_it() -> None:
    ssm, clock = Ssm("off", 1_000.0), [0.0]
    drain = switch(ssm, clock)
    assert [drain.draining() for _ in range(50)] == [False] * 50 and ssm.reads == 1
    ssm.value = "on"
    clock[0] = 4.9
    assert drain.draining() is False and ssm.reads == 1  # still the cached value
    clock[0] = 5.0
    assert drain.draining() is True and ssm.reads == 2
    ssm.value = "off"
    assert drain.draining(fresh=True) is False and ssm.reads == 3


def test_a_throttled_read_serves_the_last_value_and_fails_only_with_nothing_cached() -> None:
    ssm, clock = Ssm("on", 1_000.0), [0.0]
    drain = switch(ssm, clock)
    ssm.throttle = True
    with pytest.raises(ClientError):
        drain.draining()
    ssm.throttle = False
    assert drain.draining() is True
    ssm.throttle, clock[0] = True, 60.0
    assert drain.draining() is True and drain.draining(fresh=True) is True


def test_the_state_says_when_every_cache_has_seen_the_change() -> None:
    ssm, clock = Ssm("on", 1_000.0), [0.0]
    state = switch(ssm, clock).state()
    # the caches' lifetime, and as long again for an entry in the register of running work
    # written by a worker that read "off" just before its cache expired
    assert state.on and state.settled_at == 1_010.0
    assert not state.settled(1_009.9) and state.settled(1_010.0)


class SlowSsm(Ssm):
    """GetParameter taking a while (as under load): concurrent readers overlap it."""

    def __init__(self, value: str, changed: float) -> None:
        super().__init__(value, changed)
        self.lock = threading.Lock()

    def get_parameter(self, Name: str) -> dict[str, Any]:
        with self.lock:
            self.reads += 1
        time.sleep(0.05)
        if self.throttle:
            error = {"Error": {"Code": "ThrottlingException", "Message": "Rate exceeded"}}
            raise ClientError(error, "GetParameter")  # type: ignore[arg-type]
        changed = datetime.datetime.fromtimestamp(self.changed, tz=datetime.UTC)
        return {"Parameter": {"Value": self.value, "LastModifiedDate": changed}}


def read_at_once(drain: SsmDrainSwitch, threads: int = 100) -> list[bool | Exception]:
    start = threading.Barrier(threads)

    def read() -> bool | Exception:
        start.wait()
        try:
            return drain.draining()
        except Exception as e:
            return e

    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(lambda _: read(), range(threads)))


def test_a_hundred_threads_of_a_cold_start_make_one_read() -> None:
    ssm, clock = SlowSsm("on", 1_000.0), [0.0]
    assert read_at_once(switch(ssm, clock)) == [True] * 100
    assert ssm.reads == 1


def test_a_hundred_threads_at_the_caches_expiry_make_one_read_and_a_throttle_keeps_the_value() -> (
    None
):
    ssm, clock = SlowSsm("off", 1_000.0), [0.0]
    drain = switch(ssm, clock)
    assert drain.draining() is False and ssm.reads == 1
    clock[0] = 6.0  # expired
    ssm.value = "on"
    assert read_at_once(drain) == [True] * 100 and ssm.reads == 2
    clock[0] = 12.0  # expired again, and SSM is throttling: the cached value stands
    ssm.throttle = True
    assert read_at_once(drain) == [True] * 100
    assert ssm.reads == 3  # one failed read; the others are served the last value
    clock[0] = 13.1  # a fifth of the cache's lifetime later, one reader tries again
    ssm.throttle = False
    ssm.value = "off"
    assert drain.draining() is False and ssm.reads == 4


def test_any_failed_read_with_a_cached_value_keeps_it() -> None:
    ssm, clock = Ssm("on", 1_000.0), [0.0]
    drain = switch(ssm, clock)
    assert drain.draining() is True
    clock[0] = 60.0
    ssm.get_parameter = lambda Name: (_ for _ in ()).throw(ConnectionError("unreachable"))  # type: ignore[method-assign]
    assert drain.draining() is True


def test_a_value_is_dated_from_when_its_read_was_sent() -> None:
    # a read sent before the change and answered after it is at most ttl old at "settled"
    ssm, clock = Ssm("off", 1_000.0), [0.0]

    def slow(Name: str) -> dict[str, Any]:
        clock[0] += 3.0  # the answer takes 3 s
        return Ssm.get_parameter(ssm, Name)

    ssm.get_parameter = slow  # type: ignore[method-assign]
    drain = switch(ssm, clock)
    drain.draining()  # sent at 0, answered at 3
    ssm.value = "on"
    clock[0] = 5.0  # 5 s after it was sent: expired, though answered 2 s ago
    assert drain.draining() is True
