"""Time budgets derived at synth: how long a state machine's Task can take in the worst case.

Step Functions' retry semantics (Amazon States Language, "Retry"): a retrier whose
``ErrorEquals`` matches an error retries the state up to ``MaxAttempts`` times (default 3; 0:
never); the pause before its n-th retry (n = 1, 2, ...) is ``IntervalSeconds`` (default 1) x
``BackoffRate`` (default 2.0) ** (n - 1), at most ``MaxDelaySeconds`` when given; with
``JitterStrategy: FULL`` the pause is a random time between 0 and that, so the worst case is the
pause itself. Each retrier counts its own retries, so errors that alternate between retriers can
spend every retrier's ``MaxAttempts``: the worst case is the first attempt plus all of them.

An attempt lasts at most the Task's ``TimeoutSeconds`` or, for a Lambda invoke, the function's
timeout plus its INIT phase (Lambda limits INIT to 10 s on demand; a longer one is retried inside
the invocation's timeout), whichever is shorter. An attempt that Lambda throttles
(``Lambda.TooManyRequestsException``) is refused before the function runs: a retrier matching
only that error costs its pauses and a round trip per attempt, not a function run.

Pure arithmetic on the parsed definition (no CDK): :mod:`infra.config` runs it at synth.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: An Express execution (a Distributed Map's child here) runs for 5 minutes at most.
EXPRESS_MAX_SECONDS = 300
#: API Gateway's REST integration timeout (the default; raising it is a quota request).
API_GATEWAY_INTEGRATION_TIMEOUT_S = 29
#: Lambda's INIT phase on demand is limited to 10 s (then retried within the function timeout).
LAMBDA_INIT_MAX_S = 10
#: A throttled invoke's round trip: Lambda refuses it before the function runs.
THROTTLED_ATTEMPT_S = 1.0
#: Errors Lambda answers before the function runs (the invoke was not accepted).
BEFORE_RUN_ERRORS = frozenset({"Lambda.TooManyRequestsException"})

_PLACEHOLDER = re.compile(r"\$\{(\w+)\}")
_LAMBDA_INVOKE = "arn:aws:states:::lambda:invoke"


class TimingError(ValueError):
    """A state's worst case cannot be bounded (no timeout, a loop, a dynamic wait)."""


def parse_definition(text: str, values: Mapping[str, str]) -> dict[str, Any]:
    """An ASL file with ``${Name}`` replaced by ``values[Name]``; others are left as they are
    (an ARN placeholder inside a string stays a recognisable name)."""
    document: dict[str, Any] = json.loads(
        _PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), text)
    )
    return document


@dataclass(frozen=True)
class Retrier:
    errors: tuple[str, ...]
    interval_s: float = 1.0
    max_attempts: int = 3
    backoff_rate: float = 2.0
    max_delay_s: float | None = None

    @classmethod
    def of(cls, doc: Mapping[str, Any]) -> Retrier:
        return cls(
            errors=tuple(doc["ErrorEquals"]),
            interval_s=float(doc.get("IntervalSeconds", 1)),
            max_attempts=int(doc.get("MaxAttempts", 3)),
            backoff_rate=float(doc.get("BackoffRate", 2.0)),
            max_delay_s=(float(doc["MaxDelaySeconds"]) if "MaxDelaySeconds" in doc else None),
        )

    def pauses(self) -> list[float]:
        """The pause before each retry at its longest (a FULL jitter only shortens it)."""
        out = []
        for n in range(self.max_attempts):
            pause = self.interval_s * self.backoff_rate**n
            out.append(pause if self.max_delay_s is None else min(pause, self.max_delay_s))
        return out

    @property
    def before_run(self) -> bool:
        return set(self.errors) <= BEFORE_RUN_ERRORS


@dataclass(frozen=True)
class TaskBudget:
    """A Task's worst case: ``attempts`` full attempts of ``attempt_s`` each, ``throttled``
    refused ones, and the pauses between them."""

    state: str
    attempt_s: float
    attempt_bound: str  # where attempt_s comes from, for messages
    attempts: int
    throttled: int
    pauses_s: float

    @property
    def total_s(self) -> float:
        return self.attempts * self.attempt_s + self.throttled * THROTTLED_ATTEMPT_S + self.pauses_s

    def explain(self) -> str:
        parts = [f"{self.attempts} attempts x {self.attempt_s:g} s ({self.attempt_bound})"]
        if self.throttled:
            parts.append(f"{self.throttled} throttled x {THROTTLED_ATTEMPT_S:g} s")
        parts.append(f"{self.pauses_s:g} s of retry pauses")
        return f"{self.state}: {' + '.join(parts)} = {self.total_s:g} s"


