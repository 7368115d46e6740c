"""The worker fleet (one event source mapping per lane) and the dead-letter handler."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_ssm as ssm
from constructs import Construct

from infra.config import DLQ_MAPPING_CONCURRENCY, SwarmConfig
from infra.drain import grant_get_parameter
from infra.functions import FunctionFactory, FunctionSpec, SwarmFunction, grant_task_response
from infra.queues import LaneQueues
from infra.storage import ATTEMPT_RECORDS, BatchStorage
from swarm.contract import DLQ, WORKER, worker_mapping_var
from swarm.core.records import LANES, Lane

DLQ_TIMEOUT = cdk.Duration.seconds(60)
#: Bedrock model ids with one of these prefixes are cross-region inference profiles.
CROSS_REGION_PREFIXES = ("us", "eu", "apac", "global", "us-gov", "jp", "au", "ca")


class Workers(Construct):
    """Workers are slots, not identities: everything a worker knows is in the unit's record."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: SwarmConfig,
        factory: FunctionFactory,
        lanes: LaneQueues,
        governor: dynamodb.ITable,
        ledger: dynamodb.ITable,
        drain_parameter: ssm.IStringParameter,
        storage: BatchStorage,
    ) -> None:
        super().__init__(scope, construct_id)
        worker_config = config.worker
        self.worker: SwarmFunction = factory.build(
            "Worker",
            FunctionSpec(
                name=WORKER,
                description="Runs units from the lanes under the governor and the ledger",
                timeout=cdk.Duration.seconds(worker_config.timeout_seconds),
                memory_mb=worker_config.memory_mb,
                reserved_concurrency=config.reserved_concurrency,  # given or derived
            ),
        )
        # Exactly the calls its code makes (tests/infra/test_permissions.py lists who calls what).
        role = self.worker.role
        governor.grant(
            role,
            "dynamodb:Query",  # the shards (one Query per read)
            # draw (one conditional update per grant), throttle cuts, and the shards' creation
            # on first use (a conditional update too: no PutItem)
            "dynamodb:UpdateItem",
        )
        ledger.grant(
            role,
            "dynamodb:BatchGetItem",  # every read (run, spec, unit, attempt, closure token)
            # admit, claim, unclaim, reclaim, settlement updates (the settled attempt is kept in
            # its unit's item: no PutItem); an agent unit's turns and log events
            "dynamodb:UpdateItem",
            # an agent unit's log, read once per delivery (Ledger.read_log: its partition)
            "dynamodb:Query",
        )
        grant_get_parameter(drain_parameter, role)
        # the settlement that ends a run's last unit wakes its finalize loop (its task token:
        # read with the ledger's BatchGetItem, handed back with SendTaskSuccess)
        grant_task_response(role, cdk.Stack.of(self), factory.state_machine_name)
        # each attempt's outcome, written once (a conditional PutObject, If-None-Match: *: an
        # invocation's outcomes in one page, or an attempt's alone), and only under attempts/: a
        # worker can neither read outcomes nor touch a results file
        storage.grant_objects(role, ATTEMPT_RECORDS, "s3:PutObject")
        if config.model.adapter == "bedrock":
            # exactly the registered models (each id's foundation model or inference profile)
            ids = sorted({entry.model_id for entry in config.registry.catalog.values()})
            role.add_to_principal_policy(_bedrock_statement(self, ids))

        # One mapping per lane; higher lanes get more concurrent pollers (MaximumConcurrency).
        self.mappings: dict[Lane, lambda_.EventSourceMapping] = {}
        for lane in LANES:
            queue = lanes.queues[lane]
            # Lambda's SQS poller uses the function's role (not grant_consume_messages: it adds
            # GetQueueUrl, which nothing calls)
            queue.grant(role, "sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:GetQueueAttributes")
            # The handler's own calls (functions/worker.py): RetryLater changes the visibility;
            # every Requeue (draining, governor wait bound, model throttle, busy) sends a fresh
            # copy to the unit's lane. The lanes are SSE-SQS (infra/queues.py): no KMS key to
            # grant; a customer managed key would need kms:GenerateDataKey/Decrypt here.
            queue.grant(role, "sqs:ChangeMessageVisibility", "sqs:SendMessage")
            self.mappings[lane] = lambda_.EventSourceMapping(
                self,
                f"{lane.value.capitalize()}Mapping",
                target=self.worker.function,
                event_source_arn=queue.queue_arn,
                batch_size=worker_config.batch_size,
                max_concurrency=config.lane_concurrency(lane),  # given or derived
                report_batch_item_failures=True,
                enabled=True,
            )

        self.dead_letters: SwarmFunction = factory.build(
            "DeadLetters",
            FunctionSpec(
                name=DLQ,
                description="Records dead letters from the lanes' DLQ and settles them",
                timeout=DLQ_TIMEOUT,
            ),
        )
        ledger.grant(
            self.dead_letters.role,
            "dynamodb:BatchGetItem",  # dead_letter reads the run and the unit (and a token)
            # ends the unit (books + unit updates), settling a claimed attempt first
            "dynamodb:UpdateItem",
        )
        # a dead letter that ends a run's last unit wakes its finalize loop (as the worker)
        grant_task_response(self.dead_letters.role, cdk.Stack.of(self), factory.state_machine_name)
        # the lanes' one dead-letter queue (infra/queues.py): one mapping, so one queue's idle
        # long polls, not three
        lanes.dead_letters.grant(  # its event source mapping's poller; the handler calls no SQS
            self.dead_letters.role,
            "sqs:ReceiveMessage",
            "sqs:DeleteMessage",
            "sqs:GetQueueAttributes",
        )
        lambda_.EventSourceMapping(
            self,
            "DeadLetterMapping",
            target=self.dead_letters.function,
            event_source_arn=lanes.dead_letters.queue_arn,
            batch_size=10,
            max_concurrency=DLQ_MAPPING_CONCURRENCY,  # counted in the account's (infra/config.py)
            report_batch_item_failures=True,
        )

    def mapping_ids(self) -> dict[str, str]:
        """``WORKER_MAPPING_ID_<LANE>`` for the drain controller."""
        return {
            worker_mapping_var(lane): mapping.event_source_mapping_id
            for lane, mapping in self.mappings.items()
        }


def _bedrock_statement(scope: Construct, model_ids: list[str]) -> iam.PolicyStatement:
    """Converse needs bedrock:InvokeModel on the model (or inference profile) it calls, and
    CountTokens (the input's tokens, to bound the answer by the unit's reservation)
    bedrock:CountTokens on the same; the adapter never streams (no ConverseStream), so no
    InvokeModelWithResponseStream."""
    stack = cdk.Stack.of(scope)
    resources: list[str] = []
    for model_id in model_ids:
        prefix, _, base_id = model_id.partition(".")
        if prefix in CROSS_REGION_PREFIXES and base_id:
            # A cross-region inference profile routes to the base model in several regions.
            resources += [
                stack.format_arn(
                    service="bedrock", resource="inference-profile", resource_name=model_id
                ),
                stack.format_arn(
                    service="bedrock",
                    region="*",
                    account="",
                    resource="foundation-model",
                    resource_name=base_id,
                ),
            ]
        else:
            resources.append(
                stack.format_arn(
                    service="bedrock",
                    account="",
                    resource="foundation-model",
                    resource_name=model_id,
                )
            )
    return iam.PolicyStatement(
        actions=["bedrock:InvokeModel", "bedrock:CountTokens"],
        resources=resources,
    )
