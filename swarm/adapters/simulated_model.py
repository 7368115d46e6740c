"""The simulated model plane (``MODEL_ADAPTER=simulated``): a stand-in for the model behind
the :class:`swarm.core.ports.ModelPlane` port (Bedrock's is :mod:`swarm.adapters.bedrock`).

It has its own TPM quota that throttles when exceeded, latency proportional to tokens, a usage
that differs from the caller's projection (under and over, capped by the request's
``max_tokens`` as a real provider caps its output), and a per-attempt failure rate. Usage and
failures are functions of ``(seed, unit id, attempt)`` alone (:func:`simulated_usage`,
:func:`attempt_fails`), so a test that chooses the seed knows every outcome in advance. It is
what makes "zero throttles caused by our own fleet", backpressure and honest settlement
measurable without an account. A *storm* lowers its quota for a while (a bystander on the same
account). It counts calls, throttles and tokens per run and keeps a log of every call it
received, with the time it received it and what it answered.

Its answers are functions of the prompt, the unit id and the attempt
(:func:`simulated_output`), so a test can compute what each unit's output must be. It treats a
prompt as Bedrock's adapter does: a Converse-shaped request that breaks Converse's rules, or an
input the reservation cannot pay for (its input tokens, :func:`simulated_input_tokens`, plus one
token of answer), fails the attempt at no cost without a call; the answer is bounded by the
reservation minus the input and by the request's own ``maxTokens``. A plain string is taken as
it is, even empty (the simulator and the in-memory tests run units without prompts; the API
refuses empty ones on every plane).

The prompt cache (``cache_share``, 0 by default: no cache tokens, every figure as before): a
share of each call's input tokens is its cacheable prefix. The first answered call of a prompt
(its :func:`prompt_digest`) writes it to the cache (``cacheWriteInputTokens``), every later one
reads it (``cacheReadInputTokens``); ``inputTokens`` is the rest, as Bedrock reports them apart.
The billed total does not change, only its kinds (and so its price: swarm.core.pricing).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Final

from swarm.adapters import simulated_agent
from swarm.core import prompts
from swarm.core.agent import billed_of
from swarm.core.errors import InvalidInput
from swarm.core.governor import BucketState, GovernorConfig
from swarm.core.ports import ConverseCall, ModelRequest, ModelResult, ModelThrottled
from swarm.core.records import Lane

#: the simulated usage is the projection times a factor drawn uniformly from this range
USAGE_SPREAD: Final = (0.6, 1.25)
#: the model id its results carry
MODEL_ID: Final = "simulated"
#: the simulated tokenizer: a token per this many bytes of UTF-8 text (rounded up)
BYTES_PER_INPUT_TOKEN: Final = 4
#: the first characters of the last user text an answer quotes
ANSWER_QUOTES_CHARS: Final = 60
#: the prompts the simulated cache remembers, the least recently used forgotten first
CACHE_PROMPTS: Final = 100_000


def answered_by(model_id: str | None) -> str:
    """The ``model_id`` a simulated answer reports: ``simulated``, and the model the request
    named (``simulated:<Bedrock id>``), so that results never pass for Bedrock's."""
    return MODEL_ID if model_id is None else f"{MODEL_ID}:{model_id}"


def attempt_fails(seed: int, unit_id: str, attempt: int, failure_rate: float) -> bool:
    """Whether the simulated model fails this attempt: a function of its arguments alone."""
    return random.Random(f"{seed}:{unit_id}:{attempt}").random() < failure_rate


def simulated_usage(seed: int, unit_id: str, attempt: int, projected: int) -> int:
    """The tokens the simulated model would use for this attempt with no cap: the projection
    times a factor in :data:`USAGE_SPREAD`, so estimates are wrong both ways, as in real life."""
    low, high = USAGE_SPREAD
    factor = random.Random(f"{seed}:{unit_id}:{attempt}:usage").uniform(low, high)
    return max(1, round(projected * factor))


def billed_tokens(
    seed: int, unit_id: str, attempt: int, projected: int, cap: int | None, input_tokens: int = 0
) -> int:
    """What the simulated model bills: its usage (at least the input and one token of answer),
    cut at ``cap`` (the reservation, or less when the request asks for a shorter answer)."""
    used = max(simulated_usage(seed, unit_id, attempt, projected), input_tokens + 1)
    return used if cap is None else min(used, cap)


def simulated_input_tokens(prompt: prompts.Prompt) -> int:
    """The input tokens the simulated model counts: one per :data:`BYTES_PER_INPUT_TOKEN` bytes
    of the prompt's text (:func:`swarm.core.prompts.prompt_text`), rounded up."""
    return math.ceil(len(prompts.prompt_text(prompt).encode()) / BYTES_PER_INPUT_TOKEN)


