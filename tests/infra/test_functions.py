"""The functions: runtime, logging, tracing, the env contract, triggers and least privilege."""

from __future__ import annotations

import json
from typing import Any

import pytest

from infra.functions import RUNTIME
from infra.nag import STAR_ONLY_ACTIONS
from swarm import contract as env
from swarm.contract import (
    API,
    DLQ,
    DRAIN,
    FANOUT,
    FINALIZER,
    FUNCTION_ENV,
    WORKER,
    FunctionName,
)
from swarm.core.records import LANES
from swarm.settings import GovernorSettings, Settings, SettingsError
from tests.infra.conftest import Synthesized
from tests.infra.helpers import (
    actions_on,
    all_actions,
    arn,
    as_list,
    ref,
    references,
    statements_of_role,
)


def _function(synth: Synthesized, name: FunctionName) -> dict[str, Any]:
    props: dict[str, Any] = synth.resources[synth.logical_id(synth.stack.functions[name].function)][
        "Properties"
    ]
    return props


def test_runtime_is_the_newest_python_the_pinned_cdk_offers() -> None:
    import aws_cdk.aws_lambda as lambda_

    newest = max(
        (name for name in dir(lambda_.Runtime) if name.startswith("PYTHON_3_")),
        key=lambda name: int(name.rsplit("_", 1)[1]),
    )
    assert RUNTIME.name == getattr(lambda_.Runtime, newest).name


@pytest.mark.parametrize("name", env.FUNCTIONS)
def test_each_function_has_own_role_logs_json_and_tracing(
    synth: Synthesized, name: FunctionName
) -> None:
    fn = synth.stack.functions[name]
    props = _function(synth, name)
    assert props["Runtime"] == RUNTIME.name
    assert props["Architectures"] == ["arm64"]  # Graviton: an Arm GB-second is 20% cheaper
    assert props["Handler"] == f"functions.{name}.handler"
    assert props["TracingConfig"] == {"Mode": "Active"}
    assert props["LoggingConfig"]["LogFormat"] == "JSON"
    assert props["LoggingConfig"]["LogGroup"] == ref(synth, fn.log_group)
    assert props["Role"] == arn(synth, fn.role)
    log_group = synth.resources[synth.logical_id(fn.log_group)]["Properties"]
    assert log_group["RetentionInDays"] == synth.config.observability.log_retention_days
    # No managed policies (AWSLambdaBasicExecutionRole = logs on every group)
    role = synth.resources[synth.logical_id(fn.role)]["Properties"]
    assert "ManagedPolicyArns" not in role
    # Logs only to its own group
    statements = statements_of_role(synth, fn.role)
    assert actions_on(statements, arn(synth, fn.log_group)) == {
        "logs:CreateLogStream",
        "logs:PutLogEvents",
    }


def test_roles_are_not_shared(synth: Synthesized) -> None:
    roles = {synth.logical_id(f.role) for f in synth.stack.functions.values()}
    assert len(roles) == len(env.FUNCTIONS)


@pytest.mark.parametrize("name", env.FUNCTIONS)
def test_environment_is_exactly_the_contract(synth: Synthesized, name: FunctionName) -> None:
    # Given the variables the stack sets on the function
    variables = _function(synth, name)["Environment"]["Variables"]
    # Then they are exactly the ones swarm/settings.py lists for it
    assert set(variables) == set(FUNCTION_ENV[name])
    assert variables[env.SWARM_FUNCTION] == name
    # And, with CloudFormation's tokens replaced by plausible values, they validate
    resolved = {
        key: (
            "arn:aws:states:us-east-1:123456789012:stateMachine:x"
            if key == env.STATE_MACHINE_ARN
            else f"value-of-{key.lower()}"
            if isinstance(value, dict)
            else value
        )
        for key, value in variables.items()
    }
    settings = Settings.from_env(resolved)
    assert settings.function == name
    if name in (API, WORKER, FANOUT):
        assert isinstance(settings, GovernorSettings)
        for model in synth.config.registry.catalog:  # each model's bucket, as synth sized it
            governor = settings.governor_config(model)
            expected = synth.config.governor_config(model)
            assert (governor.quota_tpm, governor.share, governor.output_burndown) == (
                expected.quota_tpm,
                expected.share,
                expected.output_burndown,
            )


def test_environment_points_at_the_right_resources(synth: Synthesized) -> None:
    stack = synth.stack
    worker = _function(synth, WORKER)["Environment"]["Variables"]
    for lane in LANES:
        assert worker[env.queue_url_var(lane)] == ref(synth, stack.lanes.queues[lane])
    assert worker[env.GOVERNOR_TABLE_NAME] == ref(synth, stack.tables.governor)
    assert worker[env.LEDGER_TABLE_NAME] == ref(synth, stack.tables.ledger)
    assert worker[env.DRAIN_PARAMETER_NAME] == ref(synth, stack.drain.parameter)
    drain = _function(synth, DRAIN)["Environment"]["Variables"]
    for lane in LANES:
        assert drain[env.worker_mapping_var(lane)] == ref(synth, stack.workers.mappings[lane])
    api = _function(synth, API)["Environment"]["Variables"]
    assert api[env.STATE_MACHINE_ARN] == ref(synth, stack.fanout.state_machine)
    for lane in LANES:
        assert api[env.shed_depth_var(lane)] == str(synth.config.lanes.of(lane).shed_depth)


