"""The work's product: every unit's outcome is kept once, read back by page or file, and private.

On the in-memory twins of every port (the same services the Lambda functions run); the model is
wrapped so each test knows what it answered, independently of what the store kept.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest

from swarm.api.models import LAMBDA_PAYLOAD_BYTES, ResultsQuery
from swarm.core.errors import InvalidInput, NotFound
from swarm.core.lanes import QueuedUnit
from swarm.core.memory import MemoryResults
from swarm.core.ports import ModelPlane, ModelRequest, ModelResult
from swarm.core.records import Lane, RunState, UnitState
from swarm.core.results import LOST, MAX_INLINE_OUTPUT_BYTES, AttemptOutcome, attempt_key
from swarm.service.api_models import parse_results_query
from swarm.service.results import Results, decode_token, encode_token
from swarm.service.worker import Ack
from tests.unit.test_service_flow import Plane


@dataclass
class Recording:
    """The model plane as the test sees it: what it answered for each (unit, attempt)."""

    inner: ModelPlane
    answers: dict[tuple[str, int], ModelResult] = field(default_factory=dict)

    def invoke(self, request: ModelRequest) -> ModelResult:
        result = self.inner.invoke(request)
        self.answers[(request.unit_id, request.attempt)] = result
        return result


def plane(failure_rate: float = 0.25) -> tuple[Plane, Recording]:
    p = Plane(failure_rate=failure_rate)
    recording = Recording(p.worker.model)
    p.worker.model = recording
    return p, recording


def pages(p: Plane, run_id: str, **query: object) -> list[dict[str, object]]:
    """Every unit of every page, following next_token."""
    reader = Results(p.ledger, p.results)
    units: list[dict[str, object]] = []
    token = None
    for _ in range(1_000):
        page = reader.page(p.ledger.run(run_id), ResultsQuery(next_token=token, **query))
        units += page["units"]
        token = page.get("next_token")
        if token is None:
            return units
    raise AssertionError("the pages never ended")


def test_every_completed_unit_has_exactly_the_output_of_its_successful_attempt() -> None:
    p, model = plane(failure_rate=0.25)
    run_id = p.submit(60)
    p.run(run_id)
    run = p.ledger.run(run_id)
    assert run.state is RunState.COMPLETED and run.retries > 0  # failures were retried

    units = pages(p, run_id, limit=7)
    assert [u["unit_id"] for u in units] == sorted(f"u{i:03d}" for i in range(60))
    for unit in units:
        attempt = unit["attempt"]
        answered = model.answers[(str(unit["unit_id"]), int(attempt))]  # type: ignore[call-overload]
        if unit["state"] == "completed":
            assert answered.succeeded and unit["output"] == answered.output
            assert unit["output"]  # the simulated model answers something
            assert "error" not in unit
        else:  # dead-lettered after max_attempts failures: the last failure's error, no output
            assert unit["state"] == "dead_lettered" and "output" not in unit
            assert unit["error"] == answered.error
        assert unit["tokens"] == sum(
            r.tokens for (uid, _), r in model.answers.items() if uid == unit["unit_id"]
        )
    # failed attempts keep their error and usage too
    failed = [(k, r) for k, r in model.answers.items() if not r.succeeded]
    assert failed
    for (unit_id, attempt), answer in failed:
        (stored,) = p.results.outcomes(run_id, [(unit_id, attempt, None)])
        assert stored is not None and not stored.succeeded
        assert stored.error == answer.error and stored.tokens == answer.tokens


def test_a_duplicate_delivery_or_a_second_write_never_changes_an_output() -> None:
    p, _ = plane(failure_rate=0.0)
    run_id = p.submit(3)
    p.run(run_id)
    before = pages(p, run_id)
    # the same message delivered again after the unit completed
    item = QueuedUnit(run_id, "u001", "acme", Lane.NORMAL, 0, 10_037, "")
    assert isinstance(p.worker.process(item).outcome, Ack)
    # a worker that outlived its lease tries to write attempt 0 of u001 again
    forged = AttemptOutcome(run_id, "u001", 0, True, 5, output="something else")
    assert p.results.record(forged) is None
    assert pages(p, run_id) == before


def test_a_lost_attempts_late_answer_is_never_the_units_output() -> None:
    p, _ = plane(failure_rate=0.0)
    run_id = p.submit(1)
    p.fan_out()
    item = p.queue.receive()
    assert item is not None
    # the worker claims attempt 0 and dies; the lease expires and the attempt is settled lost
    p.ledger.claim(run_id, "u000", 0, p.clock.now(), lease_s=300)
    p.clock.t += 301
    p.ledger.reclaim_unit(run_id, "u000", p.clock.now())
    # ... but it had got its answer and writes it late
    p.results.record(AttemptOutcome(run_id, "u000", 0, True, 10_000, output="late answer"))
    (unit,) = pages(p, run_id)
    assert unit["state"] == "pending" and unit["error"] == LOST and "output" not in unit
    p.queue.send(QueuedUnit(run_id, "u000", "acme", Lane.NORMAL, 1, 10_000, ""))
    p.pump()
    (unit,) = pages(p, run_id)
    assert unit["state"] == "completed" and unit["attempt"] == 1
    assert unit["output"] != "late answer"


def test_partial_results_are_readable_while_exhausted_and_resume_keeps_every_output() -> None:
    p, _ = plane(failure_rate=0.0)
    run_id = p.submit(30, budget=150_000)
    p.run(run_id)
    assert p.ledger.run(run_id).state is RunState.EXHAUSTED
    exhausted = {u["unit_id"]: u for u in pages(p, run_id)}
    completed = {k: u["output"] for k, u in exhausted.items() if u["state"] == "completed"}
    remainder = [k for k, u in exhausted.items() if u["state"] == "remainder"]
    assert completed and remainder and len(completed) + len(remainder) == 30
    assert [u["unit_id"] for u in pages(p, run_id, state="remainder")] == remainder
    # the closure's results file holds the same lines, and the event says where it is
    event, detail = p.events.published[-1]
    assert event == "run.exhausted"
    key = detail["results"]["key"]
    assert detail["results"]["completed"] == len(completed)
    lines = [json.loads(line) for line in p.results.objects[key].splitlines()]
    assert {line["unit_id"]: line for line in lines} == exhausted

    p.batches.resume("acme", run_id, 10**7, p.clock.now())
    p.run(run_id)
    done = {u["unit_id"]: u for u in pages(p, run_id)}
    assert all(u["state"] == "completed" for u in done.values())
    assert {k: done[k]["output"] for k in completed} == completed  # unchanged by the resume
    final = p.events.published[-1][1]["results"]["key"]
    assert final != key and key in p.results.objects  # one file per closure


def test_pages_filter_by_state_stop_on_size_and_link_an_answer_too_long_to_inline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    p, _ = plane(failure_rate=0.0)
    run_id = p.submit(5)
    p.run(run_id)
    # an answer of 1.5 MiB: kept whole, linked rather than inlined
    key = attempt_key(run_id, "u002", 0)
    doc = json.loads(p.results.objects[key])
    p.results.objects[key] = json.dumps({**doc, "output": "x" * 1_572_864}).encode()
    monkeypatch.setattr("swarm.service.results.MAX_RESULTS_PAGE_BYTES", 1_000)
    reader = Results(p.ledger, p.results)
    first = reader.page(p.ledger.run(run_id), ResultsQuery(limit=5))
    assert len(first["units"]) < 5 and "next_token" in first  # stopped early on size
    units = pages(p, run_id, limit=5)
    assert len(units) == 5
    (big,) = [u for u in units if u["unit_id"] == "u002"]
    assert "output" not in big and str(big["output_url"]).endswith(f"{key}?expires=300")
    assert pages(p, run_id, state="dead_lettered") == []


def test_a_page_of_non_ascii_answers_fits_lambdas_response_as_the_api_sends_it() -> None:
    """The page's bound counts each answer as the response carries it: the handler's JSON
    escapes every non-ASCII character (6 bytes), and the proxy response escapes that body again
    (7 bytes). Counted in UTF-8 (3 bytes a CJK character), four answers just under the inline
    limit made a 4 MiB page whose response was 9.8 MB, past Lambda's 6 MB."""
    p, _ = plane(failure_rate=0.0)
    run_id = p.submit(4)
    p.run(run_id)
    answer = "答" * (MAX_INLINE_OUTPUT_BYTES // 3 - 100)  # inlined: under the limit in UTF-8
    for unit_id in ("u000", "u001", "u002", "u003"):
        key = attempt_key(run_id, unit_id, 0)
        doc = json.loads(p.results.objects[key])
        p.results.objects[key] = json.dumps({**doc, "output": answer}).encode()
    reader = Results(p.ledger, p.results)
    token = None
    seen: list[str] = []
    for _ in range(10):
        page = reader.page(p.ledger.run(run_id), ResultsQuery(limit=4, next_token=token))
        # the response Lambda returns: the body as functions/api.py writes it, in the proxy JSON
        response = json.dumps({"statusCode": 200, "body": json.dumps(page)})
        assert len(response) < LAMBDA_PAYLOAD_BYTES, (len(response), len(page["units"]))
        assert all(u["output"] == answer for u in page["units"])  # inlined, whole
        seen += [u["unit_id"] for u in page["units"]]
        token = page.get("next_token")
        if token is None:
            break
    assert seen == ["u000", "u001", "u002", "u003"]


def test_the_download_appears_once_the_results_file_is_written() -> None:
    p, _ = plane(failure_rate=0.0)
    run_id = p.submit(2)
    p.fan_out()
    p.pump()
    reader = Results(p.ledger, p.results, download_url_s=120)
    assert p.ledger.run(run_id).state is RunState.COMPLETED
    assert "download" not in reader.page(p.ledger.run(run_id), ResultsQuery())  # not yet written
    p.finalizer.finalize(run_id, p.clock.now())
    download = reader.page(p.ledger.run(run_id), ResultsQuery())["download"]
    assert download["expires_in_s"] == 120
    assert download["location"] == f"memory://results/{run_id}/completed-0.jsonl"


def test_a_results_file_too_long_for_one_call_is_written_on_by_the_next_calls() -> None:
    # Given a closed run of 60 units and a results file cut in parts of ~5 lines
    p, _ = plane(failure_rate=0.25)
    run_id = p.submit(60)
    p.fan_out()
    p.pump()
    assert p.ledger.run(run_id).state is RunState.COMPLETED
    whole = MemoryResults(objects=dict(p.results.objects))  # the outcomes, then the file at once
    file = Results(p.ledger, whole).write_file(p.ledger.run(run_id), p.ledger.units(run_id))
    assert file is not None
    expected = whole.objects[file]
    p.results.part_bytes = len(expected) // 12
    # When each call has time for one part only (keep_going is False once a part is kept)
    answers = []
    for _ in range(20):
        answer = p.finalizer.finalize(run_id, p.clock.now(), keep_going=lambda: False)
        answers.append(answer)
        if answer["closed"]:
            break
    # Then every call but the last says it is writing, nothing is announced until the last,
    # and the file is the same as one written at once: every line once, in unit id order
    full, size = 0, 0  # the parts the lines make: each call kept one, the last call the tail
    for line in expected.splitlines(keepends=True):
        size += len(line)
        if size >= p.results.part_bytes:
            full, size = full + 1, 0
    assert full >= 10 and len(answers) == full + (1 if size else 0)
    assert all(a == {**answers[0]} for a in answers[:-1])
    assert answers[0]["writing"] and answers[0]["state"] == "completed"
    assert answers[-1]["announced"] and answers[-1]["writing"] is False
    assert len(p.events.published) == 1
    assert p.results.objects[f"results/{run_id}/completed-0.jsonl"] == expected
    assert p.results.partial == {}


def test_another_tenant_cannot_see_a_batch_or_its_results() -> None:
    p, _ = plane(failure_rate=0.0)
    run_id = p.submit(2)
    p.run(run_id)
    with pytest.raises(NotFound, match="no batch"):
        p.batches.run_for("globex", run_id)
    assert p.batches.run_for("acme", run_id).run_id == run_id


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"state": "done"}, "state"),
        ({"limit": "0"}, "limit"),
        ({"limit": "1001"}, "limit"),
        ({"limit": "many"}, "limit"),
        ({"next_token": ""}, "next_token"),
        ({"page": "2"}, "page"),
    ],
)
def test_a_bad_query_is_a_400_naming_the_parameter(query: dict[str, str], field: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        parse_results_query(query)
    assert refused.value.field == field


def test_a_token_this_api_did_not_give_is_refused() -> None:
    assert decode_token(encode_token("u-007")) == "u-007"
    for forged in ("%%%", "////", encode_token("a b"), encode_token("x" * 300)):
        with pytest.raises(InvalidInput, match="next_token"):
            decode_token(forged)


def test_unit_states_are_the_documented_filter() -> None:
    assert parse_results_query({"state": "completed", "limit": "5"}).state is UnitState.COMPLETED
