"""One contract for the API: API Gateway's request models are the handler's models, the service
reads manifests and keys, and there is one ``safe_to_deploy`` rule."""

from __future__ import annotations

import json
from typing import Any

import pytest
from jsonschema import Draft4Validator  # type: ignore[import-untyped]

from swarm.api.models import (
    MAX_BUDGET_TOKENS,
    MAX_INLINE_UNITS,
    MAX_MANIFEST_BYTES,
    ApprovalDecision,
    BatchResume,
    BatchSubmission,
    UploadRequest,
)
from swarm.api.openapi import HANDLER_ONLY, ROUTES, gateway_schema
from swarm.core.backpressure import ShedPolicy
from swarm.core.errors import InvalidInput, SwarmError
from swarm.core.governor import GovernorConfig
from swarm.core.lanes import QueuedUnit
from swarm.core.memory import (
    InMemoryGovernor,
    InMemoryLedger,
    MemoryBlobs,
    MemoryDrain,
    MemoryExecutions,
    MemoryMappings,
    MemoryQueue,
    MemoryRunning,
)
from swarm.core.ports import MappingState
from swarm.core.records import Lane
from swarm.service.api_models import (
    TooLarge,
    parse_decision,
    parse_resume,
    parse_submit,
    parse_upload,
)
from swarm.service.batches import Batches, BatchesConfig
from swarm.service.drain import DrainController, safe_to_deploy
from swarm.service.opener import open_at_once

#: The JSON Schema draft-4 keywords API Gateway's models accept (no $ref: it is inlined).
DRAFT4_KEYWORDS = {
    "$schema",
    "title",
    "type",
    "description",
    "default",
    "enum",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "uniqueItems",
    "anyOf",
    "allOf",
    "oneOf",
    "not",
}


def unit(unit_id: str = "u1", tokens: int = 5, text: str = "hi") -> dict[str, Any]:
    return {"unit_id": unit_id, "projected_tokens": tokens, "input": text}


def turns(*texts: str, **request: Any) -> dict[str, Any]:
    """A Converse-shaped input: the texts as alternating user and assistant turns."""
    roles = ("user", "assistant")
    messages = [{"role": roles[i % 2], "content": [{"text": t}]} for i, t in enumerate(texts)]
    return {"messages": messages, **request}


#: Converse-shaped inputs the API accepts
VALID_REQUESTS = [
    turns("hi"),
    turns("a", "b", "c", system="be terse"),
    turns("a", system=[{"text": "x"}, {"text": "y"}], inferenceConfig={}),
    turns("a", inferenceConfig={"maxTokens": 1, "temperature": 0, "topP": 1}),
    turns("a", inferenceConfig={"temperature": 0.5, "topP": 0.25, "stopSequences": ["END", "x"]}),
    turns("a", inferenceConfig={"maxTokens": None, "temperature": None, "stopSequences": None}),
    turns("a", inferenceConfig=None),
    turns("x" * 50_000, "y" * 10_000, "z" * 40_000),  # 100,000 characters in all
    turns(*["t"] * 99),  # 99 turns: user, assistant, ..., user
    {"messages": [{"role": "user", "content": [{"text": "a"}] * 20}]},
]

#: Converse-shaped inputs both refuse
INVALID_REQUESTS = [
    turns(" "),
    turns("a", "\n"),
    turns(""),
    turns("a", system=""),
    turns("a", system=" "),
    turns("a", system=[]),
    turns("a", system=[{"text": "\t"}]),
    turns("a", system=None),
    turns("a", system=5),
    turns("a", system=[{"text": "x", "cachePoint": {}}]),
    {"messages": []},
    {"messages": [{"role": "user", "content": []}]},
    {"messages": [{"role": "system", "content": [{"text": "a"}]}]},
    {"messages": [{"role": "user"}]},
    {"messages": [{"role": "user", "content": [{"image": {}}]}]},
    {"messages": "hi"},
    {"messages": None},
    {"system": "s"},
    {},
    turns("a", toolConfig={"tools": []}),
    turns("a", inferenceConfig={"temperature": 1.5}),
    turns("a", inferenceConfig={"temperature": -0.1}),
    turns("a", inferenceConfig={"topP": "0.5"}),
    turns("a", inferenceConfig={"topP": True}),
    turns("a", inferenceConfig={"maxTokens": 0}),
    turns("a", inferenceConfig={"maxTokens": 10_000_001}),
    turns("a", inferenceConfig={"maxTokens": "5"}),
    turns("a", inferenceConfig={"stopSequences": [""]}),
    turns("a", inferenceConfig={"stopSequences": [" "]}),
    turns("a", inferenceConfig={"stopSequences": ["x" * 101]}),
    turns("a", inferenceConfig={"stopSequences": "END"}),
    turns("a", inferenceConfig={"topK": 5}),
    turns("x" * 100_001),
    [],
    5,
    None,
    True,
]

