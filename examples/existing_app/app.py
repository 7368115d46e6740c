#!/usr/bin/env python3
"""An existing CDK app that adds the swarm control plane to one of its own stacks.

The stack holds the team's own resources (an alerts topic and an on-call role) beside a
``SwarmControlPlane``, and uses the construct's attributes: an alarm on its dead-letter queue goes
to the team's topic, and the on-call role may flip its drain switch. cdk-nag (AwsSolutions) checks
the whole stack on every synth, as the control plane's own app does.

Run it with ``cdk synth`` (cdk.json says how), or ``python app.py`` (the same context: this file
reads cdk.json itself). Settings: cdk.json's ``swarm`` object, the keys of the control plane's own
cdk.json (docs/reference/config.md).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aws_cdk as cdk
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cloudwatch_actions
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sns as sns
from cdk_nag import AwsSolutionsChecks
from constructs import Construct

from infra.config import SwarmConfig
from infra.control_plane import SwarmControlPlane

HERE = Path(__file__).resolve().parent


class TeamStack(cdk.Stack):
    """The team's stack: its own resources, and the control plane beside them."""

    def __init__(self, scope: Construct, construct_id: str, **kwargs: Any) -> None:
        super().__init__(scope, construct_id, **kwargs)
        # The team's own alerts topic. CloudWatch publishes only to a topic whose key lets it.
        key = kms.Key(self, "AlertsKey", enable_key_rotation=True)
        key.add_to_resource_policy(
            iam.PolicyStatement(
                principals=[iam.ServicePrincipal("cloudwatch.amazonaws.com")],
                actions=["kms:Decrypt", "kms:GenerateDataKey*"],
                resources=["*"],  # in a key policy, "*" is this key
                conditions={"StringEquals": {"aws:SourceAccount": self.account}},
            )
        )
        self.alerts = sns.Topic(self, "Alerts", master_key=key, enforce_ssl=True)

        # The control plane, with the settings of cdk.json's "swarm" object.
        self.swarm = SwarmControlPlane(
            self, "Swarm", config=SwarmConfig.from_context(self, key="swarm")
        )

        # An alarm of the team's own on one of its attributes: units the control plane gave up on.
        dead_letters = self.swarm.dead_letter_queue.metric_approximate_number_of_messages_visible(
            period=cdk.Duration.minutes(5), statistic="Maximum"
        )
        alarm = cloudwatch.Alarm(
            self,
            "DeadLettersAlarm",
            metric=dead_letters,
            threshold=1,
            evaluation_periods=1,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            alarm_description="The swarm control plane dead-lettered messages",
        )
        alarm.add_alarm_action(cloudwatch_actions.SnsAction(self.alerts))

        # A grant of the team's own: its on-call role may drain the fleet (`swarm drain on`).
        self.on_call = iam.Role(
            self,
            "OnCall",
            assumed_by=iam.AccountPrincipal(self.account),
            description="The team's on-call engineers: may flip the swarm drain switch",
        )
        self.swarm.drain_parameter.grant_read(self.on_call)
        self.swarm.drain_parameter.grant_write(self.on_call)

        # What the swarm CLI reads from a deployed stack (its API URL, bucket, tables...).
        for name, value in self.swarm.outputs().items():
            cdk.CfnOutput(self, name, value=value)


def cdk_json_context() -> dict[str, Any]:
    context: dict[str, Any] = json.loads((HERE / "cdk.json").read_text())["context"]
    return context


def build_app(context: Mapping[str, Any] | None = None, outdir: str | None = None) -> cdk.App:
    """The app: cdk.json's context (the CDK CLI passes the same, and its ``-c`` values win)."""
    app = cdk.App(context={**cdk_json_context(), **(context or {})}, outdir=outdir)
    TeamStack(app, "TeamApp", description="A team's app with the swarm control plane in it")
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    return app


if __name__ == "__main__":
    build_app().synth()
