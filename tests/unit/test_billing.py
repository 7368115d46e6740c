"""The bill's arithmetic (swarm/local/billing.py) and its prices (swarm/bench/prices.py,
swarm/bench/cost.py): AWS's rounding rules, worked out by hand for each case."""

from __future__ import annotations

import datetime
import math
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from swarm.bench import cost, prices
from swarm.local import billing
from swarm.local.billing import IndexEntry
from tests.unit.helpers import run_cli

KB = 1024


# ------------------------------------------------------------------ DynamoDB
@pytest.mark.parametrize(
    ("size", "units"),
    [(0, 1), (1, 1), (KB, 1), (KB + 1, 2), (2_500, 3), (400 * KB, 400)],
)
def test_a_write_costs_one_unit_per_started_kilobyte(size: int, units: int) -> None:
    assert billing.write_units(size) == units
    assert billing.write_units(size, transactional=True) == 2 * units


@pytest.mark.parametrize(
    ("size", "strong", "eventual", "transactional"),
    [
        (0, 1, 0.5, 2),  # a missing item still costs the minimum
        (4 * KB, 1, 0.5, 2),
        (4 * KB + 1, 2, 1.0, 4),
        (8 * KB, 2, 1.0, 4),
        (10 * KB, 3, 1.5, 6),
    ],
)
def test_a_read_costs_one_unit_per_started_4_kb_half_if_eventual_twice_if_transactional(
    size: int, strong: float, eventual: float, transactional: float
) -> None:
    assert billing.read_units(size, consistent=True) == strong
    assert billing.read_units(size, consistent=False) == eventual
    assert billing.read_units(size, transactional=True) == transactional


def test_an_item_write_is_billed_on_the_larger_size_a_delete_on_the_item_deleted() -> None:
    # an update that grows an item past 1 KB: the size after
    assert billing.write_op_units("Update", 900, 1_100, succeeded=True) == 2
    # a put that replaces a bigger item: the size before
    assert billing.write_op_units("Put", 3_000, 200, succeeded=True) == 3
    assert billing.write_op_units("Delete", 3_000, None, succeeded=True) == 3
    assert billing.write_op_units("Delete", None, None, succeeded=True) == 1


def test_a_failed_condition_is_billed_on_the_existing_item_or_one_unit() -> None:
    assert billing.write_op_units("Put", 2_500, 2_600, succeeded=False) == 3
    assert billing.write_op_units("Update", None, None, succeeded=False) == 1
    # in a transaction: twice; a condition check costs the item checked
    assert billing.write_op_units("Update", 2_500, None, False, transactional=True) == 6
    assert billing.write_op_units("ConditionCheck", 100, 100, True, transactional=True) == 2


def test_a_global_secondary_index_costs_what_its_entry_changes() -> None:
    entry = IndexEntry(key="k", projected="p", size=100)
    assert billing.index_write_units(None, None) == 0
    assert billing.index_write_units(None, entry) == 1  # the item enters the index
    assert billing.index_write_units(entry, None) == 1  # and leaves it
    assert billing.index_write_units(entry, entry) == 0  # nothing it projects changed
    assert billing.index_write_units(entry, IndexEntry("k", "q", 100)) == 1
    assert billing.index_write_units(entry, IndexEntry("k2", "p", 100)) == 2  # a delete, a put
    big = IndexEntry("k", "q", 1_500)
    assert billing.index_write_units(entry, big) == 2
    assert billing.index_write_units(IndexEntry("k0", "p", 1_500), big) == 4


# ------------------------------------------------------------------ SQS, EventBridge
@pytest.mark.parametrize(
    ("payload", "requests"),
    [(0, 1), (1, 1), (64 * KB, 1), (64 * KB + 1, 2), (256 * KB, 4), (1024 * KB, 16)],
)
def test_sqs_bills_a_request_per_started_64_kb_chunk(payload: int, requests: int) -> None:
    assert billing.sqs_requests(payload) == requests


def test_eventbridge_bills_each_entry_in_64_kb_chunks() -> None:
    assert billing.billed_events([10, 70_000, 64 * KB]) == 1 + 2 + 1
    assert billing.billed_events([]) == 0


