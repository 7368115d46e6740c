"""What a careless or hostile tenant sends gets a 4xx naming the field, and writes nothing:
oversized numbers and nesting, a top-up past the deployment's ceiling, a replayed
Idempotency-Key with another body or during a drain; and every IAM role name is a tenant."""

from __future__ import annotations

import json
import random
import re

import pytest

from infra.constants import FANOUT_ASL
from swarm.api.models import MAX_MANIFEST_UNITS, MAX_MAP_ITEM_BYTES, MAX_REMAINDER_LISTED
from swarm.core.errors import Conflict, InvalidInput, NotFound
from swarm.core.memory import MemoryBlobs, MemoryDrain
from swarm.core.records import Lane, RunState
from swarm.service.api_models import (
    Forbidden,
    TooLarge,
    parse_resume,
    parse_submit,
    tenant_of,
)
from swarm.service.batches import (
    Draining,
    batch_id_for,
    map_child_input,
    spec_key,
)
from tests.unit.test_api_contract import batches, unit


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ('{"units": [{"unit_id": "u", "projected_tokens": ' + "9" * 5_000 + "}]}", "digits"),
        ("[" * 5_000 + "]" * 5_000, "nested too deeply"),
    ],
)
def test_numbers_and_nesting_past_pythons_limits_are_a_400(body: str, says: str) -> None:
    for parse in (parse_submit, parse_resume):
        with pytest.raises(InvalidInput, match=says) as refused:
            parse(body)
        assert refused.value.field == "body"


def test_a_top_up_past_the_deployments_ceiling_is_a_400_and_changes_nothing() -> None:
    service = batches()  # max_budget 10**9
    body = parse_submit(json.dumps({"units": [unit(tokens=50)], "budget": 10}))
    run = service.submit_body("acme", body, None, 1.0).run
    assert service.ledger.admit(run.run_id, "u1", 0, 2.0).reason == "budget"
    for top_up in (10**9, 10**40):
        with pytest.raises(InvalidInput, match="top up at most 999,999,990") as refused:
            service.resume("acme", run.run_id, top_up, 3.0)
        assert refused.value.field == "top_up"
    after = service.ledger.run(run.run_id)
    assert (after.budget, after.state) == (10, RunState.EXHAUSTED)
    service.resume("acme", run.run_id, 10**9 - 10, 4.0)  # up to the ceiling exactly
    assert service.ledger.run(run.run_id).budget == 10**9


def test_a_replayed_key_with_other_inputs_is_a_conflict() -> None:
    service = batches()
    first = parse_submit(json.dumps({"units": [unit(text="summarise A")]}))
    other = parse_submit(json.dumps({"units": [unit(text="summarise B")]}))
    service.submit_body("acme", first, "k1", 1.0)
    with pytest.raises(Conflict, match="Idempotency-Key was used for a different batch"):
        service.submit_body("acme", other, "k1", 2.0)
    assert service.submit_body("acme", first, "k1", 3.0).created is False


def test_a_replay_during_a_drain_is_refused_like_new_work() -> None:
    drain = MemoryDrain()
    service = batches(drain=drain)
    body = parse_submit(json.dumps({"units": [unit()]}))
    service.submit_body("acme", body, "k1", 1.0)
    drain.set(True)
    with pytest.raises(Draining):
        service.submit_body("acme", body, "k1", 2.0)
    drain.set(False)
    assert service.submit_body("acme", body, "k1", 3.0).created is False


def test_an_expired_manifest_leaves_the_spec_to_decide_a_replay() -> None:
    blobs = MemoryBlobs()
    service = batches(blobs)
    body = parse_submit(json.dumps({"units": [unit()]}))
    run_id = service.submit_body("acme", body, "k1", 1.0).run.run_id
    del blobs.objects[f"manifests/{run_id}/units.json"]  # the bucket's lifecycle expired it
    assert service.submit_body("acme", body, "k1", 2.0).created is False


@pytest.mark.parametrize("name", ["a+b", "a=b", "a,b", "a.b@example", "A_b-9", "x" * 64])
def test_every_iam_role_name_character_makes_a_tenant(name: str) -> None:
    arn = f"arn:aws:sts::123456789012:assumed-role/swarm-tenant-{name}/session"
    assert tenant_of(arn, "swarm-tenant-") == name
    service = batches()
    body = parse_submit(json.dumps({"units": [unit()]}))
    run = service.submit_body(name, body, None, 1.0).run
    assert service.status(name, run.run_id, 1.0)["batch_id"] == run.run_id


@pytest.mark.parametrize("name", ["", "x" * 65, "a/b", "a b", "a#b"])
def test_a_tenant_no_role_name_could_have_is_refused(name: str) -> None:
    body = parse_submit(json.dumps({"units": [unit()]}))
    with pytest.raises(InvalidInput, match="not a valid tenant"):
        batches().submit_body(name, body, None, 1.0)


def _child_bytes(run_id: str, text: str) -> int:
    chunk = {"run_id": run_id, "units": [{"unit_id": "u1", "input": text}]}
    child = map_child_input(run_id, 0, chunk)
    return len(json.dumps(child, separators=(",", ":"), ensure_ascii=False).encode())


