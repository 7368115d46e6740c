"""Lanes, dead-letter queues, tables, bucket: the data plane's durable pieces."""

from __future__ import annotations

from aws_cdk.assertions import Match

from swarm.adapters.dynamodb import PARTITION_KEY, SORT_KEY
from swarm.core.records import LANES
from tests.infra.conftest import Synthesized
from tests.infra.helpers import arn


def test_every_lane_redrives_to_the_one_dead_letter_queue(synth: Synthesized) -> None:
    # Given the synthesized dev stage
    lanes = synth.stack.lanes
    for lane in LANES:
        queue = synth.resources[synth.logical_id(lanes.queues[lane])]["Properties"]
        # Then each lane queue redrives to the lanes' DLQ after max_receive_count receives
        assert queue["RedrivePolicy"] == {
            "deadLetterTargetArn": arn(synth, lanes.dead_letters),
            "maxReceiveCount": synth.config.max_receive_count,
        }
        # And its visibility timeout is six times the worker's timeout (AWS's guidance)
        assert queue["VisibilityTimeout"] == 6 * synth.config.worker.timeout_seconds
        assert queue["MessageRetentionPeriod"] == 14 * 24 * 3600


def test_queues_are_encrypted_and_tls_only(synth: Synthesized) -> None:
    queues = synth.of_type("AWS::SQS::Queue")
    assert len(queues) == len(LANES) + 1  # the lanes and their dead-letter queue
    for queue in queues.values():
        assert queue["Properties"]["SqsManagedSseEnabled"] is True
    policies = synth.of_type("AWS::SQS::QueuePolicy")
    assert len(policies) == len(queues)
    for policy in policies.values():
        assert {
            "Action": "sqs:*",
            "Condition": {"Bool": {"aws:SecureTransport": "false"}},
            "Effect": "Deny",
            "Principal": {"AWS": "*"},
            "Resource": policy["Properties"]["PolicyDocument"]["Statement"][0]["Resource"],
        } in policy["Properties"]["PolicyDocument"]["Statement"]


def test_tables_are_on_demand_with_pitr_and_ttl(synth: Synthesized) -> None:
    tables = synth.of_type("AWS::DynamoDB::Table")
    # the governor, the ledger, the notes tools' and the BFCL toolset's journals (infra/tools.py)
    assert len(tables) == 4
    assert not synth.of_type("AWS::DynamoDB::GlobalTable")  # moto skips TableV2
    for table in tables.values():
        props = table["Properties"]
        assert props["BillingMode"] == "PAY_PER_REQUEST"
        assert props["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}
        assert props["TimeToLiveSpecification"] == {"AttributeName": "expires_at", "Enabled": True}
        assert props["SSESpecification"]["SSEEnabled"] is True
        # the key schema the DynamoDB adapters write (governor shards, ledger items, notes,
        # journals)
        assert props["KeySchema"] == [
            {"AttributeName": PARTITION_KEY, "KeyType": "HASH"},
            {"AttributeName": SORT_KEY, "KeyType": "RANGE"},
        ]
        # dev: no deletion protection, deleted with the stack
        assert props.get("DeletionProtectionEnabled", False) is False
        assert table["DeletionPolicy"] == "Delete"


def test_production_stage_retains_and_protects_data(prod_synth: Synthesized) -> None:
    assert prod_synth.config.production
    for table in prod_synth.of_type("AWS::DynamoDB::Table").values():
        assert table["Properties"]["DeletionProtectionEnabled"] is True
        assert table["DeletionPolicy"] == "Retain"
    for type_name in ("AWS::SQS::Queue", "AWS::S3::Bucket", "AWS::Logs::LogGroup"):
        for resource in prod_synth.of_type(type_name).values():
            assert resource["DeletionPolicy"] == "Retain", type_name


def test_bucket_is_private_encrypted_tls_only_with_lifecycle(synth: Synthesized) -> None:
    bucket_id = synth.logical_id(synth.stack.storage.bucket)
    props = synth.resources[bucket_id]["Properties"]
    assert props["BucketEncryption"]["ServerSideEncryptionConfiguration"] == [
        {"ServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}
    ]
    assert props["PublicAccessBlockConfiguration"] == {
        "BlockPublicAcls": True,
        "BlockPublicPolicy": True,
        "IgnorePublicAcls": True,
        "RestrictPublicBuckets": True,
    }
    rules = {rule["Id"]: rule for rule in props["LifecycleConfiguration"]["Rules"]}
    assert rules["expire-manifests"]["Prefix"] == "manifests/"
    assert rules["expire-results"]["Prefix"] == "results/"
    assert "abort-incomplete-uploads" in rules
    assert props["LoggingConfiguration"]["DestinationBucketName"] == {
        "Ref": synth.logical_id(synth.stack.storage.access_logs)
    }
    synth.assertions.has_resource_properties(
        "AWS::S3::BucketPolicy",
        {
            "Bucket": {"Ref": bucket_id},
            "PolicyDocument": {
                "Statement": Match.array_with(
                    [
                        Match.object_like(
                            {
                                "Effect": "Deny",
                                "Condition": {"Bool": {"aws:SecureTransport": "false"}},
                            }
                        )
                    ]
                )
            },
        },
    )


def test_drain_switch_parameter_and_rule(synth: Synthesized) -> None:
    parameter = synth.stack.drain.parameter
    synth.assertions.has_resource_properties(
        "AWS::SSM::Parameter",
        {
            "Name": "/swarm/dev/drain",
            "Type": "String",
            "Value": "off",
            "AllowedPattern": "^(on|off)$",
        },
    )
    drain_fn = synth.logical_id(synth.stack.drain_controller.function)
    synth.assertions.has_resource_properties(
        "AWS::Events::Rule",
        {
            "EventPattern": {
                "source": ["aws.ssm"],
                "detail-type": ["Parameter Store Change"],
                "detail": {
                    "name": [{"Ref": synth.logical_id(parameter)}],
                    "operation": ["Create", "Update"],
                },
            },
            "Targets": [Match.object_like({"Arn": {"Fn::GetAtt": [drain_fn, "Arn"]}})],
        },
    )
