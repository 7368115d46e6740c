"""What the simulated model plane answers an agent unit's turn (``SimulatedModelPlane.converse``).

Two scripts, each a pure function of the Converse request (and the plane's seed), so any worker
that sends the same request gets the same answer, and a test knows every answer in advance:

* **BFCL** (:mod:`swarm.workloads.bfcl`, when ``bfcl-eval`` is installed): a request whose first
  user message is a BFCL multi-turn entry's first question is answered by that entry's
  :class:`~swarm.workloads.bfcl.ScriptedModel`, which replays the entry's ground truth;
* **generated agent units** (``swarm submit --generate N --agent``): the request's system text
  may say ``turns=N`` (else 2 to 8 turns, drawn from the seed and the first user message); each
  model turn before the last calls one or two of the request's tools (calculator, notes: inputs
  of their schemas; any other tool gets an empty input, which it answers with an error the
  script reads on), with an answer text of a drawn length; the last ends the turn with a
  summary of what the tools returned. Follow-up user messages start the count again.

Usage: input tokens are the request's estimate (:func:`swarm.core.agent.estimate_tokens`, the
simulated tokenizer), from the second turn on half of them cache reads and a tenth cache writes
(a prompt cache); output tokens the answer's estimate, bounded by ``maxTokens`` (an answer cut
there stops ``max_tokens``).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Mapping
from functools import cache
from typing import Any, Final

from swarm.core import agent
from swarm.core.errors import InvalidInput

#: a generated agent unit's turns, when its system text does not say ``turns=N``
DEFAULT_TURNS: Final = (2, 8)
_TURNS = re.compile(r"\bturns=(\d{1,3})\b")
#: filler words of a turn's answer text: its length is drawn from this range
ANSWER_WORDS: Final = (20, 120)


def _texts(message: Mapping[str, Any]) -> list[str]:
    return [str(b["text"]) for b in message.get("content", []) if "text" in b]


def _system_text(request: Mapping[str, Any]) -> str:
    return " ".join(str(b.get("text", "")) for b in request.get("system") or [])


#: a BFCL entry as its unit's requests show it: its first question and its tools' names (two
#: entries share a first question, none both)
BfclKey = tuple[str, tuple[str, ...]]


@cache
def _bfcl_index() -> Mapping[BfclKey, Callable[[dict[str, Any]], Mapping[str, Any]]] | None:
    """BFCL's scripted models by their entry's key; None without bfcl-eval."""
    try:
        from swarm.workloads import bfcl
    except ImportError:  # the plane on a slim asset: generated agent units only
        return None
    index: dict[BfclKey, Callable[[dict[str, Any]], Mapping[str, Any]]] = {}
    for category in bfcl.CATEGORIES:
        for entry in bfcl.entries(category):
            key = (entry.user_turns[0], tuple(sorted(bfcl.tools_of(entry))))
            index[key] = bfcl.ScriptedModel(entry)
    return index


def bfcl_script(request: dict[str, Any]) -> Mapping[str, Any] | None:
    """The BFCL entry's scripted answer when the request is one of its units', else None."""
    messages = request.get("messages") or []
    if not messages or "toolConfig" not in request:
        return None
    first = _texts(messages[0])
    tools = tuple(sorted(t["toolSpec"]["name"] for t in request["toolConfig"].get("tools", [])))
    index = _bfcl_index()
    script = None if index is None or not first else index.get((first[0], tools))
    return None if script is None else script(request)


def _tool_input(name: str, unit: str, k: int, rng: random.Random) -> dict[str, Any]:
    if name == "calculator":
        return {"expression": f"{rng.randint(2, 99)} * {rng.randint(2, 99)} + {k}"}
    if name in ("notes_write", "notes_publish"):
        return {"name": f"{unit}-{k}", "value": f"finding {k} of {unit}: {rng.randint(0, 10**6)}"}
    if name == "notes_read":
        return {"name": f"{unit}-{max(1, k - 1)}"}
    return {}


def agent_script(seed: int, unit: str, request: dict[str, Any]) -> Mapping[str, Any]:
    """A generated agent unit's answer to ``request`` (see the module's docstring)."""
    messages = request["messages"]
    texts = [i for i, m in enumerate(messages) if m["role"] == "user" and _texts(m)]
    question = " ".join(_texts(messages[0]))
    rng = random.Random(f"{seed}:{unit}:{question}")
    said = _TURNS.search(_system_text(request))
    turns = int(said.group(1)) if said else rng.randint(*DEFAULT_TURNS)
    since = messages[texts[-1] + 1 :]
    k = sum(1 for m in since if m["role"] == "assistant") + 1  # this turn, since the user spoke
    tools = [
        spec["toolSpec"]["name"] for spec in (request.get("toolConfig") or {}).get("tools", [])
    ]
    turn_rng = random.Random(f"{seed}:{unit}:{len(texts)}:{k}")
    words = " ".join(f"w{turn_rng.randint(0, 999)}" for _ in range(turn_rng.randint(*ANSWER_WORDS)))
    content: list[dict[str, Any]]
    if k < turns and tools:
        content = [{"text": f"Step {k}: {words}"}]
        for j in range(1 if k % 3 else 2):  # every third turn asks for two calls at once
            name = tools[(k + j + turn_rng.randint(0, len(tools))) % len(tools)]
            use = {"toolUseId": f"t{len(texts)}-{k}-{j}", "name": name}
            content.append({"toolUse": {**use, "input": _tool_input(name, unit, k, turn_rng)}})
        stop = "tool_use"
    else:
        results = sum(1 for m in since for b in m.get("content", []) if "toolResult" in b)
        content = [{"text": f"Done after {k} turns and {results} tool results. {words}"}]
        stop = "end_turn"
    return {"output": {"message": {"role": "assistant", "content": content}}, "stopReason": stop}


def usage_of(
    request: Mapping[str, Any], content: list[dict[str, Any]]
) -> tuple[dict[str, int], bool]:
    """The usage a simulated turn bills, and whether its answer was cut at ``maxTokens``."""
    total = agent.estimate_tokens({k: v for k, v in request.items() if k != "inferenceConfig"})
    later = any(m["role"] == "assistant" for m in request["messages"])
    read, write = (total // 2, total // 10) if later else (0, total // 10)
    bound = int((request.get("inferenceConfig") or {}).get("maxTokens", agent.DEFAULT_OUTPUT_BOUND))
    output = agent.estimate_tokens(content)
    usage = {
        "inputTokens": total - read - write,
        "outputTokens": min(output, bound),
        "cacheReadInputTokens": read,
        "cacheWriteInputTokens": write,
    }
    return usage, output > bound


def answer(seed: int, unit: str, request: dict[str, Any]) -> dict[str, Any]:
    """The simulated plane's Converse response to an agent unit's turn: InvalidInput for a
    request Bedrock would refuse (a ValidationException)."""
    problem = agent.request_problem(request)
    if problem is not None:
        raise InvalidInput("request", problem)
    scripted = bfcl_script(request) or agent_script(seed, unit, request)
    message = dict(scripted["output"]["message"])
    content = list(message["content"])
    usage, cut = usage_of(request, content)
    stop = "max_tokens" if cut else str(scripted["stopReason"])
    if cut:  # the answer as far as maxTokens let it come: its text only
        content = [b for b in content if "text" in b][:1] or [{"text": "..."}]
    return {
        "output": {"message": {"role": "assistant", "content": content}},
        "stopReason": stop,
        "usage": usage,
    }
