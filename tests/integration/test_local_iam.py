"""IAM on the local stack (swarm.local.patches.iam, swarm.local.apiserver): a role may do exactly
what its policies grant on the resources they name, and the local API admits only SigV4-signed
callers allowed ``execute-api:Invoke``, as API Gateway's ``AWS_IAM`` authorization does."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials as BotoCredentials
from botocore.exceptions import ClientError
from moto import mock_aws

from swarm.local.apiserver import LocalApi
from swarm.local.patches import iam

ACCOUNT, REGION = "123456789012", "us-east-1"
LAMBDA_TRUST = {
    "Version": "2012-10-17",
    "Statement": [
        {
            "Effect": "Allow",
            "Principal": {"Service": "lambda.amazonaws.com"},
            "Action": "sts:AssumeRole",
        }
    ],
}


@pytest.fixture
def enforced(aws_credentials: None) -> Iterator[iam.Credentials]:
    """In-process moto with IAM enforced; the admin user's credentials."""
    with mock_aws():
        admin = iam.create_admin(ACCOUNT)
        iam.enforce()
        try:
            yield admin
        finally:
            iam.relax()


def client(service: str, credentials: iam.Credentials) -> Any:
    return boto3.client(service, region_name=REGION, **credentials.boto())


def function_role(admin: iam.Credentials, name: str, statements: list[dict[str, Any]]) -> str:
    roles = client("iam", admin)
    arn: str = roles.create_role(RoleName=name, AssumeRolePolicyDocument=json.dumps(LAMBDA_TRUST))[
        "Role"
    ]["Arn"]
    policy = {"Version": "2012-10-17", "Statement": statements}
    roles.put_role_policy(RoleName=name, PolicyName="grants", PolicyDocument=json.dumps(policy))
    return arn


def table(admin: iam.Credentials, name: str) -> str:
    arn: str = client("dynamodb", admin).create_table(
        TableName=name,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )["TableDescription"]["TableArn"]
    return arn


def code(error: pytest.ExceptionInfo[ClientError]) -> str:
    return str(error.value.response["Error"]["Code"])


def test_a_role_may_do_what_it_is_granted_on_the_resource_it_names_and_nothing_else(
    enforced: iam.Credentials,
) -> None:
    mine, other = table(enforced, "mine"), table(enforced, "other")
    grants = [
        {"Effect": "Allow", "Action": ["dynamodb:PutItem", "dynamodb:GetItem"], "Resource": mine}
    ]
    role = function_role(enforced, "worker", grants)
    ddb = client("dynamodb", iam.assume(ACCOUNT, REGION, role, "s", "lambda"))
    item = {"pk": {"S": "x"}}

    ddb.put_item(TableName="mine", Item=item)
    assert ddb.get_item(TableName="mine", Key=item)["Item"] == item
    with pytest.raises(ClientError) as denied:  # an action it lacks
        ddb.delete_item(TableName="mine", Key=item)
    assert code(denied) == "AccessDeniedException"
    assert "dynamodb:DeleteItem" in str(denied.value) and mine in str(denied.value)
    with pytest.raises(ClientError) as denied:  # a resource it is not granted
        ddb.get_item(TableName="other", Key=item)
    assert code(denied) == "AccessDeniedException" and other in str(denied.value)
    # a transaction needs each item's action on each table: one foreign table refuses it all
    both = [
        {"Put": {"TableName": "mine", "Item": {"pk": {"S": "y"}}}},
        {"Put": {"TableName": "other", "Item": {"pk": {"S": "y"}}}},
    ]
    with pytest.raises(ClientError) as denied:
        ddb.transact_write_items(TransactItems=both)
    assert code(denied) == "AccessDeniedException"
    assert "Item" not in client("dynamodb", enforced).get_item(
        TableName="mine", Key={"pk": {"S": "y"}}
    )
    ddb.transact_write_items(TransactItems=both[:1])

    refused = [d for d in iam.AUDIT.report()["denied"] if d["principal"].endswith("/worker/s")]
    assert {(d["action"], d["resource"]) for d in refused} >= {
        ("dynamodb:DeleteItem", mine),
        ("dynamodb:GetItem", other),
        ("dynamodb:PutItem", other),
    }


