"""Priority lanes: one standard SQS queue per lane, and one dead-letter queue they share.

One dead-letter queue, not one per lane: an event source mapping long-polls its queue whatever
arrives (five pollers, 20 s each: ~900 requests an hour), and a dead letter names its run, unit
and lane in its body, so the handler needs nothing a queue per lane would tell it."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from infra.config import SwarmConfig
from swarm.core.records import LANES, Lane

#: Dead letters wait for an operator as long as SQS allows.
RETENTION = cdk.Duration.days(14)


class LaneQueues(Construct):
    """``queues[lane]`` and ``dead_letters`` (theirs, shared): encrypted (SSE-SQS), TLS-only,
    redrive."""

    def __init__(
        self, scope: Construct, construct_id: str, *, config: SwarmConfig, dlq_timeout: cdk.Duration
    ) -> None:
        super().__init__(scope, construct_id)
        removal = cdk.RemovalPolicy.RETAIN if config.production else cdk.RemovalPolicy.DESTROY
        self.dead_letters = sqs.Queue(
            self,
            "DeadLetters",
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            retention_period=RETENTION,
            # The DLQ handler's mapping needs a visibility timeout above its timeout.
            visibility_timeout=cdk.Duration.seconds(6 * dlq_timeout.to_seconds()),
            removal_policy=removal,
        )
        self.queues: dict[Lane, sqs.Queue] = {}
        for lane in LANES:
            self.queues[lane] = sqs.Queue(
                self,
                f"{lane.value.capitalize()}Lane",
                encryption=sqs.QueueEncryption.SQS_MANAGED,
                enforce_ssl=True,
                # Queued work survives a long drain; 14 days is the SQS maximum.
                retention_period=RETENTION,
                visibility_timeout=cdk.Duration.seconds(config.visibility_timeout_seconds),
                dead_letter_queue=sqs.DeadLetterQueue(
                    max_receive_count=config.max_receive_count, queue=self.dead_letters
                ),
                removal_policy=removal,
            )
