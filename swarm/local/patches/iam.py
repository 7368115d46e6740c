"""IAM on the local stack: every request authorized against its caller's policies and real ARNs.

moto can authorize requests (``INITIAL_NO_AUTH_ACTION_COUNT``): it verifies the SigV4 signature
against the access keys of its IAM users and STS sessions, then evaluates the caller's identity
policies. But for every service except S3 it evaluates them against resource ``*``, so a
statement scoped to real ARNs (what every CDK ``grant_*`` writes) never matches, and an
enforcing emulator would refuse everything. :func:`enforce` switches authorization on and
replaces that check: it derives, from the request itself, each (IAM action, resource ARN) pair
AWS would authorize (:func:`authorization_requests`) and checks every one. A
``TransactWriteItems`` is authorized as ``PutItem``/``UpdateItem``/``DeleteItem``/
``ConditionCheckItem`` on each table it names; a ``BatchGetItem`` as ``BatchGetItem`` on each
table; ``PutEvents`` on each entry's bus; Lambda's ``Invoke`` as ``lambda:InvokeFunction``.

Who calls with which credentials (:class:`Principals`):

* the emulator's own plumbing (deploying, the SQS pollers' invokes, API Gateway's invoke of the
  API function, the drain rule's target) is an IAM user with ``*`` (:data:`ADMIN_USER`), as the
  AWS services behind those calls act under their own service principals;
* every Lambda invocation runs with STS credentials of its own execution role, as CloudFormation
  created it in the emulator; an event source mapping polls its queue with the function's role,
  as Lambda does;
* the Step Functions interpreter calls its tasks (``lambda:invoke``, the ItemReader's
  ``s3:getObject``, the ResultWriter's ``s3:putObject``) with the state machine's role;
* tenants and operators are IAM roles (:func:`ensure_tenant_role`, :func:`ensure_operator_role`,
  named with the deployment's tenant and operator prefixes)
  that the CLI assumes; the local API verifies their signatures (:mod:`swarm.local.apiserver`).

Every decision is recorded (:data:`AUDIT`): per role, the (action, resource) pairs it used, and
every refusal. The e2e tier reads them back (``GET /_local/iam``) to show that what each function
calls is granted and what its role grants is called.

Not checked locally (see docs/explanation/local.md): condition keys, resource-based policies (bucket
and queue policies, Lambda permissions), KMS key policies, SCPs and permission boundaries.
"""

from __future__ import annotations

import json
import re
import threading
import urllib.parse
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

ADMIN_USER = "swarm-local-emulator"
PARTITION = "aws"
_ALL = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}


@dataclass(frozen=True)
class Credentials:
    access_key_id: str
    secret_access_key: str
    session_token: str | None = None

    def boto(self) -> dict[str, str]:
        """Keyword arguments for ``boto3.client``/``Session``."""
        out = {
            "aws_access_key_id": self.access_key_id,
            "aws_secret_access_key": self.secret_access_key,
        }
        if self.session_token:
            out["aws_session_token"] = self.session_token
        return out


# ---------------------------------------------------------------- the resource of a request
_TRANSACT_WRITE = {
    "Put": "PutItem",
    "Update": "UpdateItem",
    "Delete": "DeleteItem",
    "ConditionCheck": "ConditionCheckItem",
}
_STATES_ARN_KEYS = ("stateMachineArn", "executionArn", "mapRunArn", "activityArn")
_LAMBDA_ACTIONS = {"Invoke": "InvokeFunction", "InvokeAsync": "InvokeFunction"}
#: SQS authorizes a batch request as its single-message action
_SQS_BATCH = {
    "SendMessageBatch": "SendMessage",
    "DeleteMessageBatch": "DeleteMessage",
    "ChangeMessageVisibilityBatch": "ChangeMessageVisibility",
}


def _table_arn(region: str, account: str, name: str, index: str | None = None) -> str:
    arn = (
        name
        if name.startswith("arn:")
        else f"arn:{PARTITION}:dynamodb:{region}:{account}:table/{name}"
    )
    return f"{arn}/index/{index}" if index else arn