#: Converse-shaped inputs only the handler can refuse (a JSON schema cannot say it, or the
#: gateway leaves maxItems to the handler)
HANDLER_ONLY_REQUESTS = [
    turns("a", "b"),  # ends with the assistant
    {"messages": [{"role": "assistant", "content": [{"text": "a"}]}]},
    {"messages": [{"role": "user", "content": [{"text": t}]} for t in "ab"]},  # not alternating
    turns("x" * 60_000, "y", "z" * 40_000),  # 100,001 characters in all
    turns(*["t"] * 101),  # 101 turns
    {"messages": [{"role": "user", "content": [{"text": "a"}] * 21}]},
    turns("a", system=[{"text": "s"}] * 11),
    turns("a", inferenceConfig={"stopSequences": ["a", "b", "c", "d", "e"]}),
    turns("an unpaired surrogate: \ud800"),  # JSON can say it, UTF-8 (and the model) cannot
    "an unpaired surrogate: \udfff",
]

VALID_SUBMISSIONS = [
    {"units": [unit()]},
    *({"units": [unit(), {**unit("u2"), "input": request}]} for request in VALID_REQUESTS),
    {"units": [unit("a.b_c:d-1", 10_000_000, "x" * 100_000)], "lane": "high"},
    {"units": [unit()], "lane": "low", "budget": 0, "max_attempts": 100},
    {"units": [unit()], "budget": None, "max_attempts": None, "manifest": None},
    {"manifest": {"key": "manifests/uploads/acme/u.json"}, "units": None},
    {"manifest": {"key": "k"}},  # the tenant's prefix is the service's check (400 too)
    {"units": [unit()], "budget_usd": 12.5},
    {"units": [unit()], "budget_usd": 0.000001},
    {"units": [unit()], "budget_usd": 1_000_000},
]

#: Refused by both the gateway and the handler (the gateway answers 400 first on AWS).
INVALID_FOR_BOTH = [
    {"units": [unit(tokens=0)]},
    {"units": [unit(tokens=10_000_001)]},
    {"units": [unit(tokens=True)]},
    {"units": [unit("a b")]},
    {"units": [unit("-a")]},
    {"units": [unit("x" * 129)]},
    {"units": [{"unit_id": "a", "projected_tokens": 5}]},
    {"units": [unit(text="")]},
    {"units": [unit(text=" \n\t")]},
    {"units": [unit(text="\x1e\x85 ")]},  # whitespace to Python (JSON Schema's \S says not)
    {"units": [unit(text="x" * 100_001)]},
    {"units": [{**unit(), "extra": 1}]},
    {"units": []},
    {"units": "u1"},
    {"lane": "urgent", "units": [unit()]},
    {"lane": None, "units": [unit()]},
    {"units": [unit()], "budget": -1},
    {"units": [unit()], "budget": "lots"},
    {"units": [unit()], "budget": 1.5},
    {"units": [unit()], "max_attempts": 0},
    {"units": [unit()], "max_attempts": 101},
    {"units": [unit()], "tenant": "someone-else"},
    {"manifest": {"key": ""}},
    {"manifest": {"key": "k" * 1025}},
    {"manifest": {}},
    {"manifest": {"key": "k", "bucket": "b"}},
    [],
    "units",
    # exactly one of units and manifest, the schema's oneOf (a null one is left out)
    {},
    {"budget": 5},
    {"units": [unit()], "manifest": {"key": "k"}},
    {"units": None, "manifest": None},
    # over the document's ceiling, whatever the deployment's own maximum
    {"units": [unit()], "budget": MAX_BUDGET_TOKENS + 1},
    # dollars: a number > 0 of at most 6 decimal places, at most the document's ceiling
    {"units": [unit()], "budget_usd": 0},
    {"units": [unit()], "budget_usd": -1.5},
    {"units": [unit()], "budget_usd": "12.50"},
    {"units": [unit()], "budget_usd": True},
    {"units": [unit()], "budget_usd": 0.0000001},
    {"units": [unit()], "budget_usd": 1_000_000.5},
    *({"units": [unit(), {**unit("u2"), "input": request}]} for request in INVALID_REQUESTS),
]

