"""The model plane: what a worker calls to run a unit, behind one small port.

* :class:`SimulatedModelPlane`: a stand-in with its own TPM quota (a sliding 60-second window)
  that throttles when exceeded, latency proportional to tokens, and a seeded per-attempt failure
  rate. It is what makes "zero throttles caused by our own fleet" and backpressure measurable
  without an account. A *storm* lowers its quota for a while (a bystander on the same account).
* ``swarm.adapters.bedrock.BedrockModelPlane``: Amazon Bedrock's Converse API; tokens from the
  response's usage; ``ThrottlingException`` becomes :class:`ModelThrottled`.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from swarm.core.errors import InvalidInput, SwarmError
from swarm.core.governor import BucketState, GovernorConfig
from swarm.core.model import Lane


@dataclass(frozen=True)
class ModelRequest:
    run_id: str
    unit_id: str
    attempt: int
    projected_tokens: int
    input: str = ""


@dataclass(frozen=True)
class ModelResult:
    succeeded: bool
    tokens: int  # billed tokens (input + output), failed calls included
    output: str = ""
    error: str = ""


class ModelThrottled(SwarmError):
    """The model plane refused the call for quota; nothing was billed."""


class ModelPlane(Protocol):
    def invoke(self, request: ModelRequest) -> ModelResult: ...


class SimulatedModelPlane:
    """A model endpoint with a TPM quota, enforced the way providers do: a token bucket holding one
    minute of quota, refilled continuously. A fleet whose governor runs below the quota with a
    bucket no larger than the quota's can never be throttled by it (the governor's bucket never
    holds more than the model's), so every throttle seen here is a quota storm or a bystander.

    Thread-safe; the clock and sleep are injected so tests and the local runtime control time.
    """

    def __init__(
        self,
        quota_tpm: int,
        failure_rate: float = 0.0,
        seed: int = 0,
        seconds_per_1k_tokens: float = 0.0,
        clock: Callable[[], float] | None = None,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        if not 0 <= failure_rate < 1:
            raise InvalidInput("SIM_MODEL_FAILURE_RATE", f"must be in [0, 1), got {failure_rate}")
        self.quota_tpm = quota_tpm
        self.failure_rate = failure_rate
        self.seed = seed
        self.seconds_per_1k_tokens = seconds_per_1k_tokens
        self._clock = clock or time.time
        self._sleep = sleep or time.sleep
        self._config = self._quota(quota_tpm)
        self._bucket = BucketState.fresh(self._config, self._clock())
        self._lock = threading.Lock()
        self._storm_until: float | None = None
        self.calls = 0
        self.throttles = 0
        self.tokens_billed = 0

    @staticmethod
    def _quota(quota_tpm: int) -> GovernorConfig:
        try:
            return GovernorConfig(quota_tpm=quota_tpm, share=1.0, initial_fill=1.0)
        except InvalidInput as e:
            raise InvalidInput("SIM_MODEL_QUOTA_TPM", e.message) from None

    def storm(self, quota_tpm: int, until: float) -> None:
        """Lower the quota to ``quota_tpm`` until ``until``: a quota storm, or a bystander on the
        same account eating the difference."""
        with self._lock:
            now = self._clock()
            self._config = self._quota(quota_tpm)
            tokens = min(self._bucket.available(self._config, now), self._config.bucket_capacity)
            self._bucket = BucketState(tokens=tokens, updated_at=now)
            self._storm_until = until

    def _end_storm(self, now: float) -> None:
        if self._storm_until is not None and now >= self._storm_until:
            until = self._storm_until
            tokens = self._bucket.available(self._config, until)
            self._config = self._quota(self.quota_tpm)
            self._bucket = BucketState(tokens=tokens, updated_at=until)
            self._storm_until = None

    def invoke(self, request: ModelRequest) -> ModelResult:
        now = self._clock()
        with self._lock:
            self.calls += 1
            self._end_storm(now)
            try:
                self._bucket, draw = self._bucket.draw(
                    self._config, request.projected_tokens, Lane.HIGH, now
                )
            except InvalidInput:  # larger than the whole (storm) quota
                draw = None
            if draw is None or not draw.granted:
                self.throttles += 1
                raise ModelThrottled(f"simulated quota of {self._config.quota_tpm:,} TPM exceeded")
            self.tokens_billed += request.projected_tokens
        if self.seconds_per_1k_tokens:
            self._sleep(request.projected_tokens / 1000 * self.seconds_per_1k_tokens)
        key = f"{self.seed}:{request.run_id}:{request.unit_id}:{request.attempt}"
        failed = random.Random(key).random() < self.failure_rate
        return ModelResult(
            succeeded=not failed,
            tokens=request.projected_tokens,
            output="" if failed else f"simulated output for {request.unit_id}",
            error="simulated failure" if failed else "",
        )