def _queue_arn(region: str, account: str, url: str) -> str:
    parts = urllib.parse.urlsplit(url).path.strip("/").split("/")
    queue_account, name = (parts[0], parts[1]) if len(parts) >= 2 else (account, parts[-1])
    return f"arn:{PARTITION}:sqs:{region}:{queue_account}:{name}"


def _parameter_arn(region: str, account: str, name: str) -> str:
    if name.startswith("arn:"):
        return name
    return f"arn:{PARTITION}:ssm:{region}:{account}:parameter/{name.lstrip('/')}"


def _bus_arn(region: str, account: str, name: str | None) -> str:
    name = name or "default"
    return (
        name
        if name.startswith("arn:")
        else f"arn:{PARTITION}:events:{region}:{account}:event-bus/{name}"
    )


def _function_arn(region: str, account: str, name: str) -> str:
    name = urllib.parse.unquote(name)
    if name.startswith("arn:"):
        return ":".join(name.split(":")[:7])  # without a qualifier
    return f"arn:{PARTITION}:lambda:{region}:{account}:function:{name.split(':')[0]}"


#: answers to a waiting task: authorized on the state machine whose execution issued the token
_TASK_RESPONSES = frozenset({"SendTaskSuccess", "SendTaskFailure", "SendTaskHeartbeat"})


def _secret_arn(region: str, account: str, secret_id: str) -> str:
    """A secret's ARN (with the six random characters Secrets Manager adds), whether the
    request names it by name or by ARN; an unknown one as ``...:secret:<id>``."""
    from moto.secretsmanager.models import secretsmanager_backends

    found = secretsmanager_backends[account][region].secrets.get(secret_id)
    if found is not None:
        return str(found.arn)
    if secret_id.startswith("arn:"):
        return secret_id
    return f"arn:{PARTITION}:secretsmanager:{region}:{account}:secret:{secret_id}"


def iam_match(pattern: str, value: str) -> re.Match[str] | None:
    """IAM's wildcards: ``*`` any run of characters, ``?`` exactly one, everything else itself
    (moto's own turns only ``*`` into a regex and leaves ``?`` and ``.`` to the regex, so a
    secret's ``name-??????`` raised "multiple repeat")."""
    parts = ["." if c == "?" else ".*" if c == "*" else re.escape(c) for c in pattern]
    return re.match("^" + "".join(parts) + "$", value, re.DOTALL)


def _token_state_machine(token: str, region: str, account: str) -> str | None:
    """The state machine whose execution issued ``token`` (a task waiting for it, or one that
    did), as AWS reads it from the token; None if no execution of the emulator ever did."""
    try:
        from moto.stepfunctions.parser.models import stepfunctions_parser_backends

        backend = stepfunctions_parser_backends[account][region]
        for execution in backend._get_executions():
            worker = getattr(execution, "exec_worker", None)
            pool = getattr(getattr(worker, "env", None), "callback_pool_manager", None)
            if pool is not None and pool.get(token) is not None:
                return str(execution.state_machine_arn)
    except Exception:  # the interpreter's internals moved: authorize as moto does (on *)
        return None
    return None


