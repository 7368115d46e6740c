"""The governor's bucket and the ledger's books: DynamoDB, on demand, PITR, TTL."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_dynamodb as dynamodb
from constructs import Construct

from infra.config import SwarmConfig
from infra.constants import PARTITION_KEY, SORT_KEY, TTL_ATTRIBUTE


class Tables(Construct):
    """``dynamodb.Table`` (not TableV2: moto silently skips AWS::DynamoDB::GlobalTable)."""

    def __init__(self, scope: Construct, construct_id: str, *, config: SwarmConfig) -> None:
        super().__init__(scope, construct_id)
        # Both use the adapters' key schema (swarm.adapters): governor shards are
        # pk=gov#<name>, sk=shard#NNNN; ledger items pk=run#<id>, sk=spec|books|unit#..|attempt#..
        self.governor = self._table("Governor", config)
        self.ledger = self._table("Ledger", config)

    def _table(self, construct_id: str, config: SwarmConfig) -> dynamodb.Table:
        return dynamodb.Table(
            self,
            construct_id,
            partition_key=dynamodb.Attribute(
                name=PARTITION_KEY, type=dynamodb.AttributeType.STRING
            ),
            sort_key=dynamodb.Attribute(name=SORT_KEY, type=dynamodb.AttributeType.STRING),
            billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            # Idempotency and settlement records expire on their own.
            time_to_live_attribute=TTL_ATTRIBUTE,
            encryption=dynamodb.TableEncryption.AWS_MANAGED,
            deletion_protection=config.production,
            removal_policy=(
                cdk.RemovalPolicy.RETAIN if config.production else cdk.RemovalPolicy.DESTROY
            ),
        )