# ------------------------------------------------------------------ durations
@pytest.mark.parametrize(
    ("duration", "billed"),
    [(0.0, 0.001), (0.0001, 0.001), (0.001, 0.001), (0.1234, 0.124), (0.1 * 3, 0.3)],
)
def test_lambda_rounds_each_invocation_up_to_the_millisecond(
    duration: float, billed: float
) -> None:
    assert billing.lambda_billed_seconds(duration) == pytest.approx(billed)


def test_gb_seconds_are_duration_times_configured_memory() -> None:
    assert billing.gb_seconds(0.124, 512) == pytest.approx(0.062)
    assert billing.gb_seconds(2.0, 1024) == 2.0


@pytest.mark.parametrize(
    ("duration", "memory_mb", "gb_s"),
    [
        (0.05, 0, 0.1 * 64 / 1024),  # at least 100 ms of one 64 MB chunk
        (0.1 * 3, 50, 0.3 * 64 / 1024),  # float noise does not start another 100 ms
        (0.31, 64, 0.4 * 64 / 1024),
        (1.0, 65, 1.0 * 128 / 1024),  # 65 MB: two chunks
    ],
)
def test_an_express_execution_is_billed_in_100_ms_and_64_mb_increments(
    duration: float, memory_mb: float, gb_s: float
) -> None:
    assert billing.express_gb_seconds(duration, memory_mb) == pytest.approx(gb_s)


def test_the_time_scaled_part_of_a_duration_is_converted_back_to_the_deployed_clock() -> None:
    # 1 s measured at x10, 0.6 s of it in the (scaled) model call: 0.4 s + 6 s deployed
    assert billing.deployed_seconds(1.0, 0.6, 10) == pytest.approx(6.4)
    assert billing.deployed_seconds(1.0, 0.0, 10) == 1.0
    assert billing.deployed_seconds(1.0, 5.0, 10) == pytest.approx(10.0)  # at most all of it


# ------------------------------------------------------------------ the meter
@pytest.fixture
def meter() -> billing.Meter:
    m = billing.Meter(enabled=True)
    m.configure(time_scale=10, parent_type="STANDARD", child_type="EXPRESS")
    return m


def _lines(m: billing.Meter) -> dict[tuple[str, str], tuple[int, float]]:
    return {
        (d["service"], d["operation"]): (d["requests"], d["quantity"])
        for d in m.snapshot()["lines"]
    }


def test_an_invocation_bills_its_deployed_duration_split_where_it_went(
    meter: billing.Meter,
) -> None:
    # 1.0 s measured at x10: 0.5 s in the model call (5 s deployed), 0.1 s sleeping for tokens
    # (1 s deployed), 0.4 s of the function's own work: 6.4 s billed, 512 MB = 3.2 GB-s
    meter.lambda_invocation(
        "worker", 512, 1.0, model_s=0.5, slept_s=0.1, waited_s=0.15, architecture="x86_64"
    )
    lines = _lines(meter)
    assert lines[("lambda", "Invoke")] == (1, 1)
    assert lines[("lambda", "duration: the model call")] == pytest.approx((0, 2.5))
    assert lines[("lambda", "duration: sleeping for tokens")] == pytest.approx((0, 0.5))
    assert lines[("lambda", "duration")] == pytest.approx((0, 0.2))
    use = meter.snapshot()["lambda"]["worker"]
    assert use["billed_s"] == pytest.approx(6.4)
    assert use["gb_s"] == pytest.approx(3.2)
    # what the worker reported waiting: 0.1 s of sleep (1 s deployed) + 0.05 s of requests
    assert use["waited_deployed_s"] == pytest.approx(1.05)
    assert use["billed_ms_p10"] == use["billed_ms_p90"] == pytest.approx(6400)


