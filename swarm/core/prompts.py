"""A unit's prompt: a plain text, or a Converse-shaped request.

A prompt is JSON either way: it travels as JSON in the batch's manifest, in each Distributed Map
item and in each lane message.

* ``str``: the whole prompt, sent to the model as one user message.
* ``dict``: a request in *normal form*, the part of Bedrock's Converse request a unit may set::

    {"system": [{"text": "You are terse."}],                       # optional
     "messages": [{"role": "user", "content": [{"text": "..."}]},  # required: from the user
                  {"role": "assistant", "content": [...]},         # first and last, roles
                  {"role": "user", "content": [...]}],             # alternating
     "inferenceConfig": {"maxTokens": 512, "temperature": 0.2,     # optional, and so is each
                         "topP": 0.9, "stopSequences": ["END"]}}   # setting

:func:`check` refuses a prompt that breaks the rules Converse itself enforces (what Bedrock
would refuse with a ValidationException), naming the field; :func:`normal_form` gives a checked
request its normal form (a string ``system`` becomes one text block, null settings and an empty
``inferenceConfig`` are left out); :func:`normalise` does both. The API's size limits live in
:mod:`swarm.api.models`, whose validators apply the rules here (:func:`text_problem`,
:func:`turns_problem`) and take the shape from :func:`normal_form`; the model planes check every
prompt again before a call (:func:`converse_request`), so a message queued by another version is
never sent blind.

The output of an attempt is bounded by its reservation (:func:`output_limit`): the model may
write at most what the unit's reserved tokens leave after its input.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any, Final

from swarm.core.errors import InvalidInput, SwarmError

#: a unit's input for the model: the prompt text, or a Converse-shaped request in normal form
Prompt = str | dict[str, Any]

ROLES: Final = ("user", "assistant")
REQUEST_FIELDS: Final = ("system", "messages", "inferenceConfig")
#: the field of a unit's request naming the model of the deployment's registry that answers it
#: (cdk.json ``models.catalog``; absent: the registry's default); never sent to the model
MODEL_FIELD: Final = "model"
#: a model's name in the registry
MODEL_NAME_PATTERN: Final = r"^[a-z][a-z0-9-]{0,31}$"
#: the inference settings a unit may give (Converse's InferenceConfiguration)
SETTINGS: Final = ("maxTokens", "temperature", "topP", "stopSequences")
#: the settings Converse bounds to [0, 1]
UNIT_INTERVAL_SETTINGS: Final = ("temperature", "topP")

TEXT_REQUIRED: Final = (
    "must contain text: the model refuses an empty or whitespace-only text (give at least one "
    "character that is not whitespace)"
)
NOT_A_PROMPT: Final = (
    "must be a string (the prompt) or an object (a Converse request with messages, and "
    "optionally system and inferenceConfig)"
)


class InputExceedsReservation(SwarmError):
    """The unit's reservation cannot pay for its input plus one output token: the model is not
    called (the attempt fails at no cost)."""

    def __init__(self, input_tokens: int, reservation: int, how: str) -> None:
        super().__init__(
            f"the input is {input_tokens:,} tokens ({how}) and the unit's reservation is "
            f"{reservation:,} tokens, which leaves no room for an answer: raise the unit's "
            "projected_tokens above its input"
        )
        self.input_tokens = input_tokens
        self.reservation = reservation


# ------------------------------------------------------------------ the rules


def text_problem(text: str) -> str | None:
    """Why ``text`` cannot be sent to the model, or None."""
    if not text.strip():
        return TEXT_REQUIRED
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:  # JSON may carry an unpaired "\\ud800"; UTF-8 cannot
        return (
            f"is not valid Unicode text: an unpaired surrogate (U+{ord(text[e.start]):04X}) at "
            f"character {e.start:,}"
        )
    return None


def turns_problem(roles: Sequence[str]) -> str | None:
    """Why these message roles, in order, are not a conversation Converse accepts, or None: it
    starts and ends with the user (the turn the model answers) and alternates."""
    if not roles:
        return "must hold at least one message"
    if roles[0] != "user":
        return f"must start with a user message; messages[0] is from the {roles[0]}"
    for index in range(1, len(roles)):
        if roles[index] == roles[index - 1]:
            return (
                f"user and assistant messages must alternate: messages[{index}] is a second "
                f"{roles[index]} message in a row (put both texts in one message's content)"
            )
    if roles[-1] != "user":
        return (
            f"must end with a user message (the turn the model answers); messages[{len(roles) - 1}]"
            f" is from the {roles[-1]}"
        )
    return None


def setting_problem(name: str, value: Any) -> str | None:
    """Why an inference setting's value is not one Converse accepts, or None."""
    if name == "maxTokens":
        if not _is_int(value) or value < 1:
            return "must be an integer of at least 1"
    elif name in UNIT_INTERVAL_SETTINGS:
        if not _is_number(value) or not 0 <= value <= 1:
            return "must be a number from 0 to 1"
    elif name == "stopSequences" and not isinstance(value, list):
        return "must be a list of strings"
    return None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return math.isfinite(value)


