"""The drain switch as the functions read it: cached, throttle-tolerant, and honest about when a
change has reached every cache."""

from __future__ import annotations

import datetime
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
    assert state.on and state.settled_at == 1_005.0
    assert not state.settled(1_004.9) and state.settled(1_005.0)