def authorization_requests(
    service: str, action: str, body: Any, path: str, region: str, account: str
) -> list[tuple[str, str]]:
    """The (``service:Action``, resource ARN) pairs AWS authorizes for one request.

    ``body`` is the parsed JSON body (or the query parameters of a query-protocol request),
    ``path`` the URL path. Requests the project never makes fall back to ``*``, as moto does.
    """
    b: dict[str, Any] = body if isinstance(body, dict) else {}
    pairs: list[tuple[str, str]] = []
    if service == "dynamodb":
        if action in ("BatchGetItem", "BatchWriteItem"):
            pairs = [(action, _table_arn(region, account, t)) for t in b.get("RequestItems", {})]
        elif action == "TransactWriteItems":
            for item in b.get("TransactItems", []):
                for kind, op in item.items():
                    pairs.append(
                        (_TRANSACT_WRITE[kind], _table_arn(region, account, op["TableName"]))
                    )
        elif action == "TransactGetItems":
            pairs = [
                ("GetItem", _table_arn(region, account, item["Get"]["TableName"]))
                for item in b.get("TransactItems", [])
            ]
        elif "TableName" in b:
            pairs = [(action, _table_arn(region, account, b["TableName"], b.get("IndexName")))]
    elif service == "sqs":
        action = _SQS_BATCH.get(action, action)
        if "QueueUrl" in b:
            pairs = [(action, _queue_arn(region, account, str(b["QueueUrl"])))]
        elif "QueueName" in b:
            pairs = [(action, f"arn:{PARTITION}:sqs:{region}:{account}:{b['QueueName']}")]
    elif service == "ssm":
        names = b.get("Names") or ([b["Name"]] if "Name" in b else [])
        if "Path" in b:
            names = [b["Path"]]
        pairs = [(action, _parameter_arn(region, account, str(n))) for n in names]
    elif service == "states":
        key = next((k for k in _STATES_ARN_KEYS if k in b), None)
        if key is not None:
            pairs = [(action, str(b[key]))]
        elif action in _TASK_RESPONSES and "taskToken" in b:
            machine = _token_state_machine(str(b["taskToken"]), region, account)
            if machine is not None:
                pairs = [(action, machine)]
    elif service == "events":
        if action == "PutEvents":
            buses = {_bus_arn(region, account, e.get("EventBusName")) for e in b.get("Entries", [])}
            pairs = [(action, bus) for bus in sorted(buses)]
        elif "EventBusName" in b or "Name" in b:
            pairs = [(action, _bus_arn(region, account, b.get("EventBusName") or b.get("Name")))]
    elif service == "lambda":
        segments = [s for s in path.split("?")[0].split("/") if s]
        action = _LAMBDA_ACTIONS.get(action, action)
        if len(segments) >= 3 and segments[1] == "functions":
            pairs = [(action, _function_arn(region, account, segments[2]))]
        elif len(segments) >= 3 and segments[1] == "event-source-mappings":
            arn = f"arn:{PARTITION}:lambda:{region}:{account}:event-source-mapping:{segments[2]}"
            pairs = [(action, arn)]
    elif service == "secretsmanager" and "SecretId" in b:
        pairs = [(action, _secret_arn(region, account, str(b["SecretId"])))]
    elif service == "sts" and action == "AssumeRole":
        pairs = [(action, str(b.get("RoleArn", "*")))]
    if not pairs:
        pairs = [(action, "*")]
    return [(f"{service}:{a}", r) for a, r in pairs]


# ---------------------------------------------------------------- the audit
@dataclass
class Audit:
    """Every authorization decision of the stack's life: per principal, what it used."""

    used: dict[str, set[tuple[str, str]]] = field(default_factory=lambda: defaultdict(set))
    denied: list[dict[str, str]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, principal: str, action: str, resource: str, allowed: bool) -> None:
        with self._lock:
            if allowed:
                self.used[principal].add((action, resource))
            elif len(self.denied) < 1000:
                self.denied.append({"principal": principal, "action": action, "resource": resource})

    def report(self) -> dict[str, Any]:
        with self._lock:
            return {
                "used": {
                    principal: sorted([a, r] for a, r in pairs)
                    for principal, pairs in sorted(self.used.items())
                },
                "denied": list(self.denied),
            }


AUDIT = Audit()


def role_of(principal_arn: str) -> str:
    """``arn:aws:sts::1:assumed-role/NAME/session`` -> ``NAME``; a user ARN unchanged."""
    if ":assumed-role/" in principal_arn:
        return principal_arn.split(":assumed-role/", 1)[1].split("/", 1)[0]
    return principal_arn


# ---------------------------------------------------------------- the patch
_PATCHED: list[bool] = []


def _request_body(response: Any) -> Any:
    raw = response.raw_body
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", errors="replace")
    if raw and raw.lstrip().startswith("{"):
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return {}
    # query protocol: the form parameters, first value of each
    return {k: v[0] for k, v in (getattr(response, "querystring", None) or {}).items() if v}


def _speaks_json(response: Any) -> bool:
    headers = {k.lower(): v for k, v in response.headers.items()}
    return (
        "x-amz-target" in headers
        or "json" in headers.get("content-type", "")
        or ("/2015-03-31/" in response.raw_path)
    )


def relax() -> None:
    """Switch authorization off again (moto's default; tests that enforced it restore this)."""
    from moto import settings

    settings.INITIAL_NO_AUTH_ACTION_COUNT = float("inf")