# ------------------------------------------------------------------ checking and normal form


def _text_problem(value: Any) -> str | None:
    return "must be a string" if not isinstance(value, str) else text_problem(value)


def _check_text(value: Any, field: str) -> None:
    problem = _text_problem(value)
    if problem is not None:
        raise InvalidInput(field, problem)


def _check_blocks(value: Any, field: str) -> None:
    """A list of text blocks (``[{"text": ...}]``). Paths are formatted only for an error: a
    manifest may hold 50,000 requests."""
    if not isinstance(value, list) or not value:
        raise InvalidInput(field, 'must be a non-empty list of text blocks ({"text": ...})')
    for index, block in enumerate(value):
        if not isinstance(block, dict) or block.keys() != {"text"}:
            raise InvalidInput(
                f"{field}[{index}]", 'must be a text block: an object with one field, "text"'
            )
        problem = _text_problem(block["text"])
        if problem is not None:
            raise InvalidInput(f"{field}[{index}].text", problem)


def _check_messages(value: Any, field: str) -> None:
    if not isinstance(value, list):
        raise InvalidInput(field, "must be a list of messages")
    for index, message in enumerate(value):
        if not isinstance(message, dict) or message.keys() != {"role", "content"}:
            raise InvalidInput(f"{field}[{index}]", 'must be an object with "role" and "content"')
        if message["role"] not in ROLES:
            raise InvalidInput(f"{field}[{index}].role", "must be 'user' or 'assistant'")
        _check_blocks(message["content"], f"{field}[{index}].content")
    problem = turns_problem([message["role"] for message in value])
    if problem is not None:
        raise InvalidInput(field, problem)


def _check_settings(value: Any, field: str) -> None:
    if not isinstance(value, dict):
        raise InvalidInput(field, f"must be an object with any of {', '.join(SETTINGS)}")
    unknown = sorted(set(value) - set(SETTINGS))
    if unknown:
        raise InvalidInput(
            f"{field}.{unknown[0]}", f"is not a setting a unit may give; use {', '.join(SETTINGS)}"
        )
    for name, setting in value.items():
        if setting is None:
            continue
        problem = setting_problem(name, setting)
        if problem is not None:
            raise InvalidInput(f"{field}.{name}", problem)
        if name == "stopSequences":
            for index, stop in enumerate(setting):
                _check_text(stop, f"{field}.{name}[{index}]")


def check(value: Any, field: str = "input") -> None:
    """InvalidInput naming the first field of ``value`` that breaks Converse's rules (like
    ``input.messages[0].content[0].text``), if one does."""
    if isinstance(value, str):
        _check_text(value, field)
        return
    if not isinstance(value, dict):
        raise InvalidInput(field, NOT_A_PROMPT)
    unknown = sorted(set(value) - {*REQUEST_FIELDS, MODEL_FIELD})
    if unknown:
        raise InvalidInput(
            f"{field}.{unknown[0]}",
            f"is not a field of a unit's request; use {', '.join(REQUEST_FIELDS)} (and "
            f"{MODEL_FIELD})",
        )
    model = value.get(MODEL_FIELD)
    named = isinstance(model, str) and re.match(MODEL_NAME_PATTERN, model)
    if MODEL_FIELD in value and not named:
        raise InvalidInput(
            f"{field}.{MODEL_FIELD}",
            "must be a model's name in the deployment's registry (lowercase letters, digits and "
            "-, starting with a letter): GET /fleet lists them",
        )
    system = value.get("system")
    if isinstance(system, str):
        _check_text(system, f"{field}.system")
    elif system is not None:
        _check_blocks(system, f"{field}.system")
    if "messages" not in value:
        raise InvalidInput(f"{field}.messages", "is required: the conversation the model answers")
    _check_messages(value["messages"], f"{field}.messages")
    if value.get("inferenceConfig") is not None:
        _check_settings(value["inferenceConfig"], f"{field}.inferenceConfig")