#: Valid in shape, refused by the handler alone: what a JSON schema cannot say.
HANDLER_ONLY_REFUSALS = [
    *({"units": [{**unit(), "input": request}]} for request in HANDLER_ONLY_REQUESTS),
]


def gateway_accepts(schema: dict[str, Any], body: Any) -> bool:
    return bool(Draft4Validator(schema).is_valid(body))


def handler_accepts(parse: Any, body: Any) -> bool:
    try:
        parse(json.dumps(body))
    except SwarmError:
        return False
    return True


def keywords(schema: Any) -> set[str]:
    if isinstance(schema, list):
        return set().union(*(keywords(s) for s in schema))
    if not isinstance(schema, dict):
        return set()
    found = set(schema)
    for key, value in schema.items():
        if key == "properties":
            found |= set().union(*(keywords(s) for s in value.values()))
        elif key in ("items", "additionalProperties", "not", "anyOf", "allOf", "oneOf"):
            found |= keywords(value)
    return found


@pytest.mark.parametrize("model", [BatchSubmission, BatchResume, UploadRequest])
def test_the_gateway_models_are_draft_4_with_nothing_to_resolve(model: Any) -> None:
    schema = gateway_schema(model)
    Draft4Validator.check_schema(schema)
    assert schema["title"] == model.__name__
    assert keywords(schema) <= DRAFT4_KEYWORDS
    assert "$ref" not in json.dumps(schema) and "$defs" not in json.dumps(schema)


def test_every_request_body_of_a_route_has_a_gateway_model() -> None:
    assert {r.request for r in ROUTES if r.request} == {
        BatchSubmission,
        BatchResume,
        UploadRequest,
        ApprovalDecision,
    }


def test_a_decision_is_checked_alike_by_the_gateway_and_the_handler() -> None:
    schema = gateway_schema(ApprovalDecision)
    for ok in ({"decision": "approve"}, {"decision": "reject", "reason": "not that note"}):
        assert gateway_accepts(schema, ok) and handler_accepts(parse_decision, ok)
    for bad in ({"decision": "maybe"}, {"decision": "approve", "who": "me"}, {}):
        assert not gateway_accepts(schema, bad) and not handler_accepts(parse_decision, bad)
    # what a schema cannot say: a rejection needs a reason that is not blank
    blank = {"decision": "reject", "reason": "  "}
    assert gateway_accepts(schema, blank) and not handler_accepts(parse_decision, blank)


@pytest.mark.parametrize("body", VALID_SUBMISSIONS)
def test_what_the_handler_accepts_the_gateway_accepts(body: Any) -> None:
    assert handler_accepts(parse_submit, body)
    assert gateway_accepts(gateway_schema(BatchSubmission), body)


@pytest.mark.parametrize("body", INVALID_FOR_BOTH)
def test_what_the_gateway_refuses_the_handler_refuses(body: Any) -> None:
    assert not gateway_accepts(gateway_schema(BatchSubmission), body)
    assert not handler_accepts(parse_submit, body)


@pytest.mark.parametrize("body", HANDLER_ONLY_REFUSALS)
def test_what_a_schema_cannot_say_is_left_to_the_handler(body: Any) -> None:
    assert gateway_accepts(gateway_schema(BatchSubmission), body)
    assert not handler_accepts(parse_submit, body)


def test_too_many_inline_units_reach_the_handler_for_its_413() -> None:
    body = {"units": [unit(f"u{i}") for i in range(MAX_INLINE_UNITS + 1)]}
    assert {"maxItems"} == HANDLER_ONLY
    assert gateway_accepts(gateway_schema(BatchSubmission), body)
    with pytest.raises(TooLarge):
        parse_submit(json.dumps(body))