def test_standard_transitions_are_billed_express_children_by_request_and_duration(
    meter: billing.Meter,
) -> None:
    meter.execution_started(billing.PARENT)
    meter.state_entered(billing.PARENT, "FanOut")
    for _ in range(2):
        meter.execution_started(billing.CHILD)
        meter.state_entered(billing.CHILD, "AdmitAndEnqueue")
        meter.execution_finished(billing.CHILD, 0.25)  # 300 ms billed
    meter.state_entered(billing.PARENT, "Finalize", retry=True)
    assert meter.snapshot()["executions_running"] == 1
    meter.execution_finished(billing.PARENT, 3.0)
    lines = _lines(meter)
    assert lines[("stepfunctions", "state transition: FanOut")] == (1, 1)
    assert lines[("stepfunctions", "retry: Finalize")] == (1, 1)
    assert lines[("stepfunctions", "map child started (Distributed Map)")] == (2, 2)
    assert lines[("stepfunctions", "Express execution (map child)")] == (2, 2)
    assert lines[("stepfunctions", "Express execution (map child): duration")] == pytest.approx(
        (0, 2 * 0.3 * 64 / 1024)
    )
    assert not any("AdmitAndEnqueue" in op for _s, op in lines)  # Express: no transitions
    snapshot = meter.snapshot()
    assert snapshot["executions_running"] == 0
    assert snapshot["stepfunctions"]["map child"]["transitions"] == 2


def test_a_standard_map_child_bills_its_transitions_and_no_express_request() -> None:
    m = billing.Meter(enabled=True)
    m.configure(child_type="STANDARD")
    m.execution_started(billing.CHILD)
    m.state_entered(billing.CHILD, "AdmitAndEnqueue")
    m.execution_finished(billing.CHILD, 0.2)
    lines = _lines(m)
    assert lines[("stepfunctions", "state transition: AdmitAndEnqueue (map child)")] == (1, 1)
    assert lines[("stepfunctions", "map child started (Distributed Map)")] == (1, 1)
    assert not any("Express" in op for _s, op in lines)


def test_a_meter_that_is_off_counts_nothing_and_a_reset_starts_a_new_window() -> None:
    m = billing.Meter()
    m.add("sqs", "SendMessage", "worker", billing.SQS_REQUESTS)
    m.lambda_invocation("worker", 512, 1.0)
    assert m.snapshot()["lines"] == [] and m.snapshot()["lambda"] == {}
    assert m.caller("AKID") is None
    m.enabled = True
    m.add("sqs", "SendMessage", "worker", billing.SQS_REQUESTS)
    assert len(m.snapshot()["lines"]) == 1
    m.reset()
    assert m.snapshot()["lines"] == []


def test_callers_are_named_and_the_emulators_own_requests_excluded() -> None:
    m = billing.Meter(enabled=True)
    m.name_caller("AKIDWORKER", "worker")
    m.exclude("AKIDADMIN")
    assert m.caller("AKIDWORKER") == "worker"
    assert m.caller("AKIDOTHER") == "unknown"
    assert m.caller("AKIDADMIN") is None
    assert m.caller(None) == "unsigned"


def test_a_bad_configuration_is_refused() -> None:
    with pytest.raises(ValueError, match="STANDARD or EXPRESS"):
        billing.Meter().configure(child_type="FAST")
    with pytest.raises(ValueError, match="time_scale must be > 0"):
        billing.Meter().configure(time_scale=0)


def test_the_signing_key_is_read_from_the_header_or_a_presigned_url() -> None:
    header = {
        "Authorization": "AWS4-HMAC-SHA256 Credential=ASIAKEY/20261201/us-east-1/sqs/aws4_request, "
        "SignedHeaders=host, Signature=abc"
    }
    assert billing.access_key(header) == "ASIAKEY"
    query = {"X-Amz-Credential": ["ASIAPRESIGNED/20261201/us-east-1/s3/aws4_request"]}
    assert billing.access_key({}, query) == "ASIAPRESIGNED"
    assert billing.access_key({}) is None


@pytest.mark.parametrize(
    ("method", "has_key", "query", "copy", "operation", "price"),
    [
        ("PUT", True, [], False, "PutObject", billing.S3_PUT),
        ("PUT", True, [], True, "CopyObject", billing.S3_PUT),
        ("PUT", True, ["partNumber", "uploadId"], False, "UploadPart", billing.S3_PUT),
        ("POST", True, ["uploads"], False, "CreateMultipartUpload", billing.S3_PUT),
        ("POST", True, ["uploadId"], False, "CompleteMultipartUpload", billing.S3_PUT),
        ("GET", True, [], False, "GetObject", billing.S3_GET),
        ("HEAD", True, [], False, "HeadObject", billing.S3_GET),
        ("GET", False, ["list-type", "prefix"], False, "ListObjectsV2", billing.S3_PUT),
        ("GET", False, [], False, "ListObjects", billing.S3_PUT),
        ("GET", False, ["location"], False, "GetBucket location", billing.S3_GET),
        ("DELETE", True, [], False, "DeleteObject", billing.S3_DELETE),
        ("DELETE", True, ["uploadId"], False, "AbortMultipartUpload", billing.S3_DELETE),
    ],
)
def test_s3_requests_are_billed_by_class(
    method: str, has_key: bool, query: list[str], copy: bool, operation: str, price: str
) -> None:
    assert billing.s3_operation(method, has_key, query, copy) == (operation, price)