def task_budget(
    name: str, state: Mapping[str, Any], function_timeouts: Mapping[str, tuple[float, str]]
) -> TaskBudget:
    """The worst case of one Task state. ``function_timeouts``: a Lambda ``FunctionName`` as it
    appears in the definition -> (its timeout in seconds, the key that sets it)."""
    bounds: list[tuple[float, str]] = []
    if "TimeoutSeconds" in state:
        if not isinstance(state["TimeoutSeconds"], int | float):
            raise TimingError(f"{name}: TimeoutSeconds is not a number")
        bounds.append((float(state["TimeoutSeconds"]), f"{name}.TimeoutSeconds"))
    resource = str(state.get("Resource", ""))
    # the optimized integration (not .waitForTaskToken: its wait outlasts the function) or the
    # function's ARN as the resource
    function = (
        state.get("Parameters", {}).get("FunctionName") if resource == _LAMBDA_INVOKE else resource
    )
    if function in function_timeouts:
        timeout, key = function_timeouts[function]
        bounds.append(
            (timeout + LAMBDA_INIT_MAX_S, f"{key}={timeout:g} + {LAMBDA_INIT_MAX_S} s of INIT")
        )
    if not bounds:
        raise TimingError(
            f"{name}: no TimeoutSeconds and no Lambda function of known timeout: its attempts "
            "cannot be bounded"
        )
    attempt_s, bound = min(bounds)
    attempts, throttled, pauses = 1, 0, 0.0
    for doc in state.get("Retry", []):
        retrier = Retrier.of(doc)
        pauses += sum(retrier.pauses())
        if retrier.before_run:
            throttled += retrier.max_attempts
        else:
            attempts += retrier.max_attempts
    return TaskBudget(name, attempt_s, bound, attempts, throttled, pauses)


@dataclass(frozen=True)
class MachineBudget:
    """The longest path through a (loop-free) state machine and its Tasks' budgets."""

    total_s: float
    tasks: tuple[TaskBudget, ...]

    def explain(self) -> str:
        return "; ".join(task.explain() for task in self.tasks)


def machine_budget(
    machine: Mapping[str, Any], function_timeouts: Mapping[str, tuple[float, str]]
) -> MachineBudget:
    """The worst case of a state machine (``StartAt`` and ``States``): the longest path from
    ``StartAt`` through Next, Choice and Catch edges. A loop, a Map or Parallel inside, or a Wait
    on a path cannot be bounded here and raise :class:`TimingError`."""
    states: Mapping[str, Any] = machine["States"]
    memo: dict[str, MachineBudget] = {}
    visiting: set[str] = set()

    def longest(name: str) -> MachineBudget:
        if name in memo:
            return memo[name]
        if name in visiting:
            raise TimingError(f"{name}: the machine loops, its time cannot be bounded")
        visiting.add(name)
        state = states[name]
        kind = state["Type"]
        own: tuple[TaskBudget, ...] = ()
        own_s = 0.0
        if kind == "Task":
            task = task_budget(name, state, function_timeouts)
            own, own_s = (task,), task.total_s
        elif kind == "Wait":
            if "Seconds" not in state:
                raise TimingError(f"{name}: a Wait without a fixed Seconds cannot be bounded")
            own_s = float(state["Seconds"])
        elif kind not in ("Pass", "Choice", "Succeed", "Fail"):
            raise TimingError(f"{name}: a {kind} state's time is not derived here")
        following = [c["Next"] for c in state.get("Choices", [])]
        following += [c["Next"] for c in state.get("Catch", [])]
        following += [state[key] for key in ("Next", "Default") if key in state]
        after = max((longest(n) for n in following), key=lambda b: b.total_s, default=None)
        visiting.discard(name)
        result = MachineBudget(
            own_s + (after.total_s if after else 0.0), own + (after.tasks if after else ())
        )
        memo[name] = result
        return result

    return longest(machine["StartAt"])