@pytest.mark.parametrize(
    ("body", "valid"),
    [
        ({"top_up": 1}, True),
        ({"top_up": MAX_BUDGET_TOKENS}, True),
        ({"top_up": MAX_BUDGET_TOKENS + 1}, False),  # could never fit under the ceiling
        ({"top_up": 0}, False),
        ({"top_up": -5}, False),
        ({"top_up": "1000"}, False),
        ({"top_up": 1.0}, False),
        ({}, False),
        ({"top_up": 1, "budget": 2}, False),
        ({"top_up_usd": 0.000001}, True),
        ({"top_up_usd": 12.5}, True),
        ({"top_up_usd": 1_000_000}, True),
        ({"top_up_usd": 1_000_000.5}, False),
        ({"top_up_usd": 0}, False),
        ({"top_up_usd": "12.50"}, False),
        ({"top_up": 1, "top_up_usd": 1.5}, False),
        ({"top_up": 1, "top_up_usd": None}, True),
        ({"top_up": None, "top_up_usd": 1.5}, True),
    ],
)
def test_the_resume_model_is_the_same_on_both_sides(body: Any, valid: bool) -> None:
    assert handler_accepts(parse_resume, body) is valid
    # the gateway may be looser than the handler (1.0 is an integer to JSON Schema), never
    # stricter
    if valid:
        assert gateway_accepts(gateway_schema(BatchResume), body)
    elif body != {"top_up": 1.0}:
        assert not gateway_accepts(gateway_schema(BatchResume), body)


@pytest.mark.parametrize(
    ("body", "valid"),
    [
        ({"size_bytes": 1}, True),
        ({"size_bytes": MAX_MANIFEST_BYTES}, True),
        ({"size_bytes": MAX_MANIFEST_BYTES + 1}, False),
        ({"size_bytes": 0}, False),
        ({"size_bytes": "12"}, False),
        ({"size_bytes": 12, "key": "manifests/uploads/other/x.json"}, False),
        ({}, False),
    ],
)
def test_the_upload_model_is_the_same_on_both_sides(body: Any, valid: bool) -> None:
    assert handler_accepts(parse_upload, body) is valid
    assert gateway_accepts(gateway_schema(UploadRequest), body) is valid


# ------------------------------------------------------------------ the service's side


def batches(blobs: MemoryBlobs | None = None, drain: MemoryDrain | None = None) -> Batches:
    ledger, blobs = InMemoryLedger(), blobs or MemoryBlobs()
    return Batches(
        ledger,
        InMemoryGovernor(GovernorConfig(600_000, 0.95, initial_fill=1.0), now=0.0),
        MemoryQueue(),
        blobs,
        MemoryExecutions(open_step=open_at_once(ledger, blobs)),
        drain or MemoryDrain(),
        BatchesConfig(ShedPolicy({}), max_budget=10**9, default_budget=123_456, default_attempts=7),
    )


def test_a_submission_takes_the_deployments_defaults_for_what_it_leaves_out() -> None:
    service = batches()
    body = parse_submit(json.dumps({"units": [unit()]}))
    run = service.submit_body("acme", body, None, 1.0).run
    assert (run.budget, run.spec.max_attempts, run.spec.lane) == (123_456, 7, Lane.NORMAL)


def test_the_service_reads_the_tenants_manifest() -> None:
    blobs = MemoryBlobs()
    key = "manifests/uploads/acme/m.json"
    blobs.put_json(key, [unit("a"), unit("b")])
    service = batches(blobs)
    body = parse_submit(json.dumps({"manifest": {"key": key}, "budget": 10}))
    submitted = service.submit_body("acme", body, None, 1.0)
    assert submitted.created and submitted.run.units_total == 2
    doc = service.describe(submitted.run, 1.0)
    assert doc["units"] == 2 and "remainder" not in doc


@pytest.mark.parametrize(
    ("key", "says"),
    [
        ("manifests/uploads/other/m.json", "must be an object under manifests/uploads/acme/"),
        ("manifests/uploads/acme/../other/m.json", "must be an object under"),
        ("manifests/uploads/acme/missing.json", "no object"),
    ],
)
def test_a_manifest_the_tenant_may_not_use_is_a_400_on_its_key(key: str, says: str) -> None:
    body = parse_submit(json.dumps({"manifest": {"key": key}}))
    with pytest.raises(InvalidInput, match=says) as refused:
        batches().submit_body("acme", body, None, 1.0)
    assert refused.value.field == "manifest.key"


@pytest.mark.parametrize("key", ["", "k" * 256])
def test_an_idempotency_key_out_of_bounds_is_a_400(key: str) -> None:
    body = parse_submit(json.dumps({"units": [unit()]}))
    with pytest.raises(InvalidInput, match="must be 1-255 characters"):
        batches().submit_body("acme", body, key, 1.0)


