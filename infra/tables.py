"""The governor's bucket and the ledger's books: DynamoDB, on demand, PITR, TTL."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_dynamodb as dynamodb
from constructs import Construct

from infra import indexes
from infra.config import SwarmConfig
from infra.constants import (
    LEASE_EXPIRY,
    LEASES_INDEX,
    OPEN_RUNS_INDEX,
    PARTITION_KEY,
    SORT_KEY,
    TENANT_RUNS_INDEX,
    TENANT_RUNS_PARTITION_KEY,
    TTL_ATTRIBUTE,
    WATCH_PARTITION_KEY,
    WATCH_PROJECTED,
    WATCH_SORT_KEY,
)

#: the table construct ids (the keys of ``deployed_indexes`` and ``index_rollout``)
TABLES = ("Governor", "Ledger")
#: every attribute a table or index key uses, with its DynamoDB type
ATTRIBUTE_TYPES = {
    PARTITION_KEY: "S",
    SORT_KEY: "S",
    WATCH_PARTITION_KEY: "S",
    WATCH_SORT_KEY: "N",
    TENANT_RUNS_PARTITION_KEY: "S",
    LEASE_EXPIRY: "N",
}


class Tables(Construct):
    """``dynamodb.Table`` (not TableV2: moto silently skips AWS::DynamoDB::GlobalTable)."""

    def __init__(self, scope: Construct, construct_id: str, *, config: SwarmConfig) -> None:
        super().__init__(scope, construct_id)
        # Both use the adapters' key schema (docs/explanation/governor.md,
        # docs/explanation/ledger.md): governor shards are pk=gov#<name>, sk=shard#NNNN; ledger
        # items pk=run#<id>, sk=spec|books|unit#.. (and attempt#.. of an earlier layout: read only)
        self.governor = self._table("Governor", config)
        self.ledger = self._table("Ledger", config)
        for construct_id, table in (("Governor", self.governor), ("Ledger", self.ledger)):
            self._add_indexes(table, construct_id)

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

    def _add_indexes(self, table: dynamodb.Table, construct_id: str) -> None:
        """The table's indexes (:func:`wanted_indexes`), at most one of them created or deleted
        in a stack update (infra/indexes.py).

        ``OpenRuns``: the sweeper's sparse index of watched runs
        (swarm/adapters/dynamodb_watch.py): only books items carrying ``watch`` appear in it,
        ordered by ``sweep_at``.

        Added on the CloudFormation resource, not with ``Table.add_global_secondary_index``: an
        L2 table with an index makes every ``Table.grant`` also grant ``<table>/index/*``, so
        every role with a ledger grant would get its actions on every index. Only the sweeper
        queries this one, and it is granted ``dynamodb:Query`` on this index by name.

        ``TenantRuns`` beside it: the same watched runs by tenant (``open_tenant``, written with
        the watch attributes), keys only, so the hot writes that change a run's counts never
        touch it; only the API queries it (a tenant's queued units, swarm.core.tenancy).

        ``Leases``: the units that hold a lease, by run (the table's ``pk``) and lease expiry
        (``res_lease``, present only while a unit holds a reservation), keys only. The finalizer
        (and the sweeper, which runs it) Query it for the expired leases of one run instead of
        reading every unit (swarm.adapters.dynamodb_ledger, docs/explanation/ledger.md).
        """
        cfn = table.node.default_child
        assert isinstance(cfn, dynamodb.CfnTable)
        build = indexes.plan(
            construct_id,
            wanted_indexes()[construct_id],
            record=indexes.released(),
            deployed=indexes.names_from_context(
                self.node.try_get_context(indexes.DEPLOYED_CONTEXT),
                indexes.DEPLOYED_CONTEXT,
                TABLES,
            ),
            rollout=indexes.names_from_context(
                self.node.try_get_context(indexes.ROLLOUT_CONTEXT),
                indexes.ROLLOUT_CONTEXT,
                TABLES,
            ),
        )
        if not build:
            return
        keys = {PARTITION_KEY, SORT_KEY} | {
            key["AttributeName"] for index in build for key in index["KeySchema"]
        }
        # exactly the attributes some key uses: CloudFormation refuses an unused definition
        cfn.add_property_override(
            "AttributeDefinitions",
            [
                {"AttributeName": name, "AttributeType": kind}
                for name, kind in ATTRIBUTE_TYPES.items()
                if name in keys
            ],
        )
        cfn.add_property_override("GlobalSecondaryIndexes", build)


def wanted_indexes() -> dict[str, list[indexes.Index]]:
    """Every global secondary index the code needs, per table construct id, in the order a
    staged upgrade adds them."""
    return {
        "Governor": [],
        "Ledger": [
            {
                "IndexName": OPEN_RUNS_INDEX,
                "KeySchema": [
                    {"AttributeName": WATCH_PARTITION_KEY, "KeyType": "HASH"},
                    {"AttributeName": WATCH_SORT_KEY, "KeyType": "RANGE"},
                ],
                "Projection": {
                    "ProjectionType": "INCLUDE",
                    "NonKeyAttributes": list(WATCH_PROJECTED),
                },
            },
            {
                "IndexName": TENANT_RUNS_INDEX,
                "KeySchema": [{"AttributeName": TENANT_RUNS_PARTITION_KEY, "KeyType": "HASH"}],
                "Projection": {"ProjectionType": "KEYS_ONLY"},
            },
            {
                "IndexName": LEASES_INDEX,
                "KeySchema": [
                    {"AttributeName": PARTITION_KEY, "KeyType": "HASH"},
                    {"AttributeName": LEASE_EXPIRY, "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "KEYS_ONLY"},
            },
        ],
    }
