"""A unit's input as a Converse-shaped request through the deployed handlers on moto: the API
stores it in normal form, the fan-out and the lane messages carry it unchanged, the workers'
model answers it, and a request the API refuses is a 400 naming the text, with nothing written."""

from __future__ import annotations

import json
from typing import Any

from swarm.adapters.simulated_model import answered_by, simulated_input_tokens, simulated_output
from swarm.contract import MODELS
from swarm.core.codec import parse_message
from swarm.core.prompts import normalise
from swarm.core.records import Lane
from swarm.service.batches import manifest_units
from tests.integration.plane import ControlPlane, ledger

TURNS = [
    {"role": "user", "content": [{"text": "Summarise the incident."}]},
    {"role": "assistant", "content": [{"text": "Which one?"}]},
    {"role": "user", "content": [{"text": "The outage of 3 May."}, {"text": "Be brief."}]},
]
INPUTS: dict[str, Any] = {
    "plain": "Summarise the incident of 3 May.",
    "system": {
        "system": "You are terse.",
        "messages": TURNS[:1],
        "inferenceConfig": {"temperature": 0.2, "topP": None, "stopSequences": ["END"]},
    },
    "turns": {"system": [{"text": "A"}, {"text": "B"}], "messages": TURNS},
    "short": {"messages": TURNS, "inferenceConfig": {"maxTokens": 40}},
}


def submit(plane: ControlPlane) -> str:
    body = {
        "units": [
            {"unit_id": name, "projected_tokens": 2_000, "input": prompt}
            for name, prompt in INPUTS.items()
        ]
    }
    status, doc, _ = plane.api("POST", "/batches", body)
    assert status == 201, doc
    return str(doc["batch_id"])


def test_a_request_runs_from_the_api_to_the_model_in_normal_form(plane: ControlPlane) -> None:
    # Given a batch whose units' inputs are a string and Converse-shaped requests
    batch_id = submit(plane)
    normal = {name: normalise(prompt) for name, prompt in INPUTS.items()}
    assert normal["system"] == {
        "system": [{"text": "You are terse."}],
        "messages": TURNS[:1],
        "inferenceConfig": {"temperature": 0.2, "stopSequences": ["END"]},
    }
    # Then the manifest holds each in normal form
    s3 = plane.client("s3")
    manifest = s3.get_object(Bucket=plane.bucket, Key=f"manifests/{batch_id}/units.json")
    chunks = json.loads(manifest["Body"].read())
    assert {i["unit_id"]: i["input"] for i in manifest_units(chunks)} == normal
    # and the fan-out's lane messages carry it unchanged
    plane.run_state_machine()
    messages = plane.receive(Lane.NORMAL)
    queued = [q for m in messages for q in parse_message(m["Body"])]  # as the worker reads them
    assert {q.unit_id: q.input for q in queued} == normal
    plane.deliver(Lane.NORMAL, messages)
    plane.work()
    plane.finalize(batch_id)
    run = ledger(plane).run(batch_id)
    assert run.completed == len(INPUTS) and run.spent <= run.budget
    # and each unit's answer is the model's answer to its own prompt
    status, page, _ = plane.api("GET", f"/batches/{batch_id}/results")
    assert status == 200, page
    got = {u["unit_id"]: u for u in page["units"]}
    models = json.loads(plane.env("worker")[MODELS])
    default_model_id = models["catalog"][models["default"]]["model_id"]
    for name, prompt in normal.items():
        unit = got[name]
        assert unit["output"] == simulated_output(prompt, name, unit["attempt"])
        assert unit["input_tokens"] == simulated_input_tokens(prompt)
        assert unit["input_tokens"] + unit["output_tokens"] == unit["tokens"] <= 2_000
        # the default model (no unit names one), answered by the simulated plane
        assert unit["model_id"] == answered_by(default_model_id)
    # the unit that asked for at most 40 tokens of answer got 40
    assert (got["short"]["output_tokens"], got["short"]["stop_reason"]) == (40, "max_tokens")


def test_a_blank_text_in_a_request_is_a_400_naming_it_and_writes_nothing(
    plane: ControlPlane,
) -> None:
    blank = {"messages": [{"role": "user", "content": [{"text": "ok"}, {"text": " \n"}]}]}
    body = {
        "units": [
            {"unit_id": "a", "projected_tokens": 100, "input": "fine"},
            {"unit_id": "b", "projected_tokens": 100, "input": blank},
        ]
    }
    status, doc, _ = plane.api("POST", "/batches", body)
    assert status == 400 and doc["error"] == "invalid_request"
    assert doc["message"].startswith(
        "units[1].input.messages[0].content[1].text: must contain text"
    )
    listed = plane.client("s3").list_objects_v2(Bucket=plane.bucket).get("KeyCount", 0)
    assert listed == 0
