"""The manifest/results bucket, with its server access log bucket."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from constructs import Construct

from infra.config import SwarmConfig
from infra.constants import MANIFEST_PREFIX, RESULTS_PREFIX

#: the outcome records under every run's results (results/<run>/attempts/<page>.json, and an
#: attempt kept alone at results/<run>/attempts/<unit>/<n>.json)
ATTEMPT_RECORDS = f"{RESULTS_PREFIX}*/attempts/"
#: how long an overwritten or deleted object of the batches bucket stays recoverable
NONCURRENT_VERSIONS = cdk.Duration.days(7)


class BatchStorage(Construct):
    """Encrypted, private, TLS-only buckets that clean up after themselves (lifecycle rules)."""

    def __init__(self, scope: Construct, construct_id: str, *, config: SwarmConfig) -> None:
        super().__init__(scope, construct_id)
        removal = cdk.RemovalPolicy.RETAIN if config.production else cdk.RemovalPolicy.DESTROY
        self.access_logs = s3.Bucket(
            self,
            "AccessLogs",
            encryption=s3.BucketEncryption.S3_MANAGED,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            enforce_ssl=True,
            versioned=False,
            lifecycle_rules=[
                s3.LifecycleRule(id="expire-access-logs", expiration=cdk.Duration.days(90))
            ],
            removal_policy=removal,
        )
        self.bucket = s3.Bucket(
            self,
            "Batches",
            encryption=s3.BucketEncryption.S3_MANAGED,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            enforce_ssl=True,
            server_access_logs_bucket=self.access_logs,
            server_access_logs_prefix="batches/",
            # Every key is written once (manifests and outcome records per batch, results per
            # closure), so versions cost nothing in normal operation; an overwritten or deleted
            # object (a bug, a reused upload URL) stays recoverable for a week.
            versioned=True,
            lifecycle_rules=[
                s3.LifecycleRule(
                    id="expire-manifests",
                    prefix=MANIFEST_PREFIX,
                    expiration=cdk.Duration.days(30),
                ),
                s3.LifecycleRule(
                    id="expire-results",
                    prefix=RESULTS_PREFIX,
                    expiration=cdk.Duration.days(config.results.retention_days),
                ),
                s3.LifecycleRule(
                    id="expire-noncurrent-versions",
                    noncurrent_version_expiration=NONCURRENT_VERSIONS,
                    # the delete marker an expiry leaves once its last version is gone
                    expired_object_delete_marker=True,
                ),
                s3.LifecycleRule(
                    id="abort-incomplete-uploads",
                    abort_incomplete_multipart_upload_after=cdk.Duration.days(1),
                ),
            ],
            removal_policy=removal,
        )

    def grant_objects(self, grantee: iam.IGrantable, prefix: str, *actions: str) -> None:
        """Exactly ``actions`` on the objects under ``prefix`` (CDK's grants add List*/Get*)."""
        grantee.grant_principal.add_to_principal_policy(
            iam.PolicyStatement(
                actions=list(actions), resources=[self.bucket.arn_for_objects(f"{prefix}*")]
            )
        )

    def grant_list(self, grantee: iam.IGrantable, *prefixes: str) -> None:
        """``s3:ListBucket`` limited to keys under ``prefixes``, for a role that reads objects
        there and must tell a missing one from one it may not read.

        Without ``s3:ListBucket``, S3 answers a GetObject/HeadObject of a missing key with 403
        AccessDenied, not 404: the code would either fail on every "is it there?" (the
        finalizer's results check) or have to read every 403 as "missing", which would also
        hide a real denial. S3 evaluates that ListBucket check with the requested key as
        ``s3:prefix``, so a ``StringLike`` condition on the prefixes the role already reads
        keeps the grant to names it may read anyway (a listing of them reveals nothing more).
        """
        grantee.grant_principal.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["s3:ListBucket"],
                resources=[self.bucket.bucket_arn],
                conditions={"StringLike": {"s3:prefix": [f"{p}*" for p in prefixes]}},
            )
        )