def enforce() -> None:
    """Switch moto's authorization on for every request, judged against real resource ARNs."""
    from moto import settings
    from moto.core.authorization import ActionAuthenticatorMixin
    from moto.core.exceptions import AccessDeniedError, JsonRESTError
    from moto.core.responses import BaseResponse
    from moto.iam.access_control import IAMPolicyStatement, IAMRequest, IAMRequestBase

    settings.INITIAL_NO_AUTH_ACTION_COUNT = 0
    ActionAuthenticatorMixin.request_count = 0
    if _PATCHED:
        return

    original_check = IAMRequestBase.check_action_permitted

    def check_action_permitted(self: Any, resource: str) -> None:
        principal = self._access_key.arn
        try:
            original_check(self, resource)
        except Exception:
            AUDIT.record(principal, self._action, resource, allowed=False)
            raise
        AUDIT.record(principal, self._action, resource, allowed=True)

    def authorize(self: Any, resource: str = "*") -> None:
        if settings.INITIAL_NO_AUTH_ACTION_COUNT != 0:  # switched off again: moto's own way
            self._authenticate_and_authorize_action(IAMRequest, resource)
            return
        parsed = urllib.parse.urlparse(self.uri)
        path = self.raw_path + (f"?{parsed.query}" if parsed.query else "")
        request = IAMRequest(
            account_id=self.current_account,
            method=self.method,
            path=path,
            # the signed payload is the body; moto's data of a GET holds the query parameters,
            # which its own check then signs as a form body (every GET would fail)
            data={} if self.method in ("GET", "HEAD", "DELETE") else self.data,
            body=self.raw_body,
            headers=self.headers,
            action=self._get_action(),
        )
        request.check_signature()
        service = request._action.split(":", 1)[0]
        action = request._action.split(":", 1)[1]
        pairs = authorization_requests(
            service,
            action,
            _request_body(self),
            self.raw_path,
            request._region,
            self.current_account,
        )
        for iam_action, arn in pairs:
            request._action = iam_action
            try:
                request.check_action_permitted(arn)
            except AccessDeniedError:
                if not _speaks_json(self):
                    raise
                # as the JSON services answer (moto's error is XML, which botocore cannot read)
                raise JsonRESTError(
                    "AccessDeniedException",
                    f"User: {request._access_key.arn} is not authorized to perform: "
                    f"{iam_action} on resource: {arn} because no identity-based policy allows "
                    f"the {iam_action} action",
                ) from None

    original_s3 = ActionAuthenticatorMixin._authenticate_and_authorize_s3_action

    def authorize_s3(
        self: Any, bucket_name: str | None = None, key_name: str | None = None
    ) -> None:
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.uri).query)
        if (
            settings.INITIAL_NO_AUTH_ACTION_COUNT != 0
            or "Authorization" in self.headers
            or "X-Amz-Signature" not in query
        ):
            original_s3(self, bucket_name, key_name)
            return
        resource = f"arn:{PARTITION}:s3:::{bucket_name}" + (f"/{key_name}" if key_name else "")
        authorize_presigned(self, {k: v[0] for k, v in query.items()}, resource)

    IAMPolicyStatement._match = staticmethod(iam_match)  # type: ignore[method-assign,assignment]
    IAMRequestBase.check_action_permitted = check_action_permitted  # type: ignore[method-assign]
    BaseResponse._authenticate_and_authorize_normal_action = authorize  # type: ignore[method-assign]
    ActionAuthenticatorMixin._authenticate_and_authorize_s3_action = authorize_s3  # type: ignore[method-assign]
    _PATCHED.append(True)