def test_the_same_idempotency_key_is_the_same_batch() -> None:
    service = batches()
    body = parse_submit(json.dumps({"units": [unit()]}))
    first = service.submit_body("acme", body, "k1", 1.0)
    again = service.submit_body("acme", body, "k1", 2.0)
    assert (first.created, again.created) == (True, False)
    assert first.run.run_id == again.run.run_id


def mappings(*states: str) -> list[MappingState]:
    return [
        MappingState(lane, f"esm-{lane.value}", s) for lane, s in zip(Lane, states, strict=True)
    ]


@pytest.mark.parametrize(
    ("draining", "running", "states", "safe"),
    [
        (True, 0, ("Disabled", "Disabled", "Disabled"), True),
        (True, 0, ("Disabled", "Disabling", "Disabled"), True),
        (True, 0, ("Disabled", "Enabled", "Disabled"), False),
        (True, 1, ("Disabled", "Disabled", "Disabled"), False),
        (False, 0, ("Disabled", "Disabled", "Disabled"), False),
        (True, 0, None, True),  # the API's view: the mappings are not visible to it
        (True, 2, None, False),
        (False, 0, None, False),
    ],
)
def test_one_safe_to_deploy_rule(
    draining: bool, running: int, states: tuple[str, ...] | None, safe: bool
) -> None:
    seen = None if states is None else mappings(*states)
    assert safe_to_deploy(draining, running, seen) is safe
    # never before the switch has reached every function's cache
    assert safe_to_deploy(draining, running, seen, settled=False) is False


def test_the_api_drain_view_and_the_drain_controller_answer_by_the_same_rule() -> None:
    drain = MemoryDrain()
    service = batches(drain=drain)
    running = MemoryRunning()
    service.running = running
    controller = DrainController(drain, MemoryMappings(), service.queue, running)
    assert service.drain_status(100.0) == {
        "draining": False,
        "settled": True,
        "running": 0,
        "queued": 0,
        "safe_to_deploy": False,
    }
    drain.set(True)
    drain.settled_at = 105.0  # the functions' caches see it 5 s after the change
    # until then, nobody calls it safe: a submit or a worker may still act on "off"
    assert service.drain_status(104.9) == {
        "draining": True,
        "settled": False,
        "running": 0,
        "queued": 0,
        "safe_to_deploy": False,
    }
    # settled, nothing in flight: the API's view (no mappings) says safe; the controller,
    # which sees the mappings still enabled, does not until it has applied it
    assert service.drain_status(105.0)["safe_to_deploy"] is True
    assert controller.status(105.0)["safe_to_deploy"] is False
    report = controller.apply(105.0)
    assert report["safe_to_deploy"] is True
    assert {k: v for k, v in report.items() if k != "mappings"} == service.drain_status(105.0)


def test_only_running_work_holds_a_deploy_up_however_deep_the_lanes() -> None:
    # Given the switch on and settled, and lanes far deeper than anything runs: messages
    # hidden until their units' turn (not visible), delayed and visible
    drain = MemoryDrain(on=True, settled_at=0.0)
    service = batches(drain=drain)
    running = MemoryRunning()
    service.running = running
    controller = DrainController(drain, MemoryMappings(), service.queue, running)
    controller.apply(1.0)
    service.queue.in_flight[Lane.NORMAL] = 5_000  # type: ignore[attr-defined]
    for n in range(3):
        service.queue.send(QueuedUnit("r", f"u{n}", "acme", Lane.NORMAL, 0, 100))
    # When one invocation still runs two units
    running.enter("inv-1", {"r": 2}, expires_at=60.0, now=1.0)
    # Then both views wait for it alone, and count every message as queued
    for view in (service.drain_status(2.0), controller.status(2.0)):
        assert (view["running"], view["queued"], view["safe_to_deploy"]) == (2, 5_003, False)
    # and once it leaves (or its entry's lease ends), it is safe with the lanes as deep
    running.leave("inv-1")
    for view in (service.drain_status(3.0), controller.status(3.0)):
        assert (view["running"], view["queued"], view["safe_to_deploy"]) == (0, 5_003, True)
    running.enter("dead", {"r": 1}, expires_at=60.0, now=3.0)
    assert service.drain_status(59.0)["safe_to_deploy"] is False
    assert service.drain_status(60.0)["safe_to_deploy"] is True