def test_a_unit_too_big_for_a_map_child_is_refused_before_anything_is_written() -> None:
    blobs = MemoryBlobs()
    service = batches(blobs)
    text = "漢" * 88_000  # within the 100,000 characters, but 264,000 bytes of UTF-8
    body = parse_submit(json.dumps({"units": [unit(), unit("u2", text=text)]}))
    with pytest.raises(InvalidInput, match="'u2' is 264,") as refused:
        service.submit_body("acme", body, "k1", 1.0)
    assert refused.value.field == "units[1].input"
    assert blobs.objects == {}


def test_the_fan_out_limit_is_the_state_input_limit_to_the_byte() -> None:
    run_id = batch_id_for("acme", "k1")
    overhead = _child_bytes(run_id, "")
    room = MAX_MAP_ITEM_BYTES - overhead
    fits = "漢" * (room // 3) + "x" * (room % 3)  # 3 bytes each: within the 100,000 characters
    assert _child_bytes(run_id, fits) == MAX_MAP_ITEM_BYTES
    for text, accepted in ((fits, True), (fits + "x", False)):
        body = parse_submit(json.dumps({"units": [unit(text=text)]}))
        if accepted:
            assert batches().submit_body("acme", body, "k1", 1.0).created
        else:
            with pytest.raises(InvalidInput, match="the limit is 262,144"):
                batches().submit_body("acme", body, "k1", 1.0)


def test_the_map_child_input_is_what_the_state_machine_builds() -> None:
    # the placeholders CDK substitutes (some unquoted) read as 0
    definition = json.loads(re.sub(r"\$\{\w+\}", "0", FANOUT_ASL.read_text()))
    selector = definition["States"]["FanOut"]["ItemSelector"]
    assert {k.removesuffix(".$") for k in selector} == set(map_child_input("b", 0, {}))
    assert selector["chunk.$"] == "$$.Map.Item.Value"


def test_a_unit_the_governor_can_never_grant_is_refused_at_submit() -> None:
    service = batches()  # a bucket of 570,000 tokens
    config = service.governor.config
    most = int(config.bucket_capacity - config.reserve(Lane.NORMAL))
    assert service.submit_body(
        "acme", parse_submit(json.dumps({"units": [unit(tokens=most)]})), None, 1.0
    ).created
    body = parse_submit(json.dumps({"units": [unit(), unit("u2", tokens=most + 1)]}))
    with pytest.raises(InvalidInput, match="can never be granted") as refused:
        service.submit_body("acme", body, None, 1.0)
    assert refused.value.field == "units[1].projected_tokens"


@pytest.mark.parametrize(
    "arn",
    [
        "arn:aws:sts::123456789012:assumed-role/swarm-tenant-acme/session",
        "arn:aws:iam::123456789012:role/team/swarm-tenant-acme",
    ],
)
def test_a_tenant_role_of_another_account_is_not_a_tenant(arn: str) -> None:
    assert tenant_of(arn, "swarm-tenant-", account="123456789012") == "acme"
    with pytest.raises(Forbidden, match="account 123456789012 is not this deployment's"):
        tenant_of(arn, "swarm-tenant-", account="210987654321")


def test_a_big_exhausted_batch_lists_a_bounded_remainder() -> None:
    service = batches()
    many = [unit(f"u{i:04d}", tokens=100) for i in range(1_500)]
    body = parse_submit(json.dumps({"units": many, "budget": 50}))
    run = service.submit_body("acme", body, None, 1.0).run
    assert service.ledger.admit(run.run_id, "u0000", 0, 2.0).reason == "budget"  # exhausted
    doc = service.status("acme", run.run_id, 3.0)
    assert doc["counts"]["remainder"] == 1_500
    assert doc["remainder"] == [f"u{i:04d}" for i in range(MAX_REMAINDER_LISTED)]


def test_a_batch_at_the_manifest_limit_with_random_ids_is_taken_and_one_more_is_a_413() -> None:
    # Given an uploaded manifest of MAX_MANIFEST_UNITS (100,000) units with random, UUID-like
    # ids: its spec compresses to ~2 MB, far past what one ledger item holds (400 KB)
    blobs = MemoryBlobs()
    rng = random.Random(0)
    key = "manifests/uploads/acme/big.json"
    ids = [f"{rng.getrandbits(128):032x}" for _ in range(MAX_MANIFEST_UNITS)]
    blobs.put_json(key, [unit(uid) for uid in ids])
    service = batches(blobs)
    service.executions.open_step = None  # type: ignore[attr-defined]
    # When it is submitted
    body = parse_submit(json.dumps({"manifest": {"key": key}}))
    run = service.submit_body("acme", body, "k1", 1.0).run
    # Then the batch is taken, opening: the spec (every unit) is in S3, not in the ledger's item
    assert run.state is RunState.OPENING and run.units_total == MAX_MANIFEST_UNITS
    assert run.spec.units == ()
    spec = blobs.get_json(spec_key(run.run_id))
    assert [uid for uid, _ in spec["units"]] == ids
    # and one unit more is refused before anything is written (413: too large)
    blobs.put_json(key, [unit(uid) for uid in [*ids, "one-more"]])
    with pytest.raises(TooLarge, match="100,000"):
        service.submit_body("acme", parse_submit(json.dumps({"manifest": {"key": key}})), "k2", 1.0)
    with pytest.raises(NotFound):
        service.ledger.run(batch_id_for("acme", "k2"), opening=True)