def authorize_presigned(response: Any, query: dict[str, str], resource: str) -> None:
    """A presigned S3 URL (SigV4 query authentication), judged as S3 does: not expired, signed
    by a key the emulator issued (the signature recomputed with its secret over the request as
    sent: its method, path, query and every header the URL signed, so a PUT of another
    Content-Length or without its If-None-Match is refused), no ``x-amz-*`` header the
    signature does not cover (S3's HeadersNotSigned: a holder cannot add e.g. its own
    encryption), and the signer allowed the action on the object. moto itself reads only an
    ``Authorization`` header."""
    import datetime
    import hmac

    from botocore.auth import S3SigV4QueryAuth
    from botocore.awsrequest import AWSRequest
    from moto.iam.access_control import S3IAMRequest
    from moto.s3.exceptions import S3AccessDeniedError

    try:
        credential = query["X-Amz-Credential"]
        signed_at = query["X-Amz-Date"]
        expires = int(query["X-Amz-Expires"])
        signature = query["X-Amz-Signature"]
        issued = datetime.datetime.strptime(signed_at, "%Y%m%dT%H%M%SZ").replace(
            tzinfo=datetime.UTC
        )
    except (KeyError, ValueError):
        raise S3AccessDeniedError() from None
    if datetime.datetime.now(datetime.UTC) > issued + datetime.timedelta(seconds=expires):
        raise S3AccessDeniedError()  # S3 says "Request has expired" (403)
    sent = {name.lower(): value for name, value in response.headers.items()}
    signed = query.get("X-Amz-SignedHeaders", "host").lower().split(";")
    if any(name not in sent for name in signed if name != "host"):
        raise S3AccessDeniedError()  # a signed header left out: SignatureDoesNotMatch (403)
    if any(name.startswith("x-amz-") and name not in signed for name in sent):
        raise S3AccessDeniedError()  # S3 says HeadersNotSigned (403)
    headers = dict(response.headers)
    headers["Authorization"] = f"AWS4-HMAC-SHA256 Credential={credential}, Signature={signature}"
    if "X-Amz-Security-Token" in query:
        headers["X-Amz-Security-Token"] = query["X-Amz-Security-Token"]
    request = S3IAMRequest(
        account_id=response.current_account,
        method=response.method,
        path=response.raw_path,
        data={},
        body=b"",
        headers=headers,
        action=response._get_action(),
    )
    # the signature, recomputed from the request as sent (its auth parameters aside)
    parts = urllib.parse.urlsplit(response.uri)
    kept = [
        (k, v)
        for k, v in urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
        if not k.startswith("X-Amz-")
    ]
    url = urllib.parse.urlunsplit(
        ("https", headers.get("Host") or parts.netloc, parts.path, urllib.parse.urlencode(kept), "")
    )
    bare = AWSRequest(
        method=response.method,
        url=url,
        headers={name: sent[name] for name in signed if name != "host"},
    )
    bare.context["timestamp"] = signed_at
    signer = S3SigV4QueryAuth(
        request._access_key.create_credentials(), "s3", request._region, expires=expires
    )
    signer._modify_request_before_signing(bare)
    expected = signer.signature(signer.string_to_sign(bare, signer.canonical_request(bare)), bare)
    if not hmac.compare_digest(expected, signature):
        raise S3AccessDeniedError()  # S3 says SignatureDoesNotMatch (403)
    request.check_action_permitted(resource)


# ---------------------------------------------------------------- principals
def _iam(account: str) -> Any:
    from moto.iam.models import iam_backends

    return iam_backends[account][PARTITION]


def create_admin(account: str) -> Credentials:
    """The emulator's own principal: an IAM user allowed everything (created in the backend,
    so it exists before authorization is on)."""
    iam = _iam(account)
    try:
        iam.get_user(ADMIN_USER)
    except Exception:
        iam.create_user(region_name="us-east-1", user_name=ADMIN_USER, path="/", tags=[])
    iam.put_user_policy(ADMIN_USER, "everything", json.dumps(_ALL))
    key = iam.create_access_key(ADMIN_USER)
    return Credentials(key.access_key_id, key.secret_access_key)


def admin_arn(account: str) -> str:
    return f"arn:{PARTITION}:iam::{account}:user/{ADMIN_USER}"


