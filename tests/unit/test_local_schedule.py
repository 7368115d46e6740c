"""The local stack plays EventBridge schedule rules (the sweeper's) and Lambda's SQS pollers'
long polls on the scaled clock."""

from __future__ import annotations

import threading

import pytest

from swarm.local.poller import MappingPoller, ScheduleRule, rate_seconds


def test_rate_expressions_in_seconds() -> None:
    assert rate_seconds("rate(1 minute)") == 60
    assert rate_seconds("rate(15 minutes)") == 900
    assert rate_seconds("rate(2 hours)") == 7200
    assert rate_seconds("rate(1 day)") == 86400
    with pytest.raises(ValueError, match=r"rate\(\.\.\.\) schedules only"):
        rate_seconds("cron(0 12 * * ? *)")


def test_a_schedule_runs_on_the_local_clock() -> None:
    rule = ScheduleRule(None, "rate(15 minutes)", "arn", "us-east-1", "1", threading.Event(), 10.0)
    assert rule.period_s == 90.0
    assert rule.event()["detail-type"] == "Scheduled Event"


@pytest.mark.parametrize(("scale", "wait_s"), [(1.0, 20), (10.0, 2), (30.0, 1), (1000.0, 1)])
def test_a_mapping_long_polls_20_s_on_the_deployed_clock(scale: float, wait_s: int) -> None:
    poller = MappingPoller(None, "uuid", "us-east-1", threading.Event(), scale)
    assert poller.long_poll_s == wait_s
