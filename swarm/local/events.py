"""Lambda event shapes the local runtime and the integration tests feed to the real handlers.

moto cannot invoke AWS_PROXY integrations, so HTTP requests become API Gateway REST proxy events
here; SQS messages become the batches an event source mapping would deliver.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


def proxy_event(
    method: str,
    path: str,
    *,
    body: str | None = None,
    headers: Mapping[str, str] | None = None,
    user_arn: str | None = None,
    user: str | None = None,
    stage: str = "local",
    query: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """An API Gateway REST API proxy event (payload format 1.0) for ``method path``."""
    hdrs = dict(headers or {})
    return {
        "resource": path,
        "path": path,
        "httpMethod": method.upper(),
        "headers": hdrs,
        "multiValueHeaders": {k: [v] for k, v in hdrs.items()},
        "queryStringParameters": dict(query) if query else None,
        "multiValueQueryStringParameters": {k: [v] for k, v in query.items()} if query else None,
        "pathParameters": None,
        "stageVariables": None,
        "body": body,
        "isBase64Encoded": False,
        "requestContext": {
            "resourcePath": path,
            "httpMethod": method.upper(),
            "path": f"/{stage}{path}",
            "stage": stage,
            "requestId": str(uuid.uuid4()),
            # API Gateway's identity of a role session: user is "<role unique id>:<session>"
            "identity": {
                "userArn": user_arn,
                "caller": user,
                "user": user,
                "sourceIp": "127.0.0.1",
            },
        },
    }


def sqs_event(queue_arn: str, messages: Sequence[Mapping[str, Any]], region: str) -> dict[str, Any]:
    """The event an SQS event source mapping delivers for ``receive_message`` output."""
    return {
        "Records": [
            {
                "messageId": m["MessageId"],
                "receiptHandle": m["ReceiptHandle"],
                "body": m["Body"],
                "attributes": dict(m.get("Attributes", {})),
                "messageAttributes": dict(m.get("MessageAttributes", {})),
                "md5OfBody": m.get("MD5OfBody") or hashlib.md5(m["Body"].encode()).hexdigest(),
                "eventSource": "aws:sqs",
                "eventSourceARN": queue_arn,
                "awsRegion": region,
            }
            for m in messages
        ]
    }


@dataclass
class LambdaContext:
    """Enough of the Lambda context object for Powertools."""

    function_name: str
    memory_limit_in_mb: int = 512
    aws_request_id: str = ""
    invoked_function_arn: str = ""
    log_group_name: str = ""
    log_stream_name: str = ""
    function_version: str = "$LATEST"

    def __post_init__(self) -> None:
        self.aws_request_id = self.aws_request_id or str(uuid.uuid4())
        if not self.invoked_function_arn:
            self.invoked_function_arn = (
                f"arn:aws:lambda:us-east-1:123456789012:function:{self.function_name}"
            )

    def get_remaining_time_in_millis(self) -> int:
        return 300_000