def test_a_queue_grant_covers_its_batch_actions_and_only_that_queue(
    enforced: iam.Credentials,
) -> None:
    sqs = client("sqs", enforced)
    lane = sqs.create_queue(QueueName="lane")["QueueUrl"]
    other = sqs.create_queue(QueueName="other")["QueueUrl"]
    arn = f"arn:aws:sqs:{REGION}:{ACCOUNT}:lane"
    role = function_role(
        enforced, "sender", [{"Effect": "Allow", "Action": "sqs:SendMessage", "Resource": arn}]
    )
    mine = client("sqs", iam.assume(ACCOUNT, REGION, role, "s", "lambda"))

    mine.send_message(QueueUrl=lane, MessageBody="a")
    mine.send_message_batch(QueueUrl=lane, Entries=[{"Id": "1", "MessageBody": "b"}])
    with pytest.raises(ClientError):
        mine.send_message(QueueUrl=other, MessageBody="c")
    with pytest.raises(ClientError):
        mine.receive_message(QueueUrl=lane)


def test_a_role_that_does_not_trust_the_service_cannot_run_a_function(
    enforced: iam.Credentials,
) -> None:
    trust = {
        **LAMBDA_TRUST,
        "Statement": [
            {**LAMBDA_TRUST["Statement"][0], "Principal": {"Service": "states.amazonaws.com"}}
        ],
    }  # type: ignore[dict-item]
    arn = client("iam", enforced).create_role(
        RoleName="machine", AssumeRolePolicyDocument=json.dumps(trust)
    )["Role"]["Arn"]
    with pytest.raises(PermissionError, match=r"does not trust lambda\.amazonaws\.com"):
        iam.assume(ACCOUNT, REGION, arn, "s", "lambda")
    iam.assume(ACCOUNT, REGION, arn, "s", "states")


# ------------------------------------------------------------------ the local API's SigV4


@pytest.fixture
def api(enforced: iam.Credentials) -> Iterator[LocalApi]:
    local = LocalApi(
        clients=None,
        function_arn="unused",
        account=ACCOUNT,
        region=REGION,
        api_id="abc123",
        admin=lambda *a: (404, None),
        stage="local",
    )
    try:
        yield local
    finally:
        local.server.server_close()


def signed(
    credentials: iam.Credentials,
    method: str,
    path: str,
    body: bytes = b"",
    service: str = "execute-api",
) -> dict[str, str]:
    url = f"http://127.0.0.1:8080{path}"
    request = AWSRequest(
        method=method, url=url, data=body, headers={"Content-Type": "application/json"}
    )
    creds = BotoCredentials(
        credentials.access_key_id, credentials.secret_access_key, credentials.session_token
    )
    SigV4Auth(creds, service, REGION).add_auth(request)
    return {**dict(request.headers.items()), "Host": "127.0.0.1:8080"}  # as the HTTP layer sends


def test_the_local_api_admits_a_signed_tenant_and_passes_its_arn(
    enforced: iam.Credentials, api: LocalApi
) -> None:
    arn = iam.ensure_tenant_role(ACCOUNT, REGION, "swarm-tenant-", "acme", "abc123", "local")
    tenant = iam.Credentials(*_assume_as(enforced, arn))
    body = b'{"units": []}'
    headers = signed(tenant, "POST", "/batches", body)
    caller = api.authenticate("POST", "/batches", "", headers, body)
    assert caller == f"arn:aws:sts::{ACCOUNT}:assumed-role/swarm-tenant-acme/cli"


def _assume_as(admin: iam.Credentials, role_arn: str) -> tuple[str, str, str]:
    c = client("sts", admin).assume_role(RoleArn=role_arn, RoleSessionName="cli")["Credentials"]
    return c["AccessKeyId"], c["SecretAccessKey"], c["SessionToken"]


