"""A unit's input as a plain string or a Converse-shaped request: the core's rules and normal
form, the API's 400s naming the exact field, the fan-out's size check on the structured form,
and the prompt carried unchanged from the submit to the model (manifest, map item, lane
message)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from swarm.adapters.simulated_model import SimulatedModelPlane, simulated_output
from swarm.api.models import MAX_MAP_ITEM_BYTES
from swarm.core import codec, prompts
from swarm.core.errors import InvalidInput
from swarm.core.lanes import QueuedUnit
from swarm.core.memory import MemoryBlobs, MemoryQueue
from swarm.core.ports import ModelRequest
from swarm.core.records import Lane
from swarm.service.api_models import parse_manifest_units, parse_submit
from swarm.service.batches import (
    batch_id_for,
    manifest_key,
    manifest_units,
    map_child_input,
)
from swarm.service.fanout import FanOut
from tests.unit.test_api_contract import batches, turns, unit

REQUEST = {
    "system": "You are terse.",
    "messages": [
        {"role": "user", "content": [{"text": "Summarise the incident."}]},
        {"role": "assistant", "content": [{"text": "Which one?"}]},
        {"role": "user", "content": [{"text": "The outage."}, {"text": "Of 3 May."}]},
    ],
    "inferenceConfig": {"temperature": 0.2, "topP": None, "stopSequences": ["END"]},
}
#: REQUEST in normal form: the system prompt as one block, the null setting left out
NORMAL = {
    "system": [{"text": "You are terse."}],
    "messages": REQUEST["messages"],
    "inferenceConfig": {"temperature": 0.2, "stopSequences": ["END"]},
}


# ------------------------------------------------------------------ the core's rules


def test_a_request_is_brought_to_normal_form() -> None:
    assert prompts.normalise(REQUEST) == NORMAL
    assert prompts.normalise(NORMAL) == NORMAL  # idempotent
    assert prompts.normalise("just text") == "just text"
    # an empty inferenceConfig is no inferenceConfig
    assert prompts.normalise(turns("a", inferenceConfig={"topP": None})) == turns("a")


def test_a_string_is_one_user_message_for_converse() -> None:
    assert prompts.converse_request("Hello") == {
        "messages": [{"role": "user", "content": [{"text": "Hello"}]}]
    }
    assert prompts.converse_request(REQUEST) == NORMAL


def test_the_texts_of_a_prompt_in_order() -> None:
    assert prompts.texts(NORMAL) == [
        "You are terse.",
        "Summarise the incident.",
        "Which one?",
        "The outage.",
        "Of 3 May.",
    ]
    assert prompts.prompt_text(NORMAL) == "\n".join(prompts.texts(NORMAL))
    assert prompts.prompt_text("only this") == "only this"
    assert prompts.settings(NORMAL) == {"temperature": 0.2, "stopSequences": ["END"]}
    assert prompts.settings("text") == {}


@pytest.mark.parametrize(
    ("prompt", "field", "says"),
    [
        (" ", "input", "must contain text"),
        (turns("a", " ", "c"), "input.messages[1].content[0].text", "must contain text"),
        (turns("a", system="\n"), "input.system", "must contain text"),
        (turns("a", system=[{"text": "ok"}, {"text": ""}]), "input.system[1].text", "text"),
        (turns("a", system=[{"txt": "ok"}]), "input.system[0]", 'one field, "text"'),
        (turns("a", "b"), "input.messages", "must end with a user message"),
        (turns("a", "b")["messages"][::-1], "input", "must be a string"),
        ({"messages": turns("b", "a")["messages"][::-1]}, "input.messages", "must start with"),
        (
            {"messages": [{"role": "user", "content": [{"text": "a"}]}] * 2},
            "input.messages",
            "messages[1] is a second user message in a row",
        ),
        ({"messages": []}, "input.messages", "at least one message"),
        ({"system": "s"}, "input.messages", "is required"),
        (turns("a", tools=[]), "input.tools", "is not a field of a unit's request"),
        (turns("a", inferenceConfig={"topK": 1}), "input.inferenceConfig.topK", "not a setting"),
        (
            turns("a", inferenceConfig={"temperature": float("nan")}),
            "input.inferenceConfig.temperature",
            "from 0 to 1",
        ),
        (turns("a", inferenceConfig={"topP": True}), "input.inferenceConfig.topP", "from 0 to 1"),
        (
            turns("a", inferenceConfig={"maxTokens": 2.0}),
            "input.inferenceConfig.maxTokens",
            "an integer of at least 1",
        ),
        (
            turns("a", inferenceConfig={"stopSequences": ["ok", "\t"]}),
            "input.inferenceConfig.stopSequences[1]",
            "must contain text",
        ),
        ("caf\udce9", "input", "an unpaired surrogate (U+DCE9) at character 3"),
        ({"messages": [{"role": "user", "content": [{"text": 7}]}]}, "input.messages[0]", "str"),
        (42, "input", "must be a string (the prompt) or an object"),
    ],
)
def test_what_converse_would_refuse_is_refused_naming_the_field(
    prompt: Any, field: str, says: str
) -> None:
    with pytest.raises(InvalidInput) as refused:
        prompts.normalise(prompt)
    assert refused.value.field.startswith(field) and says in refused.value.message


def test_the_answer_is_bounded_by_what_the_reservation_leaves() -> None:
    assert prompts.output_limit(400, 1_000, None) == 600
    assert prompts.output_limit(400, 1_000, 250) == 250
    assert prompts.output_limit(400, 1_000, 900) == 600
    assert prompts.output_limit(999, 1_000, None) == 1
    assert prompts.output_limit(400, None, 250) == 250  # no reservation: the unit's own limit
    assert prompts.output_limit(400, None, None) is None
    with pytest.raises(prompts.InputExceedsReservation) as refused:
        prompts.output_limit(1_000, 1_000, None, "counted")
    assert str(refused.value) == (
        "the input is 1,000 tokens (counted) and the unit's reservation is 1,000 tokens, which "
        "leaves no room for an answer: raise the unit's projected_tokens above its input"
    )
    assert (refused.value.input_tokens, refused.value.reservation) == (1_000, 1_000)


# ------------------------------------------------------------------ the lane message


def queued(prompt: prompts.Prompt) -> QueuedUnit:
    return QueuedUnit("b-1", "u-1", "acme", Lane.NORMAL, 0, 100, prompt)


def test_a_message_carries_a_request_as_json_and_back() -> None:
    body = codec.message_body(queued(NORMAL))
    assert json.loads(body)["input"] == NORMAL
    assert codec.parse_message_body(body) == queued(NORMAL)


def test_a_message_of_the_version_before_still_parses() -> None:
    body = (
        '{"run_id":"b-1","unit_id":"u-1","tenant":"acme","lane":"normal","attempt":0,'
        '"tokens":100,"input":"Summarise the incident."}'
    )
    assert codec.parse_message_body(body) == queued("Summarise the incident.")
    no_input = body.replace(',"input":"Summarise the incident."', "")
    assert codec.parse_message_body(no_input) == queued("")
    null_input = json.dumps({**json.loads(body), "input": None})
    with pytest.raises(InvalidInput) as refused:  # neither form: the envelope is malformed
        codec.parse_message_body(null_input)
    assert "input: must be a string (the prompt) or an object" in str(refused.value)


def test_a_message_with_a_bad_request_parses_and_fails_its_attempt_at_the_model() -> None:
    """A request the rules refuse is still a message (settled as a failed attempt, never a
    poison message the dead-letter handler would drop with its unit unsettled)."""
    bad = turns("a", "b")
    item = codec.parse_message_body(codec.message_body(queued(bad)))
    assert item.input == bad
    result = SimulatedModelPlane(10**9).invoke(ModelRequest("b-1", "u-1", 0, 100, item.input))
    assert not result.succeeded and result.tokens == 0
    assert "must end with a user message" in result.error


# ------------------------------------------------------------------ the API's 400s


@pytest.mark.parametrize(
    ("input_", "field"),
    [
        (turns("a", "b", " "), "units[3].input.messages[2].content[0].text"),
        (
            {"messages": [{"role": "user", "content": [{"text": "ok"}, {"text": ""}]}]},
            "units[3].input.messages[0].content[1].text",
        ),
        (turns("a", system=" "), "units[3].input.system"),
        (turns("a", system=[{"text": "ok"}, {"text": "\n"}]), "units[3].input.system[1].text"),
        (turns("a", "b"), "units[3].input.messages"),
        (
            turns("a", inferenceConfig={"temperature": 2}),
            "units[3].input.inferenceConfig.temperature",
        ),
        (
            turns("a", inferenceConfig={"stopSequences": ["ok", " "]}),
            "units[3].input.inferenceConfig.stopSequences[1]",
        ),
        (turns("a", extra=1), "units[3].input.extra"),
        ([{"text": "a"}], "units[3].input"),
        (turns("x" * 70_000, "y", "z" * 30_000), "units[3].input"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(input_: Any, field: str) -> None:
    units = [unit(f"u{i}") for i in range(3)] + [{**unit("u3"), "input": input_}]
    with pytest.raises(InvalidInput) as refused:
        parse_submit(json.dumps({"units": units}))
    assert refused.value.field == field


def test_blank_text_is_refused_with_the_reason() -> None:
    body = {"units": [{**unit(), "input": turns("a", "b", "  ")}]}
    with pytest.raises(InvalidInput) as refused:
        parse_submit(json.dumps(body))
    assert str(refused.value) == (
        "units[0].input.messages[2].content[0].text: must contain text: the model refuses an "
        "empty or whitespace-only text (give at least one character that is not whitespace)"
    )


def test_the_total_text_is_limited_like_a_string_input() -> None:
    body = {"units": [{**unit(), "input": turns("x" * 60_000, "y", "z" * 40_000)}]}
    with pytest.raises(InvalidInput, match="100,001 characters in all; the limit is 100,000"):
        parse_submit(json.dumps(body))


def test_a_manifest_units_bad_input_is_named_in_the_manifest() -> None:
    doc = [unit("a"), {**unit("b"), "input": turns("ok", "fine", "")}]
    with pytest.raises(InvalidInput) as refused:
        parse_manifest_units(doc)
    assert refused.value.field == "manifest[1].input.messages[2].content[0].text"


# ------------------------------------------------------------------ submit to model


def test_a_request_goes_from_the_submit_to_the_model_in_normal_form() -> None:
    # Given a batch with a string input and a request
    service = batches()
    body = parse_submit(json.dumps({"units": [unit("a"), {**unit("b", 50), "input": REQUEST}]}))
    run = service.submit_body("acme", body, None, 1.0).run
    # Then the manifest holds each input as the control plane carries it
    items = service.blobs.get_json(manifest_key(run.run_id))
    units = manifest_units(items)
    assert {item["unit_id"]: item["input"] for item in units} == {"a": "hi", "b": NORMAL}
    # and the fan-out puts it on the lane, and the lane message brings it back unchanged
    queue = MemoryQueue()
    fanout = FanOut(service.ledger, queue, queue_lease_s=600)
    for item in items:
        fanout.admit_and_enqueue_chunk(item, 2.0)
    sent = [codec.parse_message_body(codec.message_body(q)) for q in queue.sent]
    assert {q.unit_id: q.input for q in sent} == {"a": "hi", "b": NORMAL}
    # and the model answers what it was asked
    model = SimulatedModelPlane(10**9, seed=3)
    results = [
        model.invoke(ModelRequest(q.run_id, q.unit_id, q.attempt, q.tokens, q.input, q.tokens))
        for q in sent
    ]
    assert {q.unit_id: r.output for q, r in zip(sent, results, strict=True)} == {
        "a": simulated_output("hi", "a", 0),
        "b": simulated_output(NORMAL, "b", 0),
    }


def test_a_replay_with_the_same_request_written_another_way_is_the_same_batch() -> None:
    service = batches()
    first = parse_submit(json.dumps({"units": [{**unit(), "input": REQUEST}]}))
    again = parse_submit(json.dumps({"units": [{**unit(), "input": NORMAL}]}))
    run = service.submit_body("acme", first, "k1", 1.0).run
    replay = service.submit_body("acme", again, "k1", 2.0)
    assert replay.created is False and replay.run.run_id == run.run_id


# ------------------------------------------------------------------ the fan-out's 256 KiB


def _child_bytes(run_id: str, input_: Any) -> int:
    chunk = {"run_id": run_id, "units": [{"unit_id": "u1", "input": input_}]}
    child = map_child_input(run_id, 0, chunk)
    return len(json.dumps(child, separators=(",", ":"), ensure_ascii=False).encode())


def test_the_fan_out_measures_a_request_as_its_item_carries_it_to_the_byte() -> None:
    # Given a request whose texts are within the 100,000 characters but, with their JSON and
    # 3-byte characters, exactly fill a map child's 256 KiB
    run_id = batch_id_for("acme", "k1")

    def request(text: str) -> dict[str, Any]:
        return turns("question", "answer", text, system=[{"text": "s"}])  # in normal form

    room = MAX_MAP_ITEM_BYTES - _child_bytes(run_id, request(""))
    fits = "漢" * (room // 3) + "x" * (room % 3)
    assert len(fits) < 100_000 and _child_bytes(run_id, request(fits)) == MAX_MAP_ITEM_BYTES
    # Then it is admitted, and one more byte is a 400 naming the unit's input
    body = parse_submit(json.dumps({"units": [{**unit(), "input": request(fits)}]}))
    blobs = MemoryBlobs()
    assert batches(blobs).submit_body("acme", body, "k1", 1.0).created
    stored = manifest_units(blobs.get_json(manifest_key(run_id)))[0]
    assert _child_bytes(run_id, stored["input"]) == MAX_MAP_ITEM_BYTES
    over = parse_submit(json.dumps({"units": [{**unit(), "input": request(fits + "x")}]}))
    nothing = MemoryBlobs()
    with pytest.raises(InvalidInput, match="the limit is 262,144") as refused:
        batches(nothing).submit_body("acme", over, "k1", 1.0)
    assert refused.value.field == "units[0].input" and nothing.objects == {}


def test_the_fan_out_measures_the_normal_form_not_the_body() -> None:
    """A string system prompt grows by its block's JSON in normal form: the check measures what
    the manifest item carries."""
    run_id = batch_id_for("acme", "k1")
    as_string = turns("q", system="be terse")
    normal = prompts.normalise(as_string)
    assert _child_bytes(run_id, normal) - _child_bytes(run_id, as_string) == len('[{"text":}]')