def normal_form(request: dict[str, Any]) -> dict[str, Any]:
    """A request that passes :func:`check` in normal form (a copy): a string ``system`` as one
    text block, null settings and an empty ``inferenceConfig`` left out."""
    shaped: dict[str, Any] = {}
    system = request.get("system")
    if system is not None:
        blocks = [{"text": system}] if isinstance(system, str) else system
        shaped["system"] = [{"text": block["text"]} for block in blocks]
    shaped["messages"] = [
        {"role": m["role"], "content": [{"text": block["text"]} for block in m["content"]]}
        for m in request["messages"]
    ]
    settings = {
        name: list(value) if isinstance(value, list) else value
        for name, value in (request.get("inferenceConfig") or {}).items()
        if value is not None
    }
    if settings:
        shaped["inferenceConfig"] = settings
    return shaped


def unit_model(prompt: Any) -> str | None:
    """The model a unit's request names (:data:`MODEL_FIELD`), or None: the registry's default."""
    if isinstance(prompt, dict):
        model = prompt.get(MODEL_FIELD)
        return model if isinstance(model, str) else None
    return None


def normalise(value: Any, field: str = "input") -> Prompt:
    """``value`` checked (:func:`check`) and in normal form (:func:`normal_form`)."""
    check(value, field)
    if isinstance(value, str):
        return value
    named = unit_model(value)
    return normal_form(value) | ({MODEL_FIELD: named} if named is not None else {})


def from_json(value: Any) -> Prompt:
    """A prompt as a queue message or a manifest item carries it, not yet checked (the model
    plane checks it before a call, so a bad prompt fails its attempt instead of poisoning the
    message); a value that is neither form is an InvalidInput naming ``input``."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return dict(value)
    raise InvalidInput("input", NOT_A_PROMPT)


# ------------------------------------------------------------------ reading a prompt


def converse_request(prompt: Prompt) -> dict[str, Any]:
    """The prompt as a checked Converse request in normal form: a string is one user message."""
    check(prompt)
    if isinstance(prompt, str):
        return {"messages": [{"role": "user", "content": [{"text": prompt}]}]}
    return normal_form(prompt)


def texts(prompt: Prompt) -> list[str]:
    """Every text of the prompt in order: the system's blocks, then each message's."""
    if isinstance(prompt, str):
        return [prompt]
    found = [str(block.get("text", "")) for block in _system_blocks(prompt.get("system"))]
    for message in prompt.get("messages") or []:
        found += [str(block.get("text", "")) for block in message.get("content") or []]
    return found


def _system_blocks(system: Any) -> list[dict[str, Any]]:
    if isinstance(system, str):
        return [{"text": system}]
    return list(system or [])


def prompt_text(prompt: Prompt) -> str:
    """All the prompt's text (its texts joined by newlines): a string prompt is itself."""
    return "\n".join(texts(prompt))


def settings(prompt: Prompt) -> dict[str, Any]:
    """The request's inference settings (none for a string prompt)."""
    if isinstance(prompt, str):
        return {}
    return dict(prompt.get("inferenceConfig") or {})


def output_limit(
    input_tokens: int, reservation: int | None, asked: int | None, how: str = "counted"
) -> int | None:
    """The most tokens the answer may have: what the unit asked for (``maxTokens``, None: no
    limit of its own), within what its reservation leaves after the input (None: no
    reservation). InputExceedsReservation when that leaves not even one token; ``how`` says
    where ``input_tokens`` came from, for its message."""
    if reservation is None:
        return asked
    room = reservation - input_tokens
    if room < 1:
        raise InputExceedsReservation(input_tokens, reservation, how)
    return room if asked is None else min(asked, room)
