"""infra/timing.py: a state machine's worst case from its ASL, per Step Functions' retry rules."""

from __future__ import annotations

from typing import Any

import pytest

from infra.timing import (
    LAMBDA_INIT_MAX_S,
    Retrier,
    TimingError,
    machine_budget,
    parse_definition,
    task_budget,
)

INVOKE = "arn:aws:states:::lambda:invoke"
FN = {"${Fn}": (30.0, "fanout.timeout_seconds")}


def _task(**fields: Any) -> dict[str, Any]:
    return {"Type": "Task", "Resource": INVOKE, "Parameters": {"FunctionName": "${Fn}"}, **fields}


def test_a_retriers_pauses_follow_the_documented_defaults_backoff_and_cap() -> None:
    # IntervalSeconds 1, MaxAttempts 3, BackoffRate 2.0 when left out
    assert Retrier.of({"ErrorEquals": ["States.ALL"]}).pauses() == [1, 2, 4]
    # the n-th pause is IntervalSeconds x BackoffRate^(n-1), at most MaxDelaySeconds
    capped = {"ErrorEquals": ["X"], "IntervalSeconds": 5, "MaxAttempts": 4, "BackoffRate": 3}
    assert Retrier.of({**capped, "MaxDelaySeconds": 30}).pauses() == [5, 15, 30, 30]
    assert Retrier.of(capped).pauses() == [5, 15, 45, 135]
    # MaxAttempts 0 never retries; a FULL jitter only shortens a pause (the worst case is the same)
    assert Retrier.of({"ErrorEquals": ["X"], "MaxAttempts": 0}).pauses() == []
    assert Retrier.of({**capped, "JitterStrategy": "FULL"}).pauses() == [5, 15, 45, 135]


def test_a_tasks_worst_case_spends_every_retrier_at_full_length() -> None:
    task = _task(
        Retry=[
            {"ErrorEquals": ["Lambda.TooManyRequestsException"], "MaxAttempts": 2},
            {"ErrorEquals": ["Lambda.ServiceException"], "MaxAttempts": 1},
            {"ErrorEquals": ["States.TaskFailed"], "IntervalSeconds": 2, "MaxAttempts": 2},
        ]
    )
    budget = task_budget("T", task, FN)
    # the first run and 1 + 2 retries that may follow a whole run, each the function's timeout
    # plus INIT; the 2 throttles are refused before the function runs (1 s each)
    assert (budget.attempts, budget.attempt_s, budget.throttled) == (4, 30 + LAMBDA_INIT_MAX_S, 2)
    assert budget.pauses_s == (1 + 2) + 1 + (2 + 4)
    assert budget.total_s == 4 * 40 + 2 * 1 + 10
    assert "fanout.timeout_seconds=30" in budget.explain()


def test_a_tasks_own_timeout_bounds_an_attempt_when_shorter() -> None:
    assert task_budget("T", _task(TimeoutSeconds=12), FN).attempt_s == 12
    assert task_budget("T", _task(TimeoutSeconds=120), FN).attempt_s == 40
    # a callback's wait is not the function's run: only its own TimeoutSeconds bounds it
    callback = {**_task(), "Resource": f"{INVOKE}.waitForTaskToken"}
    with pytest.raises(TimingError):
        task_budget("T", callback, FN)
    assert task_budget("T", {**callback, "TimeoutSeconds": 300}, FN).attempt_s == 300
    # a function's ARN as the resource
    assert task_budget("T", {"Type": "Task", "Resource": "${Fn}"}, FN).attempt_s == 40
    # a Task of another resource with a timeout of its own
    other = {"Type": "Task", "Resource": "arn:aws:states:::sqs:sendMessage", "TimeoutSeconds": 5}
    assert task_budget("T", other, FN).total_s == 5


def test_what_cannot_be_bounded_is_refused() -> None:
    # an unknown function without TimeoutSeconds
    unknown = {**_task(), "Parameters": {"FunctionName": "other"}}
    with pytest.raises(TimingError, match="cannot be bounded"):
        task_budget("T", unknown, FN)
    # a loop
    looping = {"StartAt": "A", "States": {"A": {"Type": "Pass", "Next": "A"}}}
    with pytest.raises(TimingError, match="loops"):
        machine_budget(looping, FN)
    # a Wait on a path read from the input
    waiting = {"StartAt": "A", "States": {"A": {"Type": "Wait", "SecondsPath": "$.s", "End": True}}}
    with pytest.raises(TimingError, match="Wait"):
        machine_budget(waiting, FN)


def test_a_machines_worst_case_is_its_longest_path_catches_included() -> None:
    machine = {
        "StartAt": "First",
        "States": {
            "First": _task(
                Retry=[{"ErrorEquals": ["States.TaskFailed"], "MaxAttempts": 0}],
                Catch=[{"ErrorEquals": ["States.ALL"], "Next": "Slow"}],
                Next="Done",
            ),
            "Slow": {"Type": "Wait", "Seconds": 50, "Next": "Done"},
            "Done": {"Type": "Succeed"},
        },
    }
    budget = machine_budget(machine, FN)
    assert budget.total_s == 40 + 50
    assert [task.state for task in budget.tasks] == ["First"]


def test_placeholders_are_substituted_and_unknown_ones_kept() -> None:
    text = '{"A": ${Num}, "B": "${Arn}"}'
    assert parse_definition(text, {"Num": "7"}) == {"A": 7, "B": "${Arn}"}
