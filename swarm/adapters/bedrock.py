"""Amazon Bedrock's Converse API as the model plane.

The request: a unit's prompt (:mod:`swarm.core.prompts`) is sent as given, a string as one user
message, a Converse-shaped request as its ``system``, ``messages`` and ``inferenceConfig``, with
one change: ``maxTokens``, which bounds the answer by the unit's reservation.

The answer's bound. The worker sets ``ModelRequest.max_tokens`` to the attempt's reservation,
the most it may bill, input and answer together. The answer may have at most the reservation
minus the input's tokens, and at most what the unit asked for (its ``maxTokens``) and
:data:`MAX_OUTPUT_TOKENS` (the read timeout is sized for that many). The input's tokens are
first bounded from above without a call (:func:`input_token_bound`); only when that bound leaves
less room than the answer wants are they counted, by Bedrock's CountTokens (the model's own
tokenizer, no inference, no charge) on a client of its own with short timeouts. A model or region
that cannot count (CountTokens refuses it) is remembered, and the bound is used instead, as it is
when a count fails or times out. A reservation that cannot pay for the input plus one token of
answer fails the attempt without calling the model: 0 tokens, an ``InputExceedsReservation``
error naming both numbers. A provider that still bills past the reservation (its count and
CountTokens disagree) is reported as billed: the ledger settles what was billed.

Billed tokens come from the response's ``usage`` (input + output, and the prompt cache's reads and
writes, reported apart and priced apart: swarm.core.pricing). A ``ThrottlingException`` (or
``ServiceQuotaExceededException``) becomes :class:`ModelThrottled`, which the worker reports to the
governor (multiplicative decrease) before handing the attempt back unstarted. Any other error of
the model (validation, model error) is a failed attempt: it is settled with the tokens the
response reports, zero if none. A call that got no answer in time is a failed attempt settled at
the unit's reservation (the model may have generated, and billed, the answer nobody received); a
call that never reached the endpoint is settled at zero. A prompt that breaks Converse's rules
(a message queued by another version) is never sent: a failed attempt at zero.

The client (:func:`client_config`): one request per call, no SDK retries. botocore's default
(legacy mode, 5 attempts) retries ``ThrottlingException`` itself, so the governor would hear of a
throttle only after four invisible retries, each drawing on the quota it protects; and it retries
a read timeout, which sends the same prompt again while the first generation may still be billed,
and multiplies the time a call can take by five. The worker already retries what deserves it: a
throttle goes back to its lane without spending an attempt, a failure is redelivered by SQS and
counted by the ledger. The read timeout is configured (``model.bedrock.read_timeout_seconds`` in
cdk.json, ``BEDROCK_READ_TIMEOUT_SECONDS``): boto3's 60 s is short for 4,096 output tokens.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from swarm.adapters.client_errors import client_error_type, error_code
from swarm.contract import (
    BEDROCK_CONNECT_TIMEOUT_S,
    BEDROCK_COUNT_CONNECT_TIMEOUT_S,
    BEDROCK_COUNT_READ_TIMEOUT_S,
    BEDROCK_DEFAULT_READ_TIMEOUT_S,
    bedrock_call_bound_s,
)
from swarm.core import prompts
from swarm.core.burndown import DEFAULT_OUTPUT_CAP
from swarm.core.errors import InvalidInput
from swarm.core.ports import ConverseCall, ModelRequest, ModelResult, ModelThrottled

THROTTLE_CODES = frozenset({"ThrottlingException", "ServiceQuotaExceededException"})
#: CountTokens errors that say nothing about whether the model can count: try again next time
TRANSIENT_COUNT_CODES = THROTTLE_CODES | {
    "InternalServerException",
    "ServiceUnavailableException",
    "ModelNotReadyException",
}

#: the longest answer the adapter asks for (Converse's ``maxTokens``), whatever the reservation
MAX_OUTPUT_TOKENS: Final = DEFAULT_OUTPUT_CAP  # 4,096; the governor's draws count on it
#: the slowest generation the default read timeout allows for: Bedrock's larger models write
#: roughly 30-80 output tokens per second
SLOWEST_OUTPUT_TOKENS_PER_S: Final = 30
#: the time to a first token for the longest prompt the API accepts (100,000 characters)
FIRST_TOKEN_ALLOWANCE_S: Final = 30
DEFAULT_READ_TIMEOUT_S: Final = BEDROCK_DEFAULT_READ_TIMEOUT_S  # 180 s (swarm.contract says why)
CONNECT_TIMEOUT_S: Final = BEDROCK_CONNECT_TIMEOUT_S

# The conservative bound on a prompt's input tokens, used when they are not counted. Every token
# of the tokenizers Bedrock's text models use stands for at least one byte of the UTF-8 text
# (byte-level BPE; SentencePiece, whose unknown characters fall back to bytes), so a text has at
# most as many tokens as bytes. A chat template adds its markers around each message and block
# (role headers, separators: a handful of tokens each) and around the whole (begin of sequence,
# the assistant's header): allowances well above what they take.
#: tokens one byte of text can make, at most
BOUND_TOKENS_PER_BYTE: Final = 1
#: a chat template's markers per message, per text block and per system block, at most
BOUND_TOKENS_PER_PART: Final = 16
#: and per request
BOUND_TOKENS_PER_REQUEST: Final = 64


def minimum_read_timeout_s(max_output_tokens: int = MAX_OUTPUT_TOKENS) -> int:
    """What the longest answer needs at the slowest rate, first token included (167 s)."""
    return math.ceil(max_output_tokens / SLOWEST_OUTPUT_TOKENS_PER_S) + FIRST_TOKEN_ALLOWANCE_S


call_bound_s = bedrock_call_bound_s  # with :func:`client_config` and :func:`count_client_config`


def client_config(read_timeout_s: float = DEFAULT_READ_TIMEOUT_S) -> Any:
    """The bedrock-runtime client's botocore ``Config``: the timeouts above, no SDK retries."""
    from botocore.config import Config

    return Config(
        connect_timeout=CONNECT_TIMEOUT_S,
        read_timeout=read_timeout_s,
        retries={"mode": "standard", "total_max_attempts": 1},
    )


