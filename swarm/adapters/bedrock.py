"""Amazon Bedrock's Converse API as the model plane.

Billed tokens come from the response's ``usage`` (input + output). A ``ThrottlingException`` (or
``ServiceQuotaExceededException``) becomes :class:`ModelThrottled`, which the worker reports to the
governor (multiplicative decrease) before handing the attempt back unstarted. Any other error of
the model (validation, model error) is a failed attempt: it is settled with the tokens the
response reports, zero if none. A call that got no answer in time is a failed attempt settled at
the unit's reservation (the model may have generated, and billed, the answer nobody received); a
call that never reached the endpoint is settled at zero.

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
from dataclasses import dataclass
from typing import Any, Final

from swarm.adapters.client_errors import client_error_type, error_code
from swarm.contract import (
    BEDROCK_CONNECT_TIMEOUT_S,
    BEDROCK_DEFAULT_READ_TIMEOUT_S,
    bedrock_call_bound_s,
)
from swarm.core.ports import ModelRequest, ModelResult, ModelThrottled

THROTTLE_CODES = frozenset({"ThrottlingException", "ServiceQuotaExceededException"})

#: the answer's length the adapter asks for (Converse's ``maxTokens``)
MAX_OUTPUT_TOKENS: Final = 4_096
#: the slowest generation the default read timeout allows for: Bedrock's larger models write
#: roughly 30-80 output tokens per second
SLOWEST_OUTPUT_TOKENS_PER_S: Final = 30
#: the time to a first token for the longest prompt the API accepts (100,000 characters)
FIRST_TOKEN_ALLOWANCE_S: Final = 30
DEFAULT_READ_TIMEOUT_S: Final = BEDROCK_DEFAULT_READ_TIMEOUT_S  # 180 s (swarm.contract says why)
CONNECT_TIMEOUT_S: Final = BEDROCK_CONNECT_TIMEOUT_S


def minimum_read_timeout_s(max_output_tokens: int = MAX_OUTPUT_TOKENS) -> int:
    """What the longest answer needs at the slowest rate, first token included (167 s)."""
    return math.ceil(max_output_tokens / SLOWEST_OUTPUT_TOKENS_PER_S) + FIRST_TOKEN_ALLOWANCE_S


call_bound_s = bedrock_call_bound_s  # with :func:`client_config`


def client_config(read_timeout_s: float = DEFAULT_READ_TIMEOUT_S) -> Any:
    """The bedrock-runtime client's botocore ``Config``: the timeouts above, no SDK retries."""
    from botocore.config import Config

    return Config(
        connect_timeout=CONNECT_TIMEOUT_S,
        read_timeout=read_timeout_s,
        retries={"mode": "standard", "total_max_attempts": 1},
    )


@dataclass
class BedrockModelPlane:
    client: Any  # a bedrock-runtime client, configured with client_config()
    model_id: str
    max_output_tokens: int = MAX_OUTPUT_TOKENS

    def invoke(self, request: ModelRequest) -> ModelResult:
        if not request.input.strip():
            # Converse refuses an empty or whitespace-only text block (ValidationException):
            # never send one. The API refuses such units (swarm/api/models.py); this
            # guards work queued before that check existed.
            return ModelResult(succeeded=False, tokens=0, error="EmptyInput: no prompt text")
        from botocore.exceptions import ConnectionError as NotConnected
        from botocore.exceptions import HTTPClientError

        try:
            response = self.client.converse(
                modelId=self.model_id,
                messages=[{"role": "user", "content": [{"text": request.input}]}],
                inferenceConfig={"maxTokens": self.max_output_tokens},
            )
        except client_error_type() as e:
            code = error_code(e)
            if code in THROTTLE_CODES:
                raise ModelThrottled(f"Bedrock throttled {self.model_id}: {code}") from None
            return ModelResult(succeeded=False, tokens=0, error=str(code))
        except NotConnected as e:  # connect timeout, DNS, proxy, TLS: the prompt was not sent
            return ModelResult(succeeded=False, tokens=0, error=type(e).__name__)
        except HTTPClientError as e:  # read timeout, connection closed: the answer was lost
            cap = request.max_tokens if request.max_tokens is not None else request.projected_tokens
            return ModelResult(succeeded=False, tokens=cap, error=type(e).__name__)
        usage = response.get("usage", {})
        tokens = int(usage.get("totalTokens", 0)) or int(usage.get("inputTokens", 0)) + int(
            usage.get("outputTokens", 0)
        )
        blocks = response.get("output", {}).get("message", {}).get("content", [])
        text = "".join(block.get("text", "") for block in blocks if isinstance(block, dict))
        stop = response.get("stopReason", "end_turn")
        ok = stop in ("end_turn", "stop_sequence", "max_tokens")
        return ModelResult(succeeded=ok, tokens=tokens, output=text, error="" if ok else stop)