def test_the_deployed_execution_types_are_read_from_the_template() -> None:
    machine: dict[str, Any] = {
        "Type": "AWS::StepFunctions::StateMachine",
        "Properties": {"DefinitionSubstitutions": {"MapExecutionType": "EXPRESS"}},
    }
    assert billing.state_machine_types({"Resources": {"M": machine}}) == ("STANDARD", "EXPRESS")
    machine["Properties"]["StateMachineType"] = "EXPRESS"
    assert billing.state_machine_types({"Resources": {"M": machine}}) == ("EXPRESS", "EXPRESS")
    assert billing.state_machine_types({"Resources": {}}) == ("STANDARD", "STANDARD")


# ------------------------------------------------------------------ prices and the bench
def _price_keys() -> set[str]:
    keys = {
        value
        for name, value in vars(billing).items()
        if name.isupper() and isinstance(value, str) and "." in value
    }
    return keys | set(billing.LAMBDA_GB_S.values()) | {billing.NOT_BILLED}


def test_every_quantity_the_meter_counts_has_a_dated_price_with_its_source() -> None:
    assert _price_keys() <= set(prices.PRICES)
    datetime.date.fromisoformat(prices.AS_OF)
    for key, price in prices.PRICES.items():
        assert price.usd >= 0 and price.per >= 1, key
        if price.usd > 0:
            assert price.source.startswith("https://aws.amazon.com/"), key
    with pytest.raises(KeyError, match=re.escape("no price for 'x.y' in swarm/bench/prices.py")):
        prices.price_of("x.y")


def _bill(lines: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "window_s": 60.0,
        "time_scale": 10.0,
        "execution_types": {"parent": "STANDARD", "map child": "EXPRESS"},
        "lines": lines,
        "lambda": {},
        "stepfunctions": {},
        "dynamodb": {},
        **extra,
    }


def _line(service: str, operation: str, price: str, requests: int, quantity: float) -> Any:
    return {
        "service": service,
        "operation": operation,
        "caller": "worker",
        "price": price,
        "requests": requests,
        "quantity": quantity,
    }


def test_the_bill_per_unit_applies_each_lines_price() -> None:
    bill = _bill(
        [
            # 200 units: 600 write units at $0.625/M; 200 map children at $0.025/1,000
            _line("dynamodb", "UpdateItem", billing.DYNAMODB_WRITE, 400, 600),
            _line("stepfunctions", "map child", billing.SFN_TRANSITIONS, 200, 200),
            _line("lambda", "duration", billing.LAMBDA_GB_S["x86_64"], 0, 100.0),
            _line("ssm", "GetParameter", billing.SSM_STANDARD, 50, 50),  # free
        ]
    )
    result = cost.summarize(bill, 200)
    per_line = {d["operation"]: d for d in result["lines"]}
    assert per_line["UpdateItem"]["requests_per_unit"] == 2
    assert per_line["UpdateItem"]["usd_per_million_units"] == pytest.approx(3 * 0.625)
    assert per_line["map child"]["usd_per_million_units"] == pytest.approx(25.0)
    # 0.5 GB-s per unit at $0.0000166667
    assert per_line["duration"]["usd_per_million_units"] == pytest.approx(0.5 * 16.6667)
    assert not per_line["GetParameter"]["billed"]
    # free requests are listed, not counted as billed requests
    assert result["requests_per_unit"] == pytest.approx(2 + 1)
    assert result["usd_per_million_units"] == pytest.approx(1.875 + 25 + 8.33335)
    assert result["by_service"]["stepfunctions"]["usd_per_million_units"] == pytest.approx(25)
    assert result["window_deployed_s"] == 600.0
    text = cost.render({**result, "lane": "high"})
    assert "on the high lane" in text
    assert "billed requests per unit: 3.00 (target <= 8)" in text
    assert f"US dollars per million units: {result['usd_per_million_units']:.2f}" in text