def count_client_config() -> Any:
    """The CountTokens client's botocore ``Config``: short timeouts (a count generates nothing;
    a slow one is replaced by the upper bound), no SDK retries."""
    from botocore.config import Config

    return Config(
        connect_timeout=BEDROCK_COUNT_CONNECT_TIMEOUT_S,
        read_timeout=BEDROCK_COUNT_READ_TIMEOUT_S,
        retries={"mode": "standard", "total_max_attempts": 1},
    )


def input_token_bound(request: dict[str, Any]) -> int:
    """At most this many input tokens, for any of Bedrock's text models: the UTF-8 bytes of every
    text, plus :data:`BOUND_TOKENS_PER_PART` per system block, message and text block, plus
    :data:`BOUND_TOKENS_PER_REQUEST` (``request``: :func:`swarm.core.prompts.converse_request`'s).
    """
    messages = request["messages"]
    parts = len(request.get("system", [])) + len(messages)
    parts += sum(len(message["content"]) for message in messages)
    text_bytes = sum(len(text.encode()) for text in prompts.texts(request))
    return (
        BOUND_TOKENS_PER_BYTE * text_bytes
        + BOUND_TOKENS_PER_PART * parts
        + BOUND_TOKENS_PER_REQUEST
    )


@dataclass
class BedrockModelPlane:
    client: Any  # a bedrock-runtime client, configured with client_config()
    model_id: str
    max_output_tokens: int = MAX_OUTPUT_TOKENS
    #: the client for CountTokens, configured with count_client_config(); None: ``client``
    counter: Any = None
    #: False once CountTokens refused this model (in this region): the bound is used instead
    can_count: bool = True

    def invoke(self, request: ModelRequest) -> ModelResult:
        try:
            converse = prompts.converse_request(request.input)
        except InvalidInput as e:
            # Converse would refuse it (ValidationException): never send it. The API refuses
            # such units (swarm/api/models.py); this guards work queued by another version.
            return self._refused(f"InvalidInput: {e}")
        settings = converse.get("inferenceConfig", {})
        try:
            max_tokens = self._output_limit(converse, request.max_tokens, settings)
        except prompts.InputExceedsReservation as e:
            return self._refused(f"InputExceedsReservation: {e}")
        from botocore.exceptions import ConnectionError as NotConnected
        from botocore.exceptions import HTTPClientError

        fields = {key: converse[key] for key in ("system", "messages") if key in converse}
        try:
            response = self.client.converse(
                modelId=self.model_id,
                **fields,
                inferenceConfig={**settings, "maxTokens": max_tokens},
            )
        except client_error_type() as e:
            code = error_code(e)
            if code in THROTTLE_CODES:
                raise ModelThrottled(f"Bedrock throttled {self.model_id}: {code}") from None
            return self._refused(str(code))
        except NotConnected as e:  # connect timeout, DNS, proxy, TLS: the prompt was not sent
            return self._refused(type(e).__name__)
        except HTTPClientError as e:  # read timeout, connection closed: the answer was lost
            cap = request.max_tokens if request.max_tokens is not None else request.projected_tokens
            return ModelResult(
                succeeded=False, tokens=cap, error=type(e).__name__, model_id=self.model_id
            )
        usage = response.get("usage", {})
        input_tokens = int(usage.get("inputTokens", 0))
        output_tokens = int(usage.get("outputTokens", 0))
        # the prompt cache's tokens are reported apart from inputTokens (and priced apart:
        # swarm.core.pricing); absent when the request used no cache point
        cache_read = int(usage.get("cacheReadInputTokens", 0) or 0)
        cache_write = int(usage.get("cacheWriteInputTokens", 0) or 0)
        # as billed, even past the reservation: the ledger settles what the provider counted
        tokens = int(usage.get("totalTokens", 0)) or (
            input_tokens + output_tokens + cache_read + cache_write
        )
        blocks = response.get("output", {}).get("message", {}).get("content", [])
        text = "".join(block.get("text", "") for block in blocks if isinstance(block, dict))
        stop = str(response.get("stopReason", "end_turn"))
        ok = stop in ("end_turn", "stop_sequence", "max_tokens")
        return ModelResult(
            succeeded=ok,
            tokens=tokens,
            output=text if ok else "",
            error="" if ok else stop,
            stop_reason=stop,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            model_id=self.model_id,
            cache_read_tokens=cache_read,
            cache_write_tokens=cache_write,
        )

    def converse(self, call: ConverseCall) -> Mapping[str, Any]:
        """An agent unit's model turn: the request as the loop built it (Converse's rules kept,
        maxTokens its output bound, at most MAX_OUTPUT_TOKENS). A throttle is ModelThrottled;
        any other error raises (the loop bills the turn at its draw: it may have been billed)."""
        request = dict(call.request)
        settings = dict(request.get("inferenceConfig") or {})
        settings["maxTokens"] = min(self.max_output_tokens, int(settings.get("maxTokens", 1)))
        request["inferenceConfig"] = settings
        try:
            response: Mapping[str, Any] = self.client.converse(modelId=self.model_id, **request)
        except client_error_type() as e:
            code = error_code(e)
            if code in THROTTLE_CODES:
                raise ModelThrottled(f"Bedrock throttled {self.model_id}: {code}") from None
            raise
        return response

    def _refused(self, error: str) -> ModelResult:
        """A call that billed nothing."""
        return ModelResult(succeeded=False, tokens=0, error=error, model_id=self.model_id)

    def _output_limit(
        self, converse: dict[str, Any], reservation: int | None, settings: dict[str, Any]
    ) -> int:
        """``maxTokens`` for the call: what the unit asks for (at most MAX_OUTPUT_TOKENS), within
        what the reservation leaves after the input (counted only when the bound is too tight)."""
        asked = min(self.max_output_tokens, int(settings.get("maxTokens", self.max_output_tokens)))
        bound = input_token_bound(converse)
        if reservation is None or reservation - bound >= asked:
            return asked  # even the most the input can be leaves the whole answer room
        counted = self._count(converse)
        if counted is None:
            how = f"an upper bound: {self.model_id} did not count them"
            limit = prompts.output_limit(bound, reservation, asked, how)
        else:
            limit = prompts.output_limit(counted, reservation, asked, "counted by CountTokens")
        assert limit is not None  # a reservation and a request of its own
        return limit

    def _count(self, converse: dict[str, Any]) -> int | None:
        """The input's tokens by CountTokens, or None when it cannot say (now, or ever: a model
        or region it refuses, remembered)."""
        if not self.can_count:
            return None
        from botocore.exceptions import BotoCoreError

        counted = {key: converse[key] for key in ("system", "messages") if key in converse}
        try:
            response = (self.counter or self.client).count_tokens(
                modelId=self.model_id, input={"converse": counted}
            )
            return int(response["inputTokens"])
        except client_error_type() as e:
            if error_code(e) not in TRANSIENT_COUNT_CODES:  # the model, region or role cannot
                self.can_count = False
            return None
        except (BotoCoreError, KeyError, TypeError, ValueError):  # a timeout, an odd answer
            return None
