"""The fan-out state machine: Distributed Map over the S3 manifest, loaded from the ASL file."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from infra.config import (
    ConfigError,
    express_child_problem,
    fanout_definition_numbers,
    load_config,
)
from infra.constants import FANOUT_ASL, ROOT
from infra.context import cdk_json_context
from infra.fanout import definition_substitutions
from infra.local_definition import local_definitions
from infra.timing import parse_definition
from tests.infra.conftest import Synthesized
from tests.infra.helpers import arn, as_list, statements_of_role

ASL_VALIDATOR = ROOT / "node_modules" / ".bin" / "asl-validator"
PLACEHOLDER = re.compile(r"\$\{([A-Za-z0-9]+)\}")


def _substituted(synth: Synthesized) -> dict[str, Any]:
    """The ASL as Step Functions will see it, with plain strings for the tokens."""
    substitutions = definition_substitutions(
        config=synth.config,
        bucket_name="swarm-batches-bucket",
        fanout_arn="arn:aws:lambda:us-east-1:123456789012:function:swarm-fanout",
        finalizer_arn="arn:aws:lambda:us-east-1:123456789012:function:swarm-finalizer",
    )
    text = PLACEHOLDER.sub(lambda m: substitutions[m.group(1)], FANOUT_ASL.read_text())
    definition: dict[str, Any] = json.loads(text)
    return definition


def _state_machine(synth: Synthesized) -> dict[str, Any]:
    props: dict[str, Any] = synth.resources[synth.logical_id(synth.stack.fanout.state_machine)][
        "Properties"
    ]
    return props


def test_definition_comes_from_the_asl_file_with_every_placeholder_substituted(
    synth: Synthesized,
) -> None:
    props = _state_machine(synth)
    placeholders = set(PLACEHOLDER.findall(FANOUT_ASL.read_text()))
    assert set(props["DefinitionSubstitutions"]) == placeholders
    subs = props["DefinitionSubstitutions"]
    assert subs["FanoutFunctionArn"] == arn(synth, synth.stack.fanout.admit.function)
    assert subs["FinalizerFunctionArn"] == arn(synth, synth.stack.fanout.finalizer.function)
    assert subs["BucketName"] == {"Ref": synth.logical_id(synth.stack.storage.bucket)}
    assert subs["MaxConcurrency"] == str(synth.config.fanout.max_concurrency)
    # The definition itself is the file, shipped as an asset
    assert "DefinitionS3Location" in props or "DefinitionString" in props


def test_distributed_map_reads_the_manifest_and_writes_results(synth: Synthesized) -> None:
    fan_out = _substituted(synth)["States"]["FanOut"]
    assert fan_out["Type"] == "Map"
    assert fan_out["ItemProcessor"]["ProcessorConfig"]["Mode"] == "DISTRIBUTED"
    assert fan_out["ItemProcessor"]["ProcessorConfig"]["ExecutionType"] == "EXPRESS"
    assert fan_out["ItemReader"]["Resource"] == "arn:aws:states:::s3:getObject"
    assert fan_out["ItemReader"]["ReaderConfig"] == {"InputType": "JSON"}
    assert fan_out["ItemReader"]["Parameters"]["Key.$"] == "$.manifest_key"
    assert fan_out["MaxConcurrency"] == synth.config.fanout.max_concurrency
    assert fan_out["ToleratedFailurePercentage"] == synth.config.fanout.tolerated_failure_percentage
    assert fan_out["ResultWriter"]["Resource"] == "arn:aws:states:::s3:putObject"
    assert fan_out["ResultWriter"]["Parameters"]["Prefix"] == "results/"
    # No ItemBatcher: moto rejects it, and one definition must run locally and on AWS alike.
    # The manifest is written pre-chunked instead (swarm.service.batches.chunk_units): each
    # item is a chunk of units, which gives ItemBatcher's billing (one child per chunk).
    assert "ItemBatcher" not in fan_out
    assert fan_out["ItemSelector"] == {
        "batch_id.$": "$.batch_id",
        "index.$": "$$.Map.Item.Index",
        "chunk.$": "$$.Map.Item.Value",
    }
    item = fan_out["ItemProcessor"]["States"]["AdmitAndEnqueue"]
    assert item["Parameters"]["Payload.$"] == "$"  # the child's input: the chunk, wrapped
    assert item["Resource"] == "arn:aws:states:::lambda:invoke"
    assert fan_out["Next"] == "Poll"


def test_state_machine_logs_all_and_traces(synth: Synthesized) -> None:
    props = _state_machine(synth)
    assert props["StateMachineType"] == "STANDARD"
    assert props["TracingConfiguration"] == {"Enabled": True}
    assert props["LoggingConfiguration"]["Level"] == "ALL"
    assert props["LoggingConfiguration"]["IncludeExecutionData"] is False


def test_asl_passes_asl_validator(synth: Synthesized, tmp_path: Path) -> None:
    if not ASL_VALIDATOR.exists():
        pytest.skip("node_modules not installed (npm ci)")
    path = tmp_path / "fanout.asl.json"
    path.write_text(json.dumps(_substituted(synth)))
    result = subprocess.run(
        [str(ASL_VALIDATOR), "--json-path", str(path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_asl_validator_catches_a_broken_map(synth: Synthesized, tmp_path: Path) -> None:
    """The validator is not a rubber stamp: an out-of-range percentage fails."""
    if not ASL_VALIDATOR.exists():
        pytest.skip("node_modules not installed (npm ci)")
    definition = _substituted(synth)
    definition["States"]["FanOut"]["ToleratedFailurePercentage"] = 101
    path = tmp_path / "broken.asl.json"
    path.write_text(json.dumps(definition))
    result = subprocess.run(
        [str(ASL_VALIDATOR), "--json-path", str(path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode != 0


def test_local_definition_for_moto(synth: Synthesized) -> None:
    # Given a resolver standing in for the deployed stack's physical values
    def resolve(value: Any) -> str:
        text = json.dumps(value)
        if "Storage" in text:
            return "local-bucket"
        return f"arn:aws:lambda:us-east-1:123456789012:function:{abs(hash(text))}"

    # When the local runtime builds the definition moto can run
    (definition,) = local_definitions(synth.template, synth.outdir, resolve).values()
    fan_out = json.loads(definition)["States"]["FanOut"]
    # Then only the settings moto cannot run differ from the deployed ones
    assert fan_out["ItemProcessor"]["ProcessorConfig"]["ExecutionType"] == "STANDARD"
    assert fan_out["ToleratedFailurePercentage"] == float(
        synth.config.fanout.tolerated_failure_percentage
    )
    assert isinstance(fan_out["ToleratedFailurePercentage"], float)
    assert fan_out["MaxConcurrency"] == synth.config.fanout.max_concurrency
    assert fan_out["ItemReader"]["Parameters"]["Bucket"] == "local-bucket"
    assert fan_out["ItemSelector"]["chunk.$"] == "$$.Map.Item.Value"  # context paths survive


# ---------------------------------------------------------------------- error handling, repair


LAMBDA_SERVICE_ERRORS = {
    "Lambda.ServiceException",
    "Lambda.AWSLambdaException",
    "Lambda.SdkClientException",
    "Lambda.TooManyRequestsException",
}


def _retriers(state: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {",".join(r["ErrorEquals"]): r for r in state.get("Retry", [])}


@pytest.mark.parametrize("path", [("FanOut", "AdmitAndEnqueue"), ("Poll",), ("Close",)])
def test_lambda_tasks_retry_service_errors_then_function_errors_with_backoff_and_jitter(
    synth: Synthesized, path: tuple[str, ...]
) -> None:
    states = _substituted(synth)["States"]
    state = states[path[0]]
    if len(path) > 1:
        state = state["ItemProcessor"]["States"][path[1]]
    retry = state["Retry"]
    if path == ("Poll",):  # its answers by name are never retried: the loop goes on with them
        assert retry[0] == {"ErrorEquals": ["RunClosed", "PollLimit"], "MaxAttempts": 0}
        retry = retry[1:]
    if path == ("FanOut", "AdmitAndEnqueue"):
        # the Express child's throttles apart (refused before the function runs, they cost only
        # their pause) and retried as long as before; the errors that may follow a whole run
        # fewer times, so every attempt fits the child's 5 minutes
        throttles, retry = retry[0], retry[1:]
        assert throttles["ErrorEquals"] == ["Lambda.TooManyRequestsException"]
        assert throttles["MaxAttempts"] >= 6
        assert throttles["JitterStrategy"] == "FULL"
        assert set(retry[0]["ErrorEquals"]) | set(throttles["ErrorEquals"]) == LAMBDA_SERVICE_ERRORS
        least = 2
    else:
        assert set(retry[0]["ErrorEquals"]) == LAMBDA_SERVICE_ERRORS
        least = 3
    # the service errors first (the first matching retrier wins), then any function error
    assert retry[1]["ErrorEquals"] == ["States.TaskFailed"]
    for retrier in retry:
        assert retrier["MaxAttempts"] >= least
        assert retrier["BackoffRate"] >= 2
        assert retrier["JitterStrategy"] == "FULL"


def test_a_chunks_every_attempt_fits_its_express_child(synth: Synthesized) -> None:
    # Given the fan-out function's timeout and the child task's retriers as deployed
    fanout = synth.resources[synth.logical_id(synth.stack.fanout.admit.function)]["Properties"]
    assert fanout["Timeout"] == synth.config.fanout.timeout_seconds == 30
    item = _substituted(synth)["States"]["FanOut"]["ItemProcessor"]["States"]["AdmitAndEnqueue"]
    throttles, service, task_failed = item["Retry"]

    # When every retrier is spent (errors alternating between them), each run timing out after
    # a cold start's INIT (10 s) and every pause at its longest (FULL jitter only shortens it)
    def pauses(retrier: dict[str, Any]) -> float:
        return sum(
            min(
                retrier["IntervalSeconds"] * retrier["BackoffRate"] ** n,
                retrier.get("MaxDelaySeconds", float("inf")),
            )
            for n in range(retrier["MaxAttempts"])
        )

    runs = 1 + service["MaxAttempts"] + task_failed["MaxAttempts"]
    worst = (
        runs * (30 + 10)
        + throttles["MaxAttempts"] * 1  # a throttled invoke's round trip
        + pauses(throttles)
        + pauses(service)
        + pauses(task_failed)
    )
    # Then the child ends within Express's 5 minutes, and synth derived the same arithmetic
    assert (runs, worst) == (5, 278)
    assert worst <= 300
    assert express_child_problem(synth.config) is None


def test_an_express_child_that_can_outlast_five_minutes_fails_synth_naming_the_keys(
    tmp_path: Path,
) -> None:
    # Given the child's retriers before the fix (one retrier for every Lambda service error,
    # throttles included: 6 more full runs, and 3 retries of a function error)
    config = load_config(cdk_json_context())
    machine = parse_definition(FANOUT_ASL.read_text(), fanout_definition_numbers(config))
    child = machine["States"]["FanOut"]["ItemProcessor"]["States"]["AdmitAndEnqueue"]
    child["Retry"] = [
        {"ErrorEquals": sorted(LAMBDA_SERVICE_ERRORS), "IntervalSeconds": 1, "MaxAttempts": 6,
         "BackoffRate": 2, "JitterStrategy": "FULL"},
        {"ErrorEquals": ["States.TaskFailed"], "IntervalSeconds": 2, "MaxAttempts": 3,
         "BackoffRate": 2, "MaxDelaySeconds": 30, "JitterStrategy": "FULL"},
    ]  # fmt: skip
    path = tmp_path / "fanout.asl.json"
    path.write_text(json.dumps(machine))
    # When synth derives the child's worst case
    problem = express_child_problem(config, path)
    # Then it refuses, with the arithmetic and the keys to change
    assert problem is not None
    assert "more than Express's 300 s" in problem
    assert "10 attempts x 40 s" in problem  # 1 + 6 + 3 runs, 30 s + 10 s of INIT each
    for key in ("fanout.timeout_seconds", "MaxAttempts", "FanOut.ItemProcessor"):
        assert key in problem
    # and so does load_config for a timeout the shipped retriers cannot hold
    with pytest.raises(ConfigError) as error:
        load_config(
            {
                **cdk_json_context(),
                "fanout": {**cdk_json_context()["fanout"], "timeout_seconds": 60},
            }
        )
    assert "fanout.timeout_seconds=60" in str(error.value)
    assert "428 s" in str(error.value)  # 5 runs x 70 s + 6 throttles x 1 s + 72 s of pauses


def test_a_failed_map_or_finalizer_ends_the_execution_for_the_sweeper(synth: Synthesized) -> None:
    states = _substituted(synth)["States"]
    # Given every way the map and the finalize steps can fail once their retries are spent
    for name, fail in (
        ("FanOut", "FanOutFailed"),
        ("Poll", "FinalizeFailed"),
        ("Close", "FinalizeFailed"),
    ):
        catch = states[name]["Catch"][-1]  # the last: what no earlier catcher names
        # Then the failure is caught (with its error kept) and ends the execution failed...
        assert catch["ErrorEquals"] == ["States.ALL"]
        assert catch["ResultPath"] == "$.error"
        assert catch["Next"] == fail
        assert states[fail]["Type"] == "Fail"
        assert states[fail]["Error"] == fail
        assert states[fail]["CausePath"] == "States.JsonToString($.error)"
    # ... rather than entering a finalize loop that could never close a half-admitted run
    assert states["FanOut"]["Next"] == "Poll"


def test_the_finalize_loop_continues_as_a_new_execution_before_the_history_limit(
    synth: Synthesized,
) -> None:
    states = _substituted(synth)["States"]
    limit = synth.config.fanout.finalizer_polls_per_execution
    # Given the loop's poll count
    assert states["StartLoop"]["Parameters"] == {
        "root.$": "$$.Execution.Name",
        "generation": 0,
        "polls": 0,
    }
    assert states["CountPoll"]["Parameters"]["polls.$"] == "States.MathAdd($.loop.polls, 1)"
    assert states["CountPoll"]["Next"] == "Poll"
    # When it reaches the configured limit, the run not closed yet: the poll answers PollLimit
    # (functions/finalizer.py) before it waits
    payload = states["Poll"]["Parameters"]["Payload"]
    assert payload["max_polls"] == limit
    catches = {",".join(c["ErrorEquals"]): c["Next"] for c in states["Poll"]["Catch"]}
    assert catches["PollLimit"] == "ContinueAsNew"
    # Then a new execution of this very state machine starts for the same batch, named
    # <root>-c<generation> (deterministic), with the loop's state: it skips the map
    task = states["ContinueAsNew"]
    assert task["Resource"] == "arn:aws:states:::states:startExecution"  # request-response
    params = task["Parameters"]
    assert params["StateMachineArn.$"] == "$$.StateMachine.Id"
    assert params["Name.$"] == (
        "States.Format('{}-c{}', $.loop.root, States.MathAdd($.loop.generation, 1))"
    )
    assert params["Input"]["batch_id.$"] == "$.batch_id"
    assert params["Input"]["manifest_key.$"] == "$.manifest_key"
    assert params["Input"]["loop"] == {
        "root.$": "$.loop.root",
        "generation.$": "States.MathAdd($.loop.generation, 1)",
        "polls": 0,
    }
    route = states["Continuation?"]
    assert _substituted(synth)["StartAt"] == "Continuation?"
    assert route["Choices"] == [
        {"Variable": "$.loop", "IsPresent": True, "Next": "Poll"},
        {"Variable": "$.open", "IsPresent": True, "Next": "OpenUnits"},
    ]
    assert route["Default"] == "StartLoop"
    assert states["StartLoop"]["Next"] == "FanOut"
    # and a start that an earlier attempt made already is not an error; anything else is
    # retried, then ends the execution for the sweeper
    assert _retriers(task)["StepFunctions.ExecutionAlreadyExistsException"]["MaxAttempts"] == 0
    assert _retriers(task)["States.TaskFailed"]["JitterStrategy"] == "FULL"
    already, other = task["Catch"]
    assert already["ErrorEquals"] == ["StepFunctions.ExecutionAlreadyExistsException"]
    assert already["Next"] == task["Next"] == "Continued"
    assert states["Continued"]["Type"] == "Succeed"
    assert other == {
        "ErrorEquals": ["States.ALL"],
        "ResultPath": "$.error",
        "Next": "ContinueAsNewFailed",
    }
    # and the finalizer's first poll tells it which execution it is
    assert payload["polls.$"] == "$.loop.polls"
    assert payload["execution_arn.$"] == "$$.Execution.Id"


def test_the_finalize_loop_waits_for_the_closure_and_sweeps_when_nobody_ends_the_wait(
    synth: Synthesized,
) -> None:
    states = _substituted(synth)["States"]
    fanout = synth.config.fanout
    poll = states["Poll"]
    # Given a poll that waits for its task token (the finalizer keeps it for the run's closer)
    assert poll["Resource"] == "arn:aws:states:::lambda:invoke.waitForTaskToken"
    assert poll["Parameters"]["Payload"]["task_token.$"] == "$$.Task.Token"
    assert poll["Parameters"]["Payload"]["action"] == "poll"
    assert poll["ResultPath"] is None
    # When nobody hands it back within finalizer_max_poll_seconds, the loop sweeps again; the
    # poll knows that timeout, which counts its invocation too, and sweeps within it
    assert poll["TimeoutSeconds"] == fanout.finalizer_max_poll_seconds
    assert poll["Parameters"]["Payload"]["wait_seconds"] == fanout.finalizer_max_poll_seconds
    catches = {",".join(c["ErrorEquals"]): c["Next"] for c in poll["Catch"]}
    assert catches["States.Timeout"] == "CountPoll"
    # When the run's closer hands it back, or the run is closed already, the closure is written
    assert poll["Next"] == "Close" and catches["RunClosed"] == "Close"
    close = states["Close"]
    assert close["Resource"] == "arn:aws:states:::lambda:invoke"
    assert close["ResultSelector"] == {
        "closed.$": "$.Payload.closed",
        "writing.$": "$.Payload.writing",
    }
    closed, writing = states["Closed?"]["Choices"]
    assert closed == {"Variable": "$.finalize.closed", "BooleanEquals": True, "Next": "Done"}
    # a results file too long for one invocation goes on after finalizer_poll_seconds
    assert writing == {
        "Variable": "$.finalize.writing",
        "BooleanEquals": True,
        "Next": "WaitToWrite",
    }
    assert states["WaitToWrite"] == {
        "Type": "Wait",
        "Comment": states["WaitToWrite"]["Comment"],
        "Seconds": fanout.finalizer_poll_seconds,
        "Next": "Close",
    }
    # and a run that is not closed after all (a top-up reopened it) goes back to polling
    assert states["Closed?"]["Default"] == "CountPoll"


#: history events per state an execution enters (a Task: entered, scheduled, started,
#: succeeded, exited; one that waits for its token adds submitted; the others: entered, exited);
#: a retried task adds scheduled, started, failed
_EVENTS = {"Task": 5}
HISTORY_LIMIT = 25_000


def test_the_poll_limit_keeps_an_execution_under_the_history_limit(synth: Synthesized) -> None:
    from infra.config import MAX_POLLS_PER_EXECUTION

    states = _substituted(synth)["States"]
    # Given one turn of the loop that nobody ends: Poll -> (timed out) CountPoll -> Poll
    catches = {",".join(c["ErrorEquals"]): c["Next"] for c in states["Poll"]["Catch"]}
    cycle = ["Poll", catches["States.Timeout"]]
    assert states[cycle[-1]]["Next"] == "Poll"
    per_poll = 1 + sum(_EVENTS.get(states[n]["Type"], 2) for n in cycle)  # + submitted
    assert per_poll <= 11  # what infra/config.py's bound assumes
    # Then even the highest allowed limit, with every poll retried once (3 events: scheduled,
    # started, failed) and the map's own events, stays under 25,000 events
    assert (MAX_POLLS_PER_EXECUTION + 1) * (per_poll + 3) + 100 < HISTORY_LIMIT
    assert synth.config.fanout.finalizer_polls_per_execution <= MAX_POLLS_PER_EXECUTION


def test_the_state_machine_may_start_only_itself(synth: Synthesized) -> None:
    # The role names its own ARN, built from the fixed state machine name (a Ref of the state
    # machine would make the role's policy depend on the state machine that depends on it)
    statements = statements_of_role(synth, synth.stack.fanout.role)
    starts = [s for s in statements if "states:StartExecution" in as_list(s["Action"])]
    (statement,) = starts
    (resource,) = as_list(statement["Resource"])
    text = json.dumps(resource)
    assert f":stateMachine:{synth.stack.fanout.state_machine_name}" in text
    assert synth.logical_id(synth.stack.fanout.state_machine) not in text


def test_the_sweeper_runs_on_a_schedule_at_the_configured_rate(synth: Synthesized) -> None:
    rate = synth.config.fanout.sweeper_rate_minutes
    sweeper = synth.stack.sweeper
    rules = [
        r["Properties"]
        for r in synth.of_type("AWS::Events::Rule").values()
        if "ScheduleExpression" in r["Properties"]
    ]
    (rule,) = rules
    assert rule["ScheduleExpression"] == f"rate({rate} minutes)"
    assert rule["State"] == "ENABLED"
    (target,) = rule["Targets"]
    assert target["Arn"] == arn(synth, sweeper.function)
    assert target["RetryPolicy"]["MaximumEventAgeInSeconds"] == rate * 60
    # EventBridge may invoke it
    permissions = [
        p["Properties"]
        for p in synth.of_type("AWS::Lambda::Permission").values()
        if p["Properties"]["Principal"] == "events.amazonaws.com"
        and p["Properties"]["FunctionName"] == arn(synth, sweeper.function)
    ]
    assert len(permissions) == 1
    # its snooze is the rate, and a sweep ends before the next one starts
    props = synth.resources[synth.logical_id(sweeper.function)]["Properties"]
    assert props["Environment"]["Variables"]["SWEEP_INTERVAL_SECONDS"] == str(rate * 60)
    assert props["Timeout"] <= rate * 60


def test_the_ledger_has_a_sparse_index_of_watched_runs_only_the_sweeper_queries(
    synth: Synthesized,
) -> None:
    from infra.constants import (
        OPEN_RUNS_INDEX,
        TENANT_RUNS_INDEX,
        TENANT_RUNS_PARTITION_KEY,
        WATCH_PARTITION_KEY,
        WATCH_SORT_KEY,
    )

    ledger = synth.resources[synth.logical_id(synth.stack.tables.ledger)]["Properties"]
    index, tenants, _leases = ledger["GlobalSecondaryIndexes"]
    assert index["IndexName"] == OPEN_RUNS_INDEX
    assert index["KeySchema"] == [
        {"AttributeName": WATCH_PARTITION_KEY, "KeyType": "HASH"},
        {"AttributeName": WATCH_SORT_KEY, "KeyType": "RANGE"},
    ]
    assert index["Projection"] == {
        "ProjectionType": "INCLUDE",
        "NonKeyAttributes": ["execution", "repairs"],
    }
    assert {"AttributeName": WATCH_SORT_KEY, "AttributeType": "N"} in ledger["AttributeDefinitions"]
    # beside it, the same watched runs by tenant, keys only (the API's queue cap reads the books)
    assert tenants == {
        "IndexName": TENANT_RUNS_INDEX,
        "KeySchema": [{"AttributeName": TENANT_RUNS_PARTITION_KEY, "KeyType": "HASH"}],
        "Projection": {"ProjectionType": "KEYS_ONLY"},
    }
    # the same index as the adapters create for tests and the local runtime
    governor = synth.resources[synth.logical_id(synth.stack.tables.governor)]["Properties"]
    assert "GlobalSecondaryIndexes" not in governor
    # no role is granted every index of the ledger (Table.grant's "<table>/index/*")
    policies = json.dumps(synth.of_type("AWS::IAM::Policy"))
    assert "/index/*" not in policies


def test_the_ledger_has_a_sparse_index_of_leases_by_run_and_expiry(synth: Synthesized) -> None:
    """Units holding a lease, by run (the table's pk) and expiry (res_lease, present only while
    a unit holds a reservation), keys only: the finalizer's lease sweep reads the expired ones
    (which roles may Query it: tests/infra/test_permissions.py, the finalizer and the sweeper)."""
    from infra.constants import LEASE_EXPIRY, LEASES_INDEX, PARTITION_KEY

    ledger = synth.resources[synth.logical_id(synth.stack.tables.ledger)]["Properties"]
    (leases,) = [i for i in ledger["GlobalSecondaryIndexes"] if i["IndexName"] == LEASES_INDEX]
    assert leases == {
        "IndexName": LEASES_INDEX,
        "KeySchema": [
            {"AttributeName": PARTITION_KEY, "KeyType": "HASH"},
            {"AttributeName": LEASE_EXPIRY, "KeyType": "RANGE"},
        ],
        "Projection": {"ProjectionType": "KEYS_ONLY"},
    }
    assert {"AttributeName": LEASE_EXPIRY, "AttributeType": "N"} in ledger["AttributeDefinitions"]
    # the attribute the ledger's items write and remove with every reservation
    from swarm.adapters import dynamodb_items

    assert LEASE_EXPIRY in dynamodb_items.RESERVATION_ATTRIBUTES
    # the same index as the adapters create for tests and the local runtime
    from unittest import mock

    from swarm.adapters.dynamodb import create_table

    client = mock.Mock()
    create_table(client, "t")
    (created,) = [
        i
        for i in client.create_table.call_args.kwargs["GlobalSecondaryIndexes"]
        if i["IndexName"] == LEASES_INDEX
    ]
    assert created == leases


def test_a_run_being_opened_writes_its_units_in_a_loop_before_the_map(synth: Synthesized) -> None:
    states = _substituted(synth)["States"]
    # Given an input with "open" (the submit's: the run is opening), and none (a restart or a
    # resume of an open run, a continuation): only the former goes through the open step
    route = states["Continuation?"]["Choices"]
    assert route[0]["Variable"] == "$.loop"  # a continuation skips the open step and the map
    assert route[1] == {"Variable": "$.open", "IsPresent": True, "Next": "OpenUnits"}
    # When the open step runs: the finalizer function's open action, with the cursor
    task = states["OpenUnits"]
    assert task["Resource"] == "arn:aws:states:::lambda:invoke"
    assert task["Parameters"]["FunctionName"].endswith(":function:swarm-finalizer")
    assert task["Parameters"]["Payload"] == {
        "action": "open",
        "batch_id.$": "$.batch_id",
        "spec_key.$": "$.open.spec_key",
        "cursor.$": "$.open.cursor",
    }
    assert task["ResultPath"] == "$.open"  # the next cursor replaces the last
    assert set(task["ResultSelector"]) == {"spec_key.$", "cursor.$", "done.$"}
    # Then a Choice loops on it until done, then the map; a failure ends the execution for the
    # sweeper (which restarts it from the open step)
    assert task["Next"] == "Opened?"
    loop = states["Opened?"]
    assert loop["Choices"] == [
        {"Variable": "$.open.done", "BooleanEquals": True, "Next": "StartLoop"}
    ]
    assert loop["Default"] == "OpenUnits"
    assert task["Catch"] == [
        {"ErrorEquals": ["States.ALL"], "ResultPath": "$.error", "Next": "OpenFailed"}
    ]
    assert states["OpenFailed"]["Type"] == "Fail"
    assert _retriers(task)["States.TaskFailed"]["JitterStrategy"] == "FULL"