def assume(
    account: str, region: str, role_arn: str, session: str, service: str | None
) -> Credentials:
    """STS credentials of ``role_arn``, as the AWS service ``service`` (e.g. ``lambda``) gets
    them for a function. The role must exist and, when ``service`` is given, trust that
    service's principal, or AWS would refuse to assume it: so does this."""
    from moto.sts.models import sts_backends

    name = role_arn.rsplit("/", 1)[-1]
    role = _iam(account).get_role(name)  # raises NoSuchEntity like IAM
    if service is not None:
        trusted = _trusted_services(role.assume_role_policy_document)
        if f"{service}.amazonaws.com" not in trusted:
            raise PermissionError(
                f"role {name} does not trust {service}.amazonaws.com (trusts {sorted(trusted)}): "
                f"AWS would refuse to run with it"
            )
    assumed = sts_backends[account][PARTITION].assume_role(
        region_name=region,
        role_session_name=session,
        role_arn=role_arn,
        policy="",
        duration=43200,
        external_id="",
    )
    return Credentials(assumed.access_key_id, assumed.secret_access_key, assumed.session_token)


def _trusted_services(document: Any) -> set[str]:
    doc = json.loads(document) if isinstance(document, str) else document
    statements = doc.get("Statement", [])
    out: set[str] = set()
    for st in statements if isinstance(statements, list) else [statements]:
        if st.get("Effect") != "Allow":
            continue
        services = (st.get("Principal") or {}).get("Service", [])
        out.update([services] if isinstance(services, str) else services)
    return out


def _put_role(account: str, name: str, trust_arn: str, policy: dict[str, Any]) -> str:
    iam = _iam(account)
    trust = {
        "Version": "2012-10-17",
        "Statement": [
            {"Effect": "Allow", "Principal": {"AWS": trust_arn}, "Action": "sts:AssumeRole"}
        ],
    }
    try:
        role = iam.get_role(name)
    except Exception:
        role = iam.create_role(
            role_name=name,
            assume_role_policy_document=json.dumps(trust),
            path="/",
            permissions_boundary=None,
            description="swarm local stack",
            tags=[],
            max_session_duration="3600",
        )
    iam.put_role_policy(name, "swarm-local", json.dumps(policy))
    return str(role.arn)


def tenant_policy(region: str, account: str, api_id: str, stage: str) -> dict[str, Any]:
    """What a tenant needs on AWS: ``execute-api:Invoke`` on the API's methods."""
    arn = f"arn:{PARTITION}:execute-api:{region}:{account}:{api_id}/{stage}/*"
    return {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": "execute-api:Invoke", "Resource": arn}],
    }


def ensure_tenant_role(
    account: str, region: str, prefix: str, tenant: str, api_id: str, stage: str
) -> str:
    """The tenant's role ``<prefix><tenant>``, assumable by the emulator's admin user (whose
    keys the local CLI holds), allowed to invoke the API."""
    policy = tenant_policy(region, account, api_id, stage)
    return _put_role(account, f"{prefix}{tenant}", admin_arn(account), policy)


def ensure_operator_role(
    account: str,
    region: str,
    name: str,
    drain_parameter: str,
    api_id: str,
    stage: str,
    journals_table: str | None = None,
) -> str:
    """The operator role ``name`` (``<operator prefix><name>``): flips the drain switch
    (``ssm:PutParameter`` on it), calls the API (its operator routes: the fleet, the drain
    view, re-binding a tenant) and reads the BFCL toolset's journals (``swarm judge``: Query
    of ``journals_table``), nothing else."""
    policy = tenant_policy(region, account, api_id, stage)
    policy["Statement"].append(
        {
            "Effect": "Allow",
            "Action": ["ssm:PutParameter", "ssm:GetParameter"],
            "Resource": _parameter_arn(region, account, drain_parameter),
        }
    )
    if journals_table is not None:
        policy["Statement"].append(
            {
                "Effect": "Allow",
                "Action": ["dynamodb:Query"],
                "Resource": f"arn:aws:dynamodb:{region}:{account}:table/{journals_table}",
            }
        )
    return _put_role(account, name, admin_arn(account), policy)


def role_user(account: str, principal_arn: str) -> str | None:
    """What API Gateway reports as ``identity.user`` for a role session's ARN:
    ``<the role's unique id>:<session name>`` (None for anything else)."""
    parts = principal_arn.split(":assumed-role/", 1)
    if len(parts) != 2 or "/" not in parts[1]:
        return None
    role, session = parts[1].split("/", 1)
    try:
        return f"{_iam(account).get_role(role).id}:{session}"
    except Exception:  # moto's NoSuchEntity: the role is gone
        return None