def test_settings_name_the_missing_or_bad_variable() -> None:
    with pytest.raises(SettingsError, match="SWARM_FUNCTION"):
        Settings.from_env({})
    base = {name: "xyz" for name in FUNCTION_ENV[DRAIN]} | {
        env.SWARM_FUNCTION: DRAIN,
        env.STAGE: "dev",
        env.POWERTOOLS_LOG_LEVEL: "INFO",
    }
    assert Settings.from_env(base).function == DRAIN
    missing = dict(base)
    del missing[env.DRAIN_PARAMETER_NAME]
    with pytest.raises(SettingsError, match=env.DRAIN_PARAMETER_NAME):
        Settings.from_env(missing)
    with pytest.raises(SettingsError, match="STAGE"):
        Settings.from_env(base | {env.STAGE: "Not A Stage"})


def test_worker_mappings_one_per_lane_with_per_lane_concurrency(synth: Synthesized) -> None:
    worker = synth.stack.workers.worker
    for lane in LANES:
        mapping = synth.resources[synth.logical_id(synth.stack.workers.mappings[lane])]
        props = mapping["Properties"]
        assert props["EventSourceArn"] == arn(synth, synth.stack.lanes.queues[lane])
        assert props["FunctionName"] == ref(synth, worker.function)
        assert props["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
        assert props["ScalingConfig"] == {
            "MaximumConcurrency": synth.config.lanes.of(lane).max_concurrency
        }
        assert props["BatchSize"] == synth.config.worker.batch_size
    concurrency = [synth.config.lanes.of(lane).max_concurrency for lane in LANES]
    assert concurrency == sorted(concurrency, reverse=True)  # higher lanes get more
    props = _function(synth, WORKER)
    # unreserved by default (cdk.json): a reservation needs an account quota above 100
    assert synth.config.worker.reserved_concurrency is None
    assert "ReservedConcurrentExecutions" not in props
    assert props["Timeout"] == synth.config.worker.timeout_seconds


def test_dead_letter_handler_reads_the_lanes_dlq(synth: Synthesized) -> None:
    dlq_fn = synth.logical_id(synth.stack.workers.dead_letters.function)
    sources = [
        m["Properties"]
        for m in synth.of_type("AWS::Lambda::EventSourceMapping").values()
        if m["Properties"]["FunctionName"] == {"Ref": dlq_fn}
    ]
    assert [s["EventSourceArn"] for s in sources] == [arn(synth, synth.stack.lanes.dead_letters)]
    assert all(s["FunctionResponseTypes"] == ["ReportBatchItemFailures"] for s in sources)


def test_star_resources_only_for_actions_without_resource_level_permissions(
    synth: Synthesized,
) -> None:
    for policy in synth.of_type("AWS::IAM::Policy").values():
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            if "*" in as_list(statement["Resource"]):
                assert set(as_list(statement["Action"])) <= STAR_ONLY_ACTIONS, statement
            assert not any(a.endswith(":*") for a in as_list(statement["Action"])), statement


def test_worker_permissions_are_scoped(synth: Synthesized) -> None:
    stack = synth.stack
    statements = statements_of_role(synth, stack.workers.worker.role)
    # the governor: Query the shards, create them and draw (conditional updates, no PutItem);
    # the ledger: reads are BatchGetItem
    assert actions_on(statements, arn(synth, stack.tables.governor)) == {
        "dynamodb:Query",
        "dynamodb:UpdateItem",
    }
    # (a settlement keeps its attempt in the unit's item: no PutItem; an agent unit's log is
    # read with a Query of its partition and appended with conditional updates)
    assert actions_on(statements, arn(synth, stack.tables.ledger)) == {
        "dynamodb:BatchGetItem",
        "dynamodb:UpdateItem",
        "dynamodb:Query",
    }
    assert "ssm:GetParameter" in actions_on(
        statements,
        {
            "Fn::Join": [
                "",
                [
                    "arn:",
                    {"Ref": "AWS::Partition"},
                    ":ssm:",
                    {"Ref": "AWS::Region"},
                    ":",
                    {"Ref": "AWS::AccountId"},
                    ":parameter",
                    {"Ref": synth.logical_id(stack.drain.parameter)},
                ],
            ]
        },
    )
    for lane in LANES:
        assert {"sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:ChangeMessageVisibility"} <= (
            actions_on(statements, arn(synth, stack.lanes.queues[lane]))
        )
    # The simulated model plane needs no Bedrock access
    assert not any(a.startswith("bedrock:") for a in all_actions(statements))
    # Every Requeue (draining, governor wait bound, model throttle, busy) sends a fresh copy of
    # the unit to its lane (functions/worker.py -> SqsLanes.send_many, SendMessageBatch, which
    # IAM authorizes as sqs:SendMessage): on exactly the three lanes, never on a dead-letter queue
    send = [s for s in statements if "sqs:SendMessage" in as_list(s["Action"])]
    assert sorted(str(r) for s in send for r in as_list(s["Resource"])) == sorted(
        str(arn(synth, stack.lanes.queues[lane])) for lane in LANES
    )
    # The lanes are SSE-SQS (no customer managed key), so sending needs no KMS grant
    for lane in LANES:
        queue = synth.resources[synth.logical_id(stack.lanes.queues[lane])]["Properties"]
        assert queue["SqsManagedSseEnabled"] is True
        assert "KmsMasterKeyId" not in queue
    assert not any(a.startswith("kms:") for a in all_actions(statements))
    # It starts no executions: it only wakes the finalize loop of a run its settlement closed
    assert {a for a in all_actions(statements) if a.startswith("states:")} == {
        "states:SendTaskSuccess"
    }


def test_bedrock_grant_is_scoped_to_the_registered_models(prod_synth: Synthesized) -> None:
    statements = statements_of_role(prod_synth, prod_synth.stack.workers.worker.role)
    bedrock = [s for s in statements if "bedrock:InvokeModel" in as_list(s["Action"])]
    assert len(bedrock) == 1
    resources = [json.dumps(r) for r in as_list(bedrock[0]["Resource"])]
    # the inference profile and the foundation model it routes to (any region of its
    # geography); the on-demand model: its foundation model in this region; nothing else
    assert len(resources) == 3
    assert (
        sum("inference-profile/us.anthropic.claude-3-5-haiku-20241022-v1:0" in r for r in resources)
        == 1
    )
    haiku = [r for r in resources if "foundation-model/anthropic.claude-3-5-haiku" in r]
    assert len(haiku) == 1 and ":bedrock:*::" in haiku[0]
    sonnet = [r for r in resources if "foundation-model/anthropic.claude-sonnet-4-20250514" in r]
    assert len(sonnet) == 1 and ":bedrock:*::" not in sonnet[0]


def test_fanout_sends_to_the_lanes_only(synth: Synthesized) -> None:
    stack = synth.stack
    statements = statements_of_role(synth, stack.fanout.admit.role)
    send = [s for s in statements if "sqs:SendMessage" in as_list(s["Action"])]
    assert sorted(str(r) for s in send for r in as_list(s["Resource"])) == sorted(
        str(arn(synth, stack.lanes.queues[lane])) for lane in LANES
    )
    assert "sqs:ReceiveMessage" not in all_actions(statements)
    # the governor: the units' places (book_places), nothing else
    assert set(actions_on(statements, arn(synth, stack.tables.governor))) == {
        "dynamodb:Query",
        "dynamodb:UpdateItem",
    }


def test_drain_controller_updates_only_the_worker_mappings(synth: Synthesized) -> None:
    stack = synth.stack
    statements = statements_of_role(synth, stack.drain_controller.role)
    update = [s for s in statements if "lambda:UpdateEventSourceMapping" in as_list(s["Action"])]
    assert len(update) == 1
    resources = as_list(update[0]["Resource"])
    assert len(resources) == len(LANES)
    for lane in LANES:
        mapping_id = synth.logical_id(stack.workers.mappings[lane])
        assert sum(references(r, mapping_id) for r in resources) == 1
    # of DynamoDB, it only reads the register of running work (the ledger's shard items)
    assert {a for a in all_actions(statements) if a.startswith("dynamodb:")} == {
        "dynamodb:BatchGetItem"
    }


def test_api_can_only_start_executions_of_its_state_machine(synth: Synthesized) -> None:
    stack = synth.stack
    statements = statements_of_role(synth, stack.front_door.handler.role)
    assert actions_on(statements, ref(synth, stack.fanout.state_machine)) == {
        "states:StartExecution"
    }
    # Nothing in the API describes, redrives or stops an execution (resume starts a new one)
    assert {a for a in all_actions(statements) if a.startswith("states:")} == {
        "states:StartExecution"
    }
    # Reads lane depth and sends a unit back to its lane once a gated tool call is decided
    # (human gates), on the three lanes only; never consumes
    assert "sqs:GetQueueAttributes" in all_actions(statements)
    assert "sqs:ReceiveMessage" not in all_actions(statements)
    for queue in stack.lanes.queues.values():
        assert "sqs:SendMessage" in actions_on(statements, arn(synth, queue))
    sends = [s for s in statements if "sqs:SendMessage" in s["Action"]]
    assert all(s["Resource"] != "*" for s in sends)


@pytest.mark.parametrize("name", [FINALIZER, DLQ])
def test_no_function_but_worker_api_and_fanout_touches_the_governor(
    synth: Synthesized, name: FunctionName
) -> None:
    statements = statements_of_role(synth, synth.stack.functions[name].role)
    assert not actions_on(statements, arn(synth, synth.stack.tables.governor))