def test_an_agent_batchs_bill_is_also_per_model_turn_the_tools_own_apart() -> None:
    # 10 agent units of 8 turns: the worker's 400 writes and a notes tool's 80 invocations
    lines = [
        _line("dynamodb", "UpdateItem", billing.DYNAMODB_WRITE, 400, 400),
        _line("lambda", "Invoke", billing.LAMBDA_REQUESTS, 80, 80),
    ]
    lines[1]["caller"] = "notes"  # a tool function's label: its source's name
    result = cost.summarize(_bill(lines), 10)
    figures = cost.per_turn(result, 80)
    # Then a turn's bill is the worker's 5 writes; the tool's invocation is listed apart
    assert figures["turns_per_unit"] == 8
    assert figures["requests_per_turn"] == pytest.approx(5.0)
    assert figures["usd_per_million_turns"] == pytest.approx(5 * 0.625)
    assert figures["tools"]["requests_per_turn"] == pytest.approx(1.0)
    assert [d["caller"] for d in figures["tools"]["lines"]] == ["notes"]
    text = cost.render({**result, "agent": figures})
    assert "per model turn: 5.00 billed requests (target <= 5)" in text


def test_the_bill_tells_what_the_runs_length_drives_from_what_its_units_drive() -> None:
    empty = f"ReceiveMessage (empty; x{billing.ESM_IDLE_POLLERS}: AWS's idle pollers)"
    lines = [
        _line("sqs", empty, billing.SQS_REQUESTS, 300, 300),
        _line("stepfunctions", "state transition: CountPoll", billing.SFN_TRANSITIONS, 20, 20),
        _line("stepfunctions", "state transition: FanOut", billing.SFN_TRANSITIONS, 1, 1),
        _line("lambda", "Invoke", billing.LAMBDA_REQUESTS, 20, 20),
        _line("sqs", "ReceiveMessage", billing.SQS_REQUESTS, 40, 40),
        _line("dynamodb", "UpdateItem", billing.DYNAMODB_WRITE, 400, 400),
    ]
    lines[0]["caller"] = lines[4]["caller"] = billing.ESM_CALLER
    lines[1]["caller"] = lines[2]["caller"] = "state machine"
    lines[3]["caller"] = "finalizer"
    result = cost.summarize(_bill(lines), 200)  # 60 s at x10: 600 s deployed, 1,200 units an hour
    timed = result["time_driven"]
    # the idle polls, the finalize loop's states and the finalizer's invocations; not the
    # fan-out's state, the receives that got messages or the units' writes
    assert timed["requests_per_unit"] == pytest.approx((300 + 20 + 20) / 200)
    assert timed["requests_per_hour"] == pytest.approx(340 * 6)
    assert timed["units_per_hour"] == pytest.approx(1_200)
    assert timed["usd_per_hour"] == pytest.approx(timed["usd_per_million_units"] * 200 / 1e6 * 6)
    assert "of them driven by the run's length (idle long polls" in cost.render(result)