def test_the_local_api_refuses_unsigned_forged_and_unauthorized_callers(
    enforced: iam.Credentials, api: LocalApi
) -> None:
    arn = iam.ensure_tenant_role(ACCOUNT, REGION, "swarm-tenant-", "acme", "abc123", "local")
    tenant = iam.Credentials(*_assume_as(enforced, arn))

    unsigned = api.authenticate("GET", "/fleet", "", {"Host": "127.0.0.1"}, b"")
    assert unsigned == (
        403,
        {"error": "MISSING_AUTHENTICATION_TOKEN", "message": "Missing Authentication Token"},
    )

    forged = iam.Credentials(tenant.access_key_id, "not-the-secret", tenant.session_token)
    status, doc = api.authenticate("GET", "/fleet", "", signed(forged, "GET", "/fleet"), b"")  # type: ignore[misc]
    assert status == 403 and "signature" in doc["message"]
    assert doc["error"] == "INVALID_SIGNATURE"  # every refusal is the API's Error body

    # signed for /fleet, sent to /drain: the signature covers the path
    headers = signed(tenant, "GET", "/fleet")
    status, doc = api.authenticate("GET", "/drain", "", headers, b"")  # type: ignore[misc]
    assert status == 403 and "signature" in doc["message"]

    # a role of the account without execute-api:Invoke on this API (another API's operator)
    operator = iam.ensure_operator_role(
        ACCOUNT, REGION, "swarm-operator-x", "/swarm/local/drain", "zzz999", "local"
    )
    outsider = iam.Credentials(*_assume_as(enforced, operator))
    status, doc = api.authenticate("GET", "/fleet", "", signed(outsider, "GET", "/fleet"), b"")  # type: ignore[misc]
    assert status == 403 and doc["error"] == "ACCESS_DENIED"
    assert doc["message"].endswith(
        "execute-api:Invoke on resource: " + api.method_arn("GET", "/fleet")
    )

    # another API's tenant is not this one's
    elsewhere = iam.ensure_tenant_role(ACCOUNT, REGION, "swarm-tenant-", "other", "zzz999", "local")
    other = iam.Credentials(*_assume_as(enforced, elsewhere))
    status, _ = api.authenticate("GET", "/fleet", "", signed(other, "GET", "/fleet"), b"")  # type: ignore[misc]
    assert status == 403

    # signed for another service
    wrong = signed(tenant, "GET", "/fleet", service="lambda")
    status, doc = api.authenticate("GET", "/fleet", "", wrong, b"")  # type: ignore[misc]
    assert status == 403 and "execute-api" in doc["message"]
    assert doc["error"] == "INVALID_SIGNATURE"

    # a key IAM does not know
    unknown = iam.Credentials("AKIAUNKNOWNUNKNOWN00", "secret", None)
    status, doc = api.authenticate("GET", "/fleet", "", signed(unknown, "GET", "/fleet"), b"")  # type: ignore[misc]
    assert status == 403 and set(doc) == {"error", "message"}, doc


def test_a_secret_granted_by_its_name_with_the_suffix_wildcard_is_readable_and_only_it(
    enforced: iam.Credentials,
) -> None:
    # Secrets Manager adds "-" and six random characters to a secret's ARN: a policy naming the
    # secret by name ends "<name>-??????" (infra/tools.py), which IAM matches one character per ?
    admin = client("secretsmanager", enforced)
    mine = admin.create_secret(Name="mcp/token", SecretString="Authorization: Bearer x")["ARN"]
    admin.create_secret(Name="mcp/token-other", SecretString="no")
    admin.create_secret(Name="mcp/tokenX", SecretString="no")
    prefix = f"arn:aws:secretsmanager:{REGION}:{ACCOUNT}:secret:"
    grants = [
        {
            "Effect": "Allow",
            "Action": ["secretsmanager:GetSecretValue"],
            "Resource": f"{prefix}mcp/token-??????",
        }
    ]
    role = function_role(enforced, "secrets-reader", grants)
    secrets = client("secretsmanager", iam.assume(ACCOUNT, REGION, role, "s", "lambda"))
    # by its name or its ARN: the request is authorized on the secret's ARN
    assert secrets.get_secret_value(SecretId="mcp/token")["SecretString"].startswith("Auth")
    assert secrets.get_secret_value(SecretId=mine)["ARN"] == mine
    for other in ("mcp/token-other", "mcp/tokenX"):  # a longer name is not matched
        with pytest.raises(ClientError) as denied:
            secrets.get_secret_value(SecretId=other)
        assert code(denied) == "AccessDeniedException", other


def test_iam_wildcards_are_one_character_per_question_mark_and_dots_are_themselves() -> None:
    assert iam.iam_match("arn:x:secret:a-??????", "arn:x:secret:a-AbC123")
    assert not iam.iam_match("arn:x:secret:a-??????", "arn:x:secret:a-AbC1234")
    assert not iam.iam_match("a.b", "axb") and iam.iam_match("a.b", "a.b")
    assert iam.iam_match("s3:*", "s3:GetObject") and iam.iam_match("*", "anything")
