"""Quota tokens: the governor's unit, as Bedrock counts a call against a model's tokens per minute.

Bedrock counts an output token of some models as several tokens against the tokens-per-minute
quota, its *token burndown rate* (Bedrock User Guide, "Quotas for Amazon Bedrock", "Token
burndown rate for Anthropic Claude 4 models", and "How tokens are counted in Amazon Bedrock"):
5 for the Claude 4 family, 1 for other models. When a request starts Bedrock reserves
``input + maxTokens x burndown``; when it ends it settles at
``inputTokens + cacheWriteInputTokens + outputTokens x burndown``: cache reads are reserved with
the input and released at settlement, they do not count against the quota.

So the governor draws and trues up *quota tokens*, while the budget and the ledger stay in billed
tokens (input + output, as AWS bills them). With a burndown of 1 every figure here is the billed
one, exactly. docs/explanation/governor.md, "Output burndown".
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any, Final

from swarm.core import prompts

#: The model families Bedrock documents a burndown rate other than 1 for, as of 2026-12-06
#: (Bedrock User Guide, "How tokens are counted in Amazon Bedrock"): a pattern on the model id
#: (on-demand ids and cross-region inference profiles, whose ids add a geography prefix such
#: as ``us.``/``eu.``/``global.``), and its rate. Any other model: 1. A model this list does not
#: know yet takes ``model.output_burndown`` in cdk.json.
DOCUMENTED_BURNDOWN: Final[tuple[tuple[str, str, float], ...]] = (
    # Claude Opus 4, Opus 4.1, Opus 4.5...; Sonnet 4, Sonnet 4.5...; Haiku 4.5: the Claude 4 family
    ("Anthropic Claude 4 family", r"^(?:[a-z]+\.)?anthropic\.claude-(?:opus|sonnet|haiku)-4", 5.0),
)


def documented_burndown(model_id: str) -> float:
    """The output burndown rate Bedrock documents for ``model_id``'s family, 1 for others."""
    for _family, pattern, rate in DOCUMENTED_BURNDOWN:
        if re.match(pattern, model_id):
            return rate
    return 1.0


#: the longest answer a call asks for, whatever its unit's ``maxTokens``: Bedrock's adapter
#: sends at most this many (swarm.adapters.bedrock.MAX_OUTPUT_TOKENS is this constant). The
#: simulated plane has no such cap; an answer of its longer than this is trued up as an overrun.
DEFAULT_OUTPUT_CAP: Final = 4_096


def call_output_bound(projected: int, asked: int | None, cap: int | None = None) -> int:
    """The most output tokens a single-call unit's request can ask Bedrock for: its
    ``inferenceConfig.maxTokens`` (``asked``; None: none), at most the model plane's cap
    (``cap``: Bedrock's adapter never sends more; None: none) and its projection (its
    reservation, which bounds input and answer together)."""
    bound = projected
    for limit in (asked, cap):
        if limit is not None:
            bound = min(bound, limit)
    return max(0, bound)


def call_draw(projected: int, output_bound: int, burndown: float) -> int:
    """A single-call unit's draw in quota tokens: its projection (billed tokens, input and
    output) with its output bound counted ``burndown`` times instead of once."""
    return projected + math.ceil((burndown - 1) * output_bound)


def turn_draw(input_estimate: int, output_bound: int, burndown: float) -> int:
    """An agent turn's draw in quota tokens: its input estimate plus ``burndown`` x its output
    bound (what Bedrock reserves when the call starts)."""
    return input_estimate + math.ceil(burndown * output_bound)


def asked_output(prompt: Any) -> int | None:
    """The ``inferenceConfig.maxTokens`` a single-call unit's prompt asks for (None: none, or
    a prompt the model plane refuses, which bills nothing)."""
    try:
        asked = prompts.settings(prompts.normalise(prompt)).get("maxTokens")
        return None if asked is None else int(asked)
    except Exception:
        return None


def unit_output_bound(tokens: int, prompt: Any) -> int:
    """A single-call unit's output bound: its ``maxTokens``, within the default cap and its
    projection."""
    return call_output_bound(tokens, asked_output(prompt), DEFAULT_OUTPUT_CAP)


def unit_draw(tokens: int, prompt: Any, burndown: float) -> int:
    """What a single-call unit of ``tokens`` projected draws from the governor, in quota
    tokens: the same figure wherever it is drawn or booked (the API's check, the fan-out's
    places, a worker's bundle and its draw), so a booked ticket is honoured. Exactly ``tokens``
    at burndown 1 (the prompt is not read)."""
    if burndown == 1:
        return tokens
    return call_draw(tokens, unit_output_bound(tokens, prompt), burndown)


def call_quota(
    billed: int,
    input_tokens: int,
    output_tokens: int,
    output_bound: int,
    burndown: float,
) -> int:
    """A single-call unit's true-up in quota tokens: its billed tokens with the output counted
    ``burndown`` times. A call whose usage is unknown (it reported neither input nor output: a
    lost answer billed at its cap) counts its output as the most it could have been."""
    output = output_tokens if input_tokens or output_tokens else min(billed, output_bound)
    return billed + math.ceil((burndown - 1) * output)


def turn_quota(usage: Mapping[str, int], burndown: float) -> int:
    """An agent turn's true-up in quota tokens from the Converse ``usage``: input, cache
    writes and ``burndown`` x output; cache reads do not count against the quota."""
    return (
        int(usage.get("inputTokens", 0))
        + int(usage.get("cacheWriteInputTokens", 0))
        + math.ceil(burndown * int(usage.get("outputTokens", 0)))
    )


def check_burndown(value: float) -> float:
    """``value`` if it is a valid burndown rate (a finite number >= 1), else ValueError."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"must be a number >= 1, got {value!r}")
    if not math.isfinite(value) or value < 1:
        raise ValueError(f"must be a finite number >= 1, got {value!r}")
    return float(value)