def test_the_bench_runs_cdk_jsons_timings_on_the_local_clock() -> None:
    timings = cost.deployed_timings(10)
    # cdk.json: a 30 s finalizer poll is 3 s of a Wait state at x10; the others are deployed
    # seconds the wiring scales
    assert (timings["finalizer_poll_s"], timings["finalizer_max_poll_s"]) == (3, 30)
    assert timings["sweeper_rate_minutes"] == 15
    assert timings["governor_max_wait_s"] > 0 and timings["worker_timeout_s"] >= 10
    assert cost.deployed_timings(1000)["finalizer_poll_s"] == 1  # whole seconds, at least 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["bench", "cost", "--units", "0"], "--units: 0 is out of range"),
        (["bench", "cost", "--time-scale", "0"], "--time-scale: 0 is out of range"),
        (["bench", "cost", "--lane", "urgent"], "--lane: invalid choice: 'urgent'"),
    ],
)
def test_bench_cost_refuses_bad_options_in_one_line(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli(args, capsys)
    assert code == 2 and message in err and "Traceback" not in err


def test_targets_are_issue_15s() -> None:
    assert cost.TARGET_REQUESTS_PER_UNIT == 8 and cost.TARGET_USD_PER_MILLION_UNITS == 10
    assert math.isclose(prices.price_of(billing.SFN_TRANSITIONS).usd_per_unit * 1e6, 25.0)


HANDLER = """
import time

from swarm.local import functions


def handler(event, context):
    invocation = functions.host().current()
    started = time.perf_counter()
    time.sleep(event["sleep"])
    for offset, length in event.get("model_spans", []):  # as the shared model plane records them
        invocation.span(functions.MODEL, started + offset, started + offset + length)
    return {"function": invocation.function_name}
"""


def test_the_function_host_bills_each_invocation_with_its_functions_memory(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from swarm.local import functions

    (tmp_path / "billprobe.py").write_text(HANDLER)
    monkeypatch.syspath_prepend(str(tmp_path))
    host = functions.FunctionHost(
        lambda service: None, profiles={"fn-1": functions.FunctionProfile("probe", 256)}
    )
    monkeypatch.setattr(functions, "_HOST", [host])  # installed, as the local stack does
    meter = billing.METER
    monkeypatch.setattr(meter, "enabled", True)
    monkeypatch.setattr(meter, "time_scale", 10.0)
    meter.reset()
    try:
        # two model calls at once (a worker's messages run together), 10 ms in all
        event = {"sleep": 0.02, "model_spans": [[0.0, 0.008], [0.004, 0.006]]}
        assert host.call("fn-1", "billprobe.handler", {}, event) == {"function": "fn-1"}
        host.call("fn-2", "billprobe.handler", {}, {"sleep": 0.0})
        host.call("fn-2", "billprobe.handler", {}, {"sleep": 0.0})  # its sandbox, warm
        snapshot = meter.snapshot()
    finally:
        meter.reset()
    probe = snapshot["lambda"]["probe"]
    assert probe["invocations"] == 1 and probe["memory_mb"] == 256
    assert probe["measured_s"] >= 0.02 and probe["model_s"] == pytest.approx(0.01)
    # the model's 10 ms (the union of its calls) are 100 ms deployed: billed at least 0.01 +
    # 0.1 s, on 256 MB
    assert probe["billed_s"] >= 0.11
    assert probe["gb_s"] == pytest.approx(probe["billed_s"] * 256 / 1024)
    # a function without a profile: its handler's module, Lambda's default 128 MB
    assert snapshot["lambda"]["billprobe"]["memory_mb"] == 128
    # each function's first invocation started a sandbox (its INIT is billed apart), the
    # second reused it
    assert (probe["cold_starts"], probe["module"]) == (1, "billprobe")
    assert snapshot["lambda"]["billprobe"]["invocations"] == 2
    assert snapshot["lambda"]["billprobe"]["cold_starts"] == 1


def test_an_invocations_scaled_time_is_the_union_of_its_threads_spans() -> None:
    from swarm.local.functions import MODEL, SLEEP, Invocation, union_s

    assert union_s([]) == 0.0
    assert union_s([(0.0, 1.0), (0.5, 2.0), (3.0, 4.0), (3.5, 3.6)]) == pytest.approx(3.0)
    invocation = Invocation("fn", {})
    invocation.span(MODEL, 0.0, 2.0)
    invocation.span(MODEL, 1.0, 3.0)  # another message's call, at the same time: billed once
    invocation.span(SLEEP, 2.5, 5.0)  # sleeping for tokens while a call runs counts as the call
    invocation.span(SLEEP, 4.0, 4.5)
    model_s, slept_s = invocation.scaled_s()
    assert model_s == pytest.approx(3.0) and slept_s == pytest.approx(2.0)


def test_each_cold_start_bills_its_init_at_the_functions_memory(meter: billing.Meter) -> None:
    # Given three worker invocations (256 MB, arm64), two of them in new sandboxes, and one
    # warm fan-out invocation
    for cold in ("functions.worker", None, "functions.worker"):
        meter.lambda_invocation("worker", 256, 0.1, architecture="arm64", cold_start=cold)
    meter.lambda_invocation("fanout", 512, 0.1)
    bill = meter.snapshot()
    assert bill["lambda"]["worker"]["cold_starts"] == 2
    assert bill["lambda"]["worker"]["module"] == "functions.worker"
    assert bill["lambda"]["fanout"]["cold_starts"] == 0
    # When each cold start's INIT is billed, measured at 0.8 s for the worker's module
    asked: list[str] = []

    def init_s(module: str) -> float:
        asked.append(module)
        return 0.8

    billed = cost.bill_init(bill, init_s)
    # Then the worker pays 2 x 0.8 s x 0.25 GB at the arm64 price, the warm function nothing
    assert asked == ["functions.worker"]
    (init,) = [d for d in billed["lines"] if d["operation"] == cost.INIT_OPERATION]
    assert (init["caller"], init["price"]) == ("worker", billing.LAMBDA_GB_S["arm64"])
    assert init["quantity"] == pytest.approx(0.4)
    worker = billed["lambda"]["worker"]
    assert worker["gb_s"] == pytest.approx(bill["lambda"]["worker"]["gb_s"] + 0.4)
    assert worker["init_s"] == 0.8
    # and the summary prices it, apart, and counts it in the total
    result = cost.summarize(billed, 100)
    usd = 0.4 * prices.price_of(billing.LAMBDA_GB_S["arm64"]).usd_per_unit / 100 * 1e6
    assert result["lambda"]["init_usd_per_million_units"] == pytest.approx(usd)
    assert result["usd_per_million_units"] > usd
    assert "INIT" in cost.render(result)
    # the snapshot the meter gave is unchanged
    assert all(d["operation"] != cost.INIT_OPERATION for d in bill["lines"])


def test_an_init_is_measured_in_a_fresh_interpreter() -> None:
    # a module this process has imported already is imported afresh: a real cold start
    assert 0 < cost.measure_init_s("swarm.core.records") < 30
    with pytest.raises(Exception, match="returned non-zero exit status"):
        cost.measure_init_s("swarm.no_such_module")


def test_a_cold_start_is_timed_from_the_asset_alone(tmp_path: Path) -> None:
    # Given an asset whose handler imports the standard library, and one whose handler imports
    # a package this checkout has installed but the asset does not hold
    (tmp_path / "functions").mkdir()
    (tmp_path / "functions" / "__init__.py").write_text("")
    (tmp_path / "functions" / "lean.py").write_text("import json\n")
    (tmp_path / "functions" / "leaky.py").write_text("import boto3\n")
    # Then the first is timed, and the second fails as its cold start would on Lambda
    assert 0 < cost.measure_init_s("functions.lean", tmp_path) < 30
    with pytest.raises(subprocess.CalledProcessError):
        cost.measure_init_s("functions.leaky", tmp_path)


def test_the_asset_figures_are_printed_with_the_bill(tmp_path: Path) -> None:
    template = tmp_path / "Swarm-local.template.json"
    template.write_text(
        '{"Resources": {"Q": {"Type": "AWS::SQS::Queue", "Properties": {}}, "F": {"Type": '
        '"AWS::Lambda::Function", "Properties": {"Runtime": "python3.14", '
        '"Architectures": ["arm64"]}}}}'
    )
    assert cost._functions_runtime(template) == ("python3.14", "arm64")
    figures = {
        "runtime": "python3.14",
        "architecture": "arm64",
        "zipped_bytes": 15 * 1024 * 1024,
        "unzipped_bytes": 60 * 1024 * 1024,
        "source_files": 54,
        "source_bytes": 600 * 1024,
        "import_s": {"functions.worker": 0.61, "functions.api": 0.52},
    }
    result = cost.summarize(
        {
            "lines": [],
            "lambda": {},
            "time_scale": 10.0,
            "window_s": 60.0,
            "execution_types": {},
            "stepfunctions": {},
            "dynamodb": {},
        },
        10,
    )
    text = cost.render({**result, "asset": figures})
    assert "15.0 MB zipped, 60.0 MB unzipped (Lambda's limit: 250 MB)" in text
    assert "54 files, 600 KiB" in text
    assert "api 520 ms, worker 610 ms" in text
