"""A dashboard and the alarms an operator is paged for, published to an encrypted topic."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as actions
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from infra.config import SwarmConfig
from infra.queues import LaneQueues
from swarm.contract import (
    DLQ,
    METRIC_GOVERNOR_SATURATION,
    METRIC_GOVERNOR_WAIT_MS,
    METRIC_MODEL_THROTTLES,
    METRIC_RUNS_COMPLETED,
    METRIC_RUNS_EXHAUSTED,
    METRIC_SUBMISSIONS_REFUSED,
    METRIC_SUBMISSIONS_SHED,
    METRIC_TOKENS_SPENT,
    METRIC_UNITS_COMPLETED,
    METRIC_UNITS_DEAD_LETTERED,
    METRIC_UNITS_FAILED,
    METRICS_NAMESPACE,
)
from swarm.core.records import LANES

FIVE_MINUTES = cdk.Duration.minutes(5)


class Observability(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: SwarmConfig,
        service: str,
        lanes: LaneQueues,
        api: apigw.RestApi,
        state_machine: sfn.StateMachine,
        functions: dict[str, lambda_.IFunction],
    ) -> None:
        super().__init__(scope, construct_id)
        self.service = service
        removal = cdk.RemovalPolicy.RETAIN if config.production else cdk.RemovalPolicy.DESTROY
        # CloudWatch cannot publish to a topic encrypted with the AWS managed key: own key.
        key = kms.Key(
            self,
            "AlarmKey",
            description=f"swarm {config.stage} alarm topic",
            enable_key_rotation=True,
            removal_policy=removal,
            pending_window=cdk.Duration.days(7),
        )
        key.add_to_resource_policy(
            iam.PolicyStatement(
                principals=[iam.ServicePrincipal("cloudwatch.amazonaws.com")],
                actions=["kms:Decrypt", "kms:GenerateDataKey*"],
                resources=["*"],  # in a key policy, "*" is this key
                conditions={"StringEquals": {"aws:SourceAccount": cdk.Stack.of(self).account}},
            )
        )
        self.topic = sns.Topic(
            self, "Alarms", display_name="swarm alarms", master_key=key, enforce_ssl=True
        )
        if config.observability.alarm_email:
            self.topic.add_subscription(
                subscriptions.EmailSubscription(config.observability.alarm_email)
            )
        action = actions.SnsAction(self.topic)

        self.alarms: list[cloudwatch.Alarm] = []
        # Not the DLQ's depth: the dead-letter handler empties it within seconds, so a depth
        # alarm never sees a dead letter. Page on what the handlers record instead: the DLQ
        # handler (a message SQS gave up on) and the worker (attempts exhausted) both emit
        # UnitsDeadLettered with Powertools (namespace POWERTOOLS_METRICS_NAMESPACE, dimension
        # service = POWERTOOLS_SERVICE_NAME, as _metric builds it).
        self._alarm(
            "UnitsDeadLettered",
            self._metric(METRIC_UNITS_DEAD_LETTERED),
            threshold=1,
            description="Units were dead-lettered (queue receives or attempts exhausted): "
            "see the dead-letter handler's logs for the batch and unit",
            action=action,
        )
        # A failing dead-letter handler neither settles nor counts its dead letters.
        self._alarm(
            "DeadLetterHandlerErrors",
            functions[DLQ].metric_errors(period=FIVE_MINUTES, statistic="Sum"),
            threshold=1,
            description="The dead-letter handler failed: dead letters are not being settled",
            action=action,
        )
        self._alarm(
            "RunsExhausted",
            self._metric(METRIC_RUNS_EXHAUSTED),
            threshold=1,
            description="A run exhausted its budget (run.exhausted): top up and resume",
            action=action,
        )
        self._alarm(
            "GovernorSaturated",
            self._metric(METRIC_GOVERNOR_SATURATION, statistic="Average"),
            threshold=config.observability.governor_saturation_percent,
            evaluation_periods=3,
            description="Most governor draws wait: the quota is the fleet (see N*)",
            action=action,
        )
        self._alarm(
            "ModelThrottles",
            self._metric(METRIC_MODEL_THROTTLES),
            threshold=1,
            description="The model plane throttled the fleet: the governor should prevent this",
            action=action,
        )
        self._alarm(
            "Api5xx",
            api.metric_server_error(period=FIVE_MINUTES, statistic="Sum"),
            threshold=1,
            description="The batch API answered 5xx",
            action=action,
        )
        self._alarm(
            "FanOutFailed",
            state_machine.metric_failed(period=FIVE_MINUTES, statistic="Sum"),
            threshold=1,
            description="A fan-out execution failed",
            action=action,
        )
        self.dashboard = self._dashboard(lanes, api, state_machine, functions)

    def _metric(self, name: str, statistic: str = "Sum") -> cloudwatch.Metric:
        """A Powertools (EMF) metric of this stack's service."""
        return cloudwatch.Metric(
            namespace=METRICS_NAMESPACE,
            metric_name=name,
            dimensions_map={"service": self.service},
            statistic=statistic,
            period=FIVE_MINUTES,
        )

    def _alarm(
        self,
        construct_id: str,
        metric: cloudwatch.IMetric,
        *,
        threshold: float,
        description: str,
        action: actions.SnsAction,
        evaluation_periods: int = 1,
    ) -> None:
        alarm = cloudwatch.Alarm(
            self,
            construct_id,
            metric=metric,
            threshold=threshold,
            evaluation_periods=evaluation_periods,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            alarm_description=description,
        )
        alarm.add_alarm_action(action)
        alarm.add_ok_action(action)
        self.alarms.append(alarm)

    def _dashboard(
        self,
        lanes: LaneQueues,
        api: apigw.RestApi,
        state_machine: sfn.StateMachine,
        functions: dict[str, lambda_.IFunction],
    ) -> cloudwatch.Dashboard:
        dashboard = cloudwatch.Dashboard(self, "Dashboard", default_interval=cdk.Duration.hours(3))
        minute = cdk.Duration.minutes(1)
        dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title="Lane depth (queued)",
                left=[
                    lanes.queues[lane].metric_approximate_number_of_messages_visible(
                        period=minute, statistic="Maximum", label=lane.value
                    )
                    for lane in LANES
                ],
                width=8,
            ),
            cloudwatch.GraphWidget(
                title="In flight",
                left=[
                    lanes.queues[lane].metric_approximate_number_of_messages_not_visible(
                        period=minute, statistic="Maximum", label=lane.value
                    )
                    for lane in LANES
                ],
                width=8,
            ),
            cloudwatch.GraphWidget(
                title="Dead letters",
                left=[
                    lanes.dead_letters.metric_approximate_number_of_messages_visible(
                        period=minute, statistic="Maximum", label="dead letters"
                    )
                ],
                width=8,
            ),
        )
        dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title="Units",
                left=[
                    self._metric(METRIC_UNITS_COMPLETED),
                    self._metric(METRIC_UNITS_FAILED),
                    self._metric(METRIC_UNITS_DEAD_LETTERED),
                ],
                width=8,
            ),
            cloudwatch.GraphWidget(
                title="Tokens spent and model throttles",
                left=[self._metric(METRIC_TOKENS_SPENT)],
                right=[self._metric(METRIC_MODEL_THROTTLES)],
                width=8,
            ),
            cloudwatch.GraphWidget(
                title="Governor",
                left=[self._metric(METRIC_GOVERNOR_SATURATION, statistic="Average")],
                right=[self._metric(METRIC_GOVERNOR_WAIT_MS, statistic="p90")],
                width=8,
            ),
        )
        dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title="Runs",
                left=[self._metric(METRIC_RUNS_COMPLETED), self._metric(METRIC_RUNS_EXHAUSTED)],
                right=[state_machine.metric_started(), state_machine.metric_failed()],
                width=8,
            ),
            cloudwatch.GraphWidget(
                title="Front door",
                left=[
                    api.metric_count(),
                    api.metric_client_error(),
                    api.metric_server_error(),
                    self._metric(METRIC_SUBMISSIONS_SHED),
                    self._metric(METRIC_SUBMISSIONS_REFUSED),
                ],
                right=[api.metric_latency(statistic="p90")],
                width=8,
            ),
            cloudwatch.GraphWidget(
                title="Function errors and throttles",
                left=[fn.metric_errors(label=name) for name, fn in functions.items()],
                right=[
                    fn.metric_throttles(label=f"{name} throttles") for name, fn in functions.items()
                ],
                width=8,
            ),
        )
        return dashboard
