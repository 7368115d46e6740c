"""The drain switch: an SSM parameter per stage, a rule on its changes, and the controller."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_ssm as ssm
from constructs import Construct

from infra.config import SwarmConfig
from infra.functions import FunctionFactory, FunctionSpec, SwarmFunction
from infra.queues import LaneQueues
from swarm.contract import DRAIN, DRAIN_OFF, DRAIN_ON, drain_parameter_name


def grant_get_parameter(parameter: ssm.IStringParameter, grantee: iam.IGrantable) -> None:
    """``ssm:GetParameter`` on the switch: all ``SsmDrainSwitch.draining`` calls (``grant_read``
    would add GetParameters, GetParameterHistory and DescribeParameters, which nothing calls)."""
    iam.Grant.add_to_principal(
        grantee=grantee, actions=["ssm:GetParameter"], resource_arns=[parameter.parameter_arn]
    )


class DrainControl(Construct):
    """The parameter exists before the workers (they read it); the controller comes after."""

    def __init__(self, scope: Construct, construct_id: str, *, config: SwarmConfig) -> None:
        super().__init__(scope, construct_id)
        # A known name per stage: operators and `swarm drain on|off` flip it by hand.
        self.parameter = ssm.StringParameter(
            self,
            "Parameter",
            parameter_name=drain_parameter_name(config.stage),
            string_value=DRAIN_OFF,
            allowed_pattern=f"^({DRAIN_ON}|{DRAIN_OFF})$",
            description=f"swarm {config.stage} drain switch: '{DRAIN_ON}' stops intake",
            tier=ssm.ParameterTier.STANDARD,
        )

    def add_controller(
        self,
        *,
        factory: FunctionFactory,
        mappings: list[lambda_.EventSourceMapping],
        lanes: LaneQueues,
        ledger: dynamodb.ITable,
    ) -> SwarmFunction:
        """The controller enables/disables exactly the worker mappings, nothing else."""
        controller = factory.build(
            "DrainController",
            FunctionSpec(
                name=DRAIN,
                description="Enables or disables the worker mappings when the drain switch flips",
                timeout=cdk.Duration.seconds(60),
            ),
        )
        grant_get_parameter(self.parameter, controller.role)  # apply(): a fresh read
        controller.role.add_to_principal_policy(
            iam.PolicyStatement(
                # LambdaMappings.set_enabled; its response carries the state, so the controller
                # never calls GetEventSourceMapping
                actions=["lambda:UpdateEventSourceMapping"],
                resources=[mapping.event_source_mapping_arn for mapping in mappings],
            )
        )
        for queue in lanes.queues.values():  # queued: visible, delayed and not visible
            queue.grant(controller.role, "sqs:GetQueueAttributes")
        # running: the register of running work's shard items (DynamoDBRunning.running)
        ledger.grant(controller.role, "dynamodb:BatchGetItem")
        events.Rule(
            self,
            "Changed",
            description="The drain switch changed: reconcile the worker mappings",
            event_pattern=events.EventPattern(
                source=["aws.ssm"],
                detail_type=["Parameter Store Change"],
                detail={
                    "name": [self.parameter.parameter_name],
                    "operation": ["Create", "Update"],
                },
            ),
            targets=[
                targets.LambdaFunction(
                    controller.function,
                    retry_attempts=8,
                    max_event_age=cdk.Duration.hours(1),
                )
            ],
        )
        return controller