def simulated_output(prompt: prompts.Prompt, unit_id: str, attempt: int) -> str:
    """The simulated model's answer to an attempt that succeeds, a pure function of its
    arguments: ``answer to <unit id> (attempt <n>), prompt <digest>: <quote>``, where the digest
    is the first 16 hex digits of the SHA-256 of the prompt's JSON (keys sorted, compact, ASCII)
    and the quote the first :data:`ANSWER_QUOTES_CHARS` characters of its last user text."""
    canonical = json.dumps(prompt, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(canonical.encode()).hexdigest()[:16]
    last = prompt if isinstance(prompt, str) else _last_user_text(prompt)
    return f"answer to {unit_id} (attempt {attempt}), prompt {digest}: {last[:ANSWER_QUOTES_CHARS]}"


def prompt_digest(prompt: prompts.Prompt) -> str:
    """What identifies a prompt to the simulated cache: the SHA-256 of its canonical JSON."""
    return hashlib.sha256(
        json.dumps(prompt, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()


def cache_split(input_tokens: int, share: float, cached: bool) -> tuple[int, int, int]:
    """A call's input tokens as (input, cache read, cache write): ``share`` of them (rounded
    down) are the cacheable prefix, read when the prompt is ``cached`` already, else written."""
    prefix = math.floor(input_tokens * share)
    return input_tokens - prefix, prefix if cached else 0, 0 if cached else prefix


def _last_user_text(request: dict[str, Any]) -> str:
    users = [m for m in request.get("messages") or [] if m.get("role") == "user"]
    blocks = (users[-1].get("content") or []) if users else []
    return "\n".join(str(block.get("text", "")) for block in blocks)


@dataclass(frozen=True)
class ModelCall:
    """One call the simulated model received, as the model saw it (its own clock)."""

    run_id: str
    unit_id: str
    attempt: int
    projected: int
    received_at: float
    tokens: int  # billed; 0 when throttled
    throttled: bool
    succeeded: bool
    truncated: bool  # the usage reached the cap
    output: str = ""  # the answer it returned ("" when the attempt failed or was throttled)
    stop_reason: str = ""
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ModelCounters:
    calls: int = 0
    throttles: int = 0
    tokens_billed: int = 0

    def add(self, call: ModelCall) -> None:
        self.calls += 1
        self.throttles += call.throttled
        self.tokens_billed += call.tokens


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
        quotas: Mapping[str, int] | None = None,
        cache_share: float = 0.0,
    ) -> None:
        """``quota_tpm``: the quota of the calls that name no model (and of any model id
        ``quotas`` does not list); ``quotas``: each other model id's own quota (Bedrock's
        quotas are per model), a bucket of its own that storms do not touch."""
        if not 0 <= failure_rate < 1:
            raise InvalidInput("SIM_MODEL_FAILURE_RATE", f"must be in [0, 1), got {failure_rate}")
        if not 0 <= cache_share <= 1:
            raise InvalidInput("cache_share", f"must be in [0, 1], got {cache_share}")
        #: the share of a call's input its cacheable prefix is (the module's docstring)
        self.cache_share = cache_share
        self._cached: OrderedDict[str, None] = OrderedDict()
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
        self._models = {
            model_id: (config, BucketState.fresh(config, self._clock()))
            for model_id, config in ((m, self._quota(q)) for m, q in (quotas or {}).items())
        }
        self.total = ModelCounters()
        self._runs: dict[str, ModelCounters] = {}
        self._log: dict[str, list[ModelCall]] = {}

    @property
    def calls(self) -> int:
        return self.total.calls

    @property
    def throttles(self) -> int:
        return self.total.throttles

    @property
    def tokens_billed(self) -> int:
        return self.total.tokens_billed

    @property
    def storming(self) -> bool:
        return self._storm_until is not None and self._storm_until > self._clock()

    def of_run(self, run_id: str) -> ModelCounters:
        """The counters of one run (batch): what other runs do cannot change them."""
        with self._lock:
            c = self._runs.get(run_id, ModelCounters())
            return ModelCounters(c.calls, c.throttles, c.tokens_billed)

    def log(self, run_id: str) -> list[ModelCall]:
        """Every call received for the run, in the order received."""
        with self._lock:
            return list(self._log.get(run_id, []))

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

    def _take(self, model_id: str | None, tokens: int, now: float) -> GovernorConfig | None:
        """Take ``tokens`` from the quota of ``model_id``; None when granted, else the quota
        that refused them (under the lock)."""
        own = self._models.get(model_id) if model_id is not None else None
        config, bucket = own if own is not None else (self._config, self._bucket)
        try:  # the provider's quota counts what the call uses, as it is billed
            bucket, draw = bucket.draw(config, tokens, Lane.HIGH, now)
        except InvalidInput:  # larger than the whole (storm) quota
            return config
        if own is not None:
            self._models[str(model_id)] = (config, bucket)
        else:
            self._bucket = bucket
        return None if draw.granted else config

    def _record(self, call: ModelCall) -> None:
        self.total.add(call)
        self._runs.setdefault(call.run_id, ModelCounters()).add(call)
        self._log.setdefault(call.run_id, []).append(call)

    def converse(self, call: ConverseCall) -> dict[str, Any]:
        """An agent unit's model turn (:mod:`swarm.adapters.simulated_agent`'s scripts), under
        the same quota and latency as :meth:`invoke`; the call is logged as attempt ``turn``."""
        response = simulated_agent.answer(self.seed, call.unit_id, dict(call.request))
        tokens = billed_of(response["usage"])
        now = self._clock()
        with self._lock:
            self._end_storm(now)
            refused = self._take(call.model_id, tokens, now)
            throttled = refused is not None
            text = " ".join(
                str(b["text"]) for b in response["output"]["message"]["content"] if "text" in b
            )
            self._record(
                ModelCall(
                    call.run_id,
                    call.unit_id,
                    call.turn,
                    tokens,
                    now,
                    0 if throttled else tokens,
                    throttled,
                    not throttled,
                    response["stopReason"] == "max_tokens" and not throttled,
                    output="" if throttled else text,
                    stop_reason="" if throttled else str(response["stopReason"]),
                    input_tokens=0 if throttled else tokens - response["usage"]["outputTokens"],
                    output_tokens=0 if throttled else response["usage"]["outputTokens"],
                )
            )
            if refused is not None:
                raise ModelThrottled(f"simulated quota of {refused.quota_tpm:,} TPM exceeded")
        if self.seconds_per_1k_tokens:
            self._sleep(tokens / 1000 * self.seconds_per_1k_tokens)
        return response

    def invoke(self, request: ModelRequest) -> ModelResult:
        r = request
        try:
            prompt = r.input if isinstance(r.input, str) else prompts.normalise(r.input)
            input_tokens = simulated_input_tokens(prompt)
            asked = prompts.settings(prompt).get("maxTokens")
            limit = prompts.output_limit(input_tokens, r.max_tokens, asked, "simulated count")
        except (InvalidInput, prompts.InputExceedsReservation) as e:  # Bedrock's adapter: the same
            kind = type(e).__name__
            return ModelResult(
                succeeded=False, tokens=0, error=f"{kind}: {e}", model_id=answered_by(r.model_id)
            )
        cap = None if limit is None else input_tokens + limit
        tokens = billed_tokens(
            self.seed, r.unit_id, r.attempt, r.projected_tokens, cap, input_tokens
        )
        failed = attempt_fails(self.seed, r.unit_id, r.attempt, self.failure_rate)
        truncated = cap is not None and tokens >= cap
        digest = prompt_digest(prompt) if self.cache_share else ""
        output = "" if failed else simulated_output(prompt, r.unit_id, r.attempt)
        stop = "" if failed else "max_tokens" if truncated else "end_turn"
        now = self._clock()
        with self._lock:
            self._end_storm(now)
            refused = self._take(r.model_id, tokens, now)
            answered = refused is None
            fresh, read, written = cache_split(
                input_tokens, self.cache_share, digest in self._cached
            )
            if answered and digest:
                self._cached[digest] = None
                self._cached.move_to_end(digest)
                while len(self._cached) > CACHE_PROMPTS:
                    self._cached.popitem(last=False)
            self._record(
                ModelCall(
                    r.run_id,
                    r.unit_id,
                    r.attempt,
                    r.projected_tokens,
                    now,
                    tokens if answered else 0,
                    not answered,
                    answered and not failed,
                    truncated and answered,
                    output=output if answered else "",
                    stop_reason=stop if answered else "",
                    input_tokens=fresh if answered else 0,
                    output_tokens=tokens - input_tokens if answered else 0,
                    cache_read_tokens=read if answered else 0,
                    cache_write_tokens=written if answered else 0,
                )
            )
            if refused is not None:
                raise ModelThrottled(f"simulated quota of {refused.quota_tpm:,} TPM exceeded")
        if self.seconds_per_1k_tokens:
            self._sleep(tokens / 1000 * self.seconds_per_1k_tokens)
        return ModelResult(
            succeeded=not failed,
            tokens=tokens,
            output=output,
            error="simulated failure" if failed else "",
            stop_reason=stop,
            input_tokens=fresh,
            output_tokens=tokens - input_tokens,
            model_id=answered_by(r.model_id),
            cache_read_tokens=read,
            cache_write_tokens=written,
        )
