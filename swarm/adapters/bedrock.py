"""Amazon Bedrock's Converse API as the model plane.

Billed tokens come from the response's ``usage`` (input + output). A ``ThrottlingException`` (or
``ServiceQuotaExceededException``) becomes :class:`ModelThrottled`, which the worker reports to the
governor (multiplicative decrease) before handing the attempt back unstarted. Any other error of
the model (validation, model error, timeout) is a failed attempt: it is settled with the tokens
the response reports, zero if none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from swarm.adapters import client_error_type, error_code
from swarm.modelplane import ModelRequest, ModelResult, ModelThrottled

THROTTLE_CODES = frozenset({"ThrottlingException", "ServiceQuotaExceededException"})


@dataclass
class BedrockModelPlane:
    client: Any  # a bedrock-runtime client
    model_id: str
    max_output_tokens: int = 4_096

    def invoke(self, request: ModelRequest) -> ModelResult:
        try:
            response = self.client.converse(
                modelId=self.model_id,
                messages=[{"role": "user", "content": [{"text": request.input or " "}]}],
                inferenceConfig={"maxTokens": self.max_output_tokens},
            )
        except client_error_type() as e:
            code = error_code(e)
            if code in THROTTLE_CODES:
                raise ModelThrottled(f"Bedrock throttled {self.model_id}: {code}") from None
            return ModelResult(succeeded=False, tokens=0, error=str(code))
        usage = response.get("usage", {})
        tokens = int(usage.get("totalTokens", 0)) or int(usage.get("inputTokens", 0)) + int(
            usage.get("outputTokens", 0)
        )
        blocks = response.get("output", {}).get("message", {}).get("content", [])
        text = "".join(block.get("text", "") for block in blocks if isinstance(block, dict))
        stop = response.get("stopReason", "end_turn")
        ok = stop in ("end_turn", "stop_sequence", "max_tokens")
        return ModelResult(succeeded=ok, tokens=tokens, output=text, error="" if ok else stop)
