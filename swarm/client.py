"""The operator's client: the batch API over HTTP, and the drain switch.

A :class:`Target` says where the control plane is: a deployed stack (API URL and drain parameter
from the stack's outputs, requests signed with SigV4 using the caller's AWS credentials), or the
local stack started by ``swarm local up`` (it writes ``.swarm/local.json`` with the emulator's
own keys). The local stack enforces IAM as AWS does: the client assumes the tenant's role
(``<prefix><tenant>``, ``demo`` by default) through the emulator's STS and signs every API
request with it; the drain switch is flipped as the local operator role.
"""

from __future__ import annotations

import http
import http.client
import json
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from decimal import Decimal
from email.message import Message
from pathlib import Path
from typing import Any

from swarm.api.models import MAX_APPROVALS_PAGE
from swarm.contract import (
    OUTPUT_API_URL,
    OUTPUT_DRAIN_PARAMETER,
    OUTPUT_TOOL_JOURNALS_TABLE,
    drain_parameter_name,
)
from swarm.core.errors import InvalidInput, SwarmError
from swarm.core.files import write_atomically

LOCAL_TARGET_FILE = Path(".swarm") / "local.json"
DEFAULT_LOCAL_TENANT = "demo"
CREDENTIALS_HINT = (
    "refresh or configure your AWS credentials (`aws sso login`, `aws configure`, or "
    "AWS_PROFILE) and try again"
)


def json_body(doc: Any) -> bytes:
    """``doc`` as a request body; a Decimal (a dollar amount) is written as the exact JSON number
    it holds, never through a float."""
    exact: dict[str, str] = {}

    def mark(value: Any) -> Any:
        if isinstance(value, Decimal):
            token = f"\u0000decimal{len(exact)}\u0000"
            exact[token] = format(value, "f")
            return token
        if isinstance(value, dict):
            return {k: mark(v) for k, v in value.items()}
        if isinstance(value, list):
            return [mark(v) for v in value]
        return value

    text = json.dumps(mark(doc))
    for token, number in exact.items():
        text = text.replace(json.dumps(token), number)
    return text.encode()


class ApiError(SwarmError):
    """The API (or the gateway in front of it) answered with an HTTP error status."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        retry_after: int | None,
        advice: str | None = None,
    ) -> None:
        hint = f" (retry after {retry_after}s)" if retry_after is not None else ""
        more = f"; {advice}" if advice else ""
        super().__init__(f"{status} {code}: {message}{hint}{more}")
        self.status = status
        self.code = code
        self.retry_after = retry_after


class Unreachable(SwarmError):
    """The API was not reached (connection refused, no such host): nothing was sent."""


class NoAnswer(SwarmError):
    """The request was sent but no whole answer came back (a read timeout, a dropped
    connection): a request that changes something may have been applied anyway."""

    def __init__(self, detail: str, advice: str) -> None:
        super().__init__(f"{detail}; {advice}")
        self.detail = detail  # what happened, without the advice
        self.advice = advice


def one_line(text: str, limit: int = 300) -> str:
    """``text`` on one line (whitespace runs collapsed), cut to ``limit`` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def aws_failure(error: BaseException) -> str | None:
    """One line for an error of boto3/botocore (missing or expired credentials, no region, an
    endpoint out of reach, a refusal), with what to do; None for any other error."""
    from botocore.exceptions import (
        BotoCoreError,
        ClientError,
        CredentialRetrievalError,
        NoCredentialsError,
        NoRegionError,
        PartialCredentialsError,
        SSOError,
        TokenRetrievalError,
    )

    credentials = (
        NoCredentialsError,
        PartialCredentialsError,
        CredentialRetrievalError,
        TokenRetrievalError,
        SSOError,
    )
    expired = {
        "ExpiredToken",
        "ExpiredTokenException",
        "InvalidClientTokenId",
        "UnrecognizedClientException",
        "RequestExpired",
    }
    text = one_line(str(error))
    if isinstance(error, credentials):
        return f"AWS credentials: {text}; {CREDENTIALS_HINT}"
    if isinstance(error, NoRegionError):
        return f"AWS: {text} (pass --region, or set AWS_REGION)"
    if isinstance(error, ClientError):
        if error.response.get("Error", {}).get("Code") in expired:
            return f"AWS credentials: {text}; {CREDENTIALS_HINT}"
        return f"AWS: {text}"
    if isinstance(error, BotoCoreError):
        return f"AWS: {text}"
    return None


@dataclass(frozen=True)
class Target:
    api_url: str
    region: str
    drain_parameter: str
    aws_endpoint: str | None = None  # the local emulator; None for a real account
    tenant: str | None = None  # local only: whose role the requests are signed with
    #: local only: the emulator's admin keys (generated by the local stack, worthless elsewhere),
    #: used to assume the tenant and operator roles there
    local_credentials: dict[str, str] | None = None
    tenant_prefix: str = "swarm-tenant-"
    #: local only: the operator's role (fleet, drain view, re-binding, the drain switch)
    operator_role: str = "swarm-operator-local"
    #: a deployed stack: the AWS profile whose credentials sign the requests and set the drain
    #: switch (None: the default credentials), e.g. one for a tenant's role, one for an operator's
    profile: str | None = None
    #: the BFCL toolset's journals table, when the stack has it (`swarm judge` reads it)
    tool_journals_table: str | None = None

    @property
    def local(self) -> bool:
        return self.aws_endpoint is not None

    def save(self, path: Path = LOCAL_TARGET_FILE) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, path: Path = LOCAL_TARGET_FILE) -> Target:
        try:
            return cls(**json.loads(path.read_text()))
        except FileNotFoundError:
            raise InvalidInput(
                "target",
                "no control plane to talk to: run `swarm local up`, or pass --stack NAME "
                "(a deployed stack) or --api-url URL",
            ) from None
        except (json.JSONDecodeError, TypeError) as e:
            raise InvalidInput(
                "target", f"{path} is damaged ({e}); run `swarm local up` again"
            ) from None

    @classmethod
    def from_stack(cls, stack: str, region: str | None = None) -> Target:
        """A deployed stack: its outputs name the API URL and the drain parameter."""
        import boto3

        try:
            cfn = boto3.client("cloudformation", region_name=region)
            described = cfn.describe_stacks(StackName=stack)["Stacks"][0]
        except Exception as e:
            reason = aws_failure(e) or one_line(str(e))
            raise InvalidInput("--stack", f"cannot read stack {stack!r}: {reason}") from None
        outputs = {o["OutputKey"]: o["OutputValue"] for o in described.get("Outputs", [])}
        missing = {OUTPUT_API_URL, OUTPUT_DRAIN_PARAMETER} - set(outputs)
        if missing:
            raise InvalidInput("--stack", f"stack {stack!r} has no output {', '.join(missing)}")
        return cls(
            api_url=outputs[OUTPUT_API_URL].rstrip("/"),
            region=cfn.meta.region_name,
            drain_parameter=outputs[OUTPUT_DRAIN_PARAMETER],
            tool_journals_table=outputs.get(OUTPUT_TOOL_JOURNALS_TABLE),
        )


class Client:
    def __init__(self, target: Target, timeout_s: float = 30.0) -> None:
        self.target = target
        self.timeout_s = timeout_s
        self._roles: dict[str, Any] = {}  # local: role name -> botocore credentials

    def _local_aws(self, service: str, credentials: dict[str, str]) -> Any:
        from swarm.local.clients import credentials_of, local_client

        return local_client(
            service,
            self.target.aws_endpoint,
            credentials=credentials_of(credentials),
            region=self.target.region,
        )

    def _local_role(self, role: str) -> Any:
        """Credentials of a role of the local stack, assumed with the emulator's own keys (never
        with the caller's real ones: they must not reach an emulator)."""
        from botocore.credentials import Credentials
        from botocore.exceptions import BotoCoreError, ClientError

        if role in self._roles:
            return self._roles[role]
        if not self.target.local_credentials:
            raise SwarmError(
                "this local target has no emulator credentials: run `swarm local up` again"
            )
        admin = self.target.local_credentials
        try:
            arn = self._local_aws("iam", admin).get_role(RoleName=role)["Role"]["Arn"]
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") == "NoSuchEntity":
                tenant = role.removeprefix(self.target.tenant_prefix)
                raise InvalidInput(
                    "--tenant",
                    f"the local stack has no role {role}: create the tenant with "
                    f"`swarm local tenant {tenant}`",
                ) from None
            raise SwarmError(f"cannot read role {role} in the local stack: {e}") from None
        except BotoCoreError as e:
            where = self.target.aws_endpoint
            raise SwarmError(
                f"cannot reach the local stack at {where}: {one_line(str(e))}; is it up? "
                "start it with `swarm local up`"
            ) from None
        try:
            doc = self._local_aws("sts", admin).assume_role(
                RoleArn=arn, RoleSessionName="swarm-cli"
            )
        except (BotoCoreError, ClientError) as e:
            raise SwarmError(f"cannot assume {role} in the local stack: {e}") from None
        c = doc["Credentials"]
        credentials = Credentials(c["AccessKeyId"], c["SecretAccessKey"], c["SessionToken"])
        self._roles[role] = credentials
        return credentials

    def _aws(self, service: str) -> Any:
        import boto3

        if self.target.local:  # the local operator's role: what `swarm drain on|off` needs
            c = self._local_role(self.target.operator_role)
            return self._local_aws(
                service,
                {
                    "aws_access_key_id": c.access_key,
                    "aws_secret_access_key": c.secret_key,
                    "aws_session_token": c.token,
                },
            )
        return boto3.Session(profile_name=self.target.profile).client(
            service, region_name=self.target.region
        )

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        headers: dict[str, str] | None = None,
        *,
        check: str | None = None,
        operator: bool = False,
    ) -> tuple[int, Any]:
        """Send one request; return (status, the JSON answer). ``operator``: an operator's route
        (locally signed as the operator role; on AWS your credentials must be one). Every
        failure is a SwarmError
        of one line saying what to do: :class:`Unreachable`, :class:`NoAnswer` (``check`` says
        how to see whether a request that changes something was applied), :class:`ApiError`
        (an HTTP error status), or a SwarmError for a 2xx answer that is not JSON."""
        url = self.target.api_url.rstrip("/") + path
        data = None if body is None else json_body(body)
        hdrs = {"Content-Type": "application/json", "Accept": "application/json", **(headers or {})}
        hdrs = self.sign(method, url, data, hdrs, operator=operator)  # SigV4, here and on AWS
        req = urllib.request.Request(url, data=data, method=method, headers=hdrs)
        status, raw, answer_headers = self._exchange(req, method, url, check)
        if status >= 400:
            raise self._api_error(url, status, raw, answer_headers)
        try:
            return status, json.loads(raw or b"null")
        except ValueError:  # not JSON, or not UTF-8 text
            raise SwarmError(f"{url} did not answer with JSON: is it the swarm API?") from None

    def _exchange(
        self, req: urllib.request.Request, method: str, url: str, check: str | None
    ) -> tuple[int, bytes, Message]:
        """The status, body and headers of the answer, an HTTP error status included."""
        try:
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                    return resp.status, resp.read(), resp.headers
            except urllib.error.HTTPError as e:
                try:
                    return e.code, e.read(), e.headers
                finally:
                    e.close()
        except urllib.error.URLError as e:  # raised before the request was sent, mostly
            raise self._transport_error(method, url, e.reason, check) from None
        except (OSError, http.client.HTTPException) as e:  # timed out or closed mid-answer
            raise self._transport_error(method, url, e, check) from None

    def _transport_error(
        self, method: str, url: str, reason: object, check: str | None
    ) -> SwarmError:
        sent = isinstance(
            reason,
            TimeoutError | ConnectionResetError | BrokenPipeError | http.client.HTTPException,
        )
        if not sent:  # refused, no such host, no route: nothing reached the API
            if self.target.local:
                advice = "is the local stack up? start it with `swarm local up`"
            else:
                advice = (
                    "check that the stack is deployed and its API URL is right (--stack, "
                    "--api-url, --region), and your network"
                )
            return Unreachable(f"cannot reach {url}: {one_line(str(reason))}; {advice}")
        if isinstance(reason, TimeoutError):
            detail = f"no answer from {url}: timed out after {self.timeout_s:g}s"
        else:
            detail = f"no answer from {url}: {one_line(str(reason)) or type(reason).__name__}"
        if method == "GET":
            advice = "nothing was changed; try again (the service may be overloaded)"
        else:
            advice = "the request may still have been applied: " + (
                check or "check its effect before sending it again"
            )
        return NoAnswer(detail, advice)

    def _api_error(self, url: str, status: int, raw: bytes, headers: Message) -> ApiError:
        retry = headers.get("Retry-After")
        retry_after = int(retry) if retry and retry.isdigit() else None
        try:
            doc = json.loads(raw)
        except ValueError:
            doc = None
        try:
            phrase = http.HTTPStatus(status).phrase.lower().replace(" ", "_")
        except ValueError:
            phrase = "http_error"
        if isinstance(doc, dict) and isinstance(doc.get("error"), str):  # the API's own answer
            code, message, ours = doc["error"], one_line(str(doc.get("message", ""))), True
        elif isinstance(doc, dict) and isinstance(doc.get("message"), str):  # API Gateway's
            code, message, ours = phrase, one_line(doc["message"]), False
        else:
            snippet = one_line(raw.decode(errors="replace"), 80)
            code, ours = phrase, False
            message = f"{url} answered with a body that is not the API's JSON ({snippet!r})"
        advice = None
        if status >= 500 and retry_after is None:
            advice = (
                f"the service failed (HTTP {status}), not your request: try again later; if it "
                "persists, check the stack's logs"
            )
        elif status in (401, 403) and not ours and not self.target.local:
            advice = f"the gateway refused the request's signature: {CREDENTIALS_HINT}"
        elif not ours:
            advice = f"is {self.target.api_url} the swarm API?"
        return ApiError(status, code, message, retry_after, advice)

    def sign(
        self,
        method: str,
        url: str,
        data: bytes | None,
        headers: dict[str, str],
        *,
        operator: bool = False,
    ) -> dict[str, str]:
        """``headers`` with the SigV4 signature of this request (also for another HTTP client:
        the e2e tier's fuzzer sends schemathesis' requests with it)."""
        import boto3
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore.exceptions import BotoCoreError

        request = AWSRequest(method=method, url=url, data=data, headers=headers)
        if self.target.local:
            tenant = self.target.tenant or DEFAULT_LOCAL_TENANT
            role = self.target.operator_role if operator else f"{self.target.tenant_prefix}{tenant}"
            credentials = self._local_role(role)
            SigV4Auth(credentials, "execute-api", self.target.region).add_auth(request)
            return dict(request.headers.items())
        try:  # a profile that does not exist, an SSO token or a role session that expired...
            credentials = boto3.Session(profile_name=self.target.profile).get_credentials()
            if credentials is None:
                raise SwarmError(
                    f"no AWS credentials to sign the request with (SigV4): {CREDENTIALS_HINT}"
                )
            SigV4Auth(credentials, "execute-api", self.target.region).add_auth(request)
        except BotoCoreError as e:
            raise SwarmError(aws_failure(e) or str(e)) from None
        return dict(request.headers.items())

    # -- the API
    def submit(
        self,
        body: dict[str, Any],
        idempotency_key: str | None = None,
        *,
        retries: int = 0,
        backoff_s: float = 1.0,
        on_retry: Callable[[NoAnswer, int, float], None] | None = None,
    ) -> Any:
        """``POST /batches``. With an ``idempotency_key``, a submit that got no answer (timed
        out, connection dropped) is sent again with the same key up to ``retries`` times,
        waiting ``backoff_s``, then twice as long each time (``on_retry(error, retry, wait)``
        is called first): the API answers the same key and body with the same batch, so it is
        created once."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        if idempotency_key:
            check = (
                f"submit it again with --idempotency-key {idempotency_key} (the same key and "
                "body are the same batch, created once)"
            )
        else:
            check = "a submit repeated without an Idempotency-Key makes a second batch"
        attempt = 0
        while True:
            try:
                return self.request("POST", "/batches", body, headers, check=check)[1]
            except NoAnswer as e:
                if not idempotency_key or attempt >= retries:
                    if attempt:
                        raise NoAnswer(f"{e.detail} ({attempt + 1} attempts)", e.advice) from None
                    raise
                attempt += 1
                wait = backoff_s * 2 ** (attempt - 1)
                if on_retry is not None:
                    on_retry(e, attempt, wait)
                time.sleep(wait)

    def status(self, batch_id: str) -> Any:
        return self.request("GET", f"/batches/{_segment(batch_id)}")[1]

    def results(
        self, batch_id: str, *, state: str | None, limit: int, next_token: str | None
    ) -> Any:
        """One page of ``GET /batches/{id}/results``."""
        query = {"state": state, "limit": str(limit), "next_token": next_token}
        given = urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})
        return self.request("GET", f"/batches/{_segment(batch_id)}/results?{given}")[1]

    def transcript(self, batch_id: str, unit_id: str) -> dict[str, Any]:
        """An agent unit's whole transcript: ``GET /batches/{id}/units/{unit}/transcript``, its
        parts joined (``next_turn``)."""
        path = f"/batches/{_segment(batch_id)}/units/{_segment(unit_id)}/transcript"
        doc: dict[str, Any] = self.request("GET", path)[1]
        while doc.get("next_turn") is not None:
            more = self.request("GET", f"{path}?from_turn={int(doc.pop('next_turn'))}")[1]
            doc["turns"] += more["turns"]
            if "next_turn" in more:
                doc["next_turn"] = more["next_turn"]
        return doc

    def tool_journal(self, batch_id: str, unit_id: str) -> list[dict[str, Any]]:
        """A BFCL unit's tool journal (every call its backends ran, in order), read from the
        stack's journals table with the operator's credentials (locally, the operator role's)."""
        from swarm.adapters.tool_journals import DynamoDBJournals

        table = self.target.tool_journals_table
        if not table:
            raise SwarmError(
                "this stack has no BFCL journals table (output "
                f"{OUTPUT_TOOL_JOURNALS_TABLE}): register the BFCL toolset in cdk.json "
                '(tools.bfcl: {"source": "bfcl", "toolset": true}) and deploy'
            )
        try:
            return DynamoDBJournals(table, self._aws("dynamodb")).read(f"{batch_id}/{unit_id}")
        except Exception as e:
            reason = aws_failure(e)
            if reason is None:
                raise
            raise SwarmError(f"reading the journal of {unit_id}: {reason}") from None

    def fetch(self, url: str) -> bytes:
        """A presigned URL's object (a results file, or an answer too long for a page)."""
        req = urllib.request.Request(url, method="GET")
        status, raw, _ = self._exchange(req, "GET", url.split("?", 1)[0], None)
        if status >= 400:
            raise SwarmError(
                f"the download link answered HTTP {status} (it expires quickly): run the "
                "command again for a fresh one"
            )
        return raw

    def approvals(self, batch_id: str, *, operator: bool = False) -> dict[str, Any]:
        """Every tool call of the batch that waits for a decision: ``GET
        /batches/{id}/approvals``, page after page (:meth:`approvals_page`), joined into one
        answer (its ``next_token`` null)."""
        doc = self.approvals_page(batch_id, operator=operator)
        waiting: list[dict[str, Any]] = list(doc["waiting"])
        while doc.get("next_token") is not None:
            doc = self.approvals_page(
                batch_id, operator=operator, limit=MAX_APPROVALS_PAGE, next_token=doc["next_token"]
            )
            waiting.extend(doc["waiting"])
        return {**doc, "waiting": waiting, "next_token": None}

    def approvals_page(
        self,
        batch_id: str,
        *,
        operator: bool = False,
        limit: int = MAX_APPROVALS_PAGE,
        next_token: str | None = None,
    ) -> dict[str, Any]:
        """One page of ``GET /batches/{id}/approvals``: the waiting calls of up to ``limit``
        parked units, and the ``next_token`` of the next page (null on the last)."""
        query = {"limit": str(limit), "next_token": next_token}
        given = urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})
        path = f"/batches/{_segment(batch_id)}/approvals?{given}"
        doc: dict[str, Any] = self.request("GET", path, operator=operator)[1]
        return doc

    def decide(
        self,
        batch_id: str,
        unit_id: str,
        tool_use_id: str,
        decision: str,
        reason: str = "",
        *,
        operator: bool = False,
    ) -> dict[str, Any]:
        """Approve or reject one waiting tool call (a repeat of the same decision answers the
        recorded one): ``POST /batches/{id}/units/{unit}/approvals/{toolUseId}``."""
        path = (
            f"/batches/{_segment(batch_id)}/units/{_segment(unit_id)}/approvals/"
            f"{_segment(tool_use_id)}"
        )
        check = f"see `swarm approvals {batch_id}`: a repeat of the same decision is harmless"
        body = {"decision": decision, "reason": reason}
        doc: dict[str, Any] = self.request("POST", path, body, check=check, operator=operator)[1]
        return doc

    def resume(self, batch_id: str, top_up: int | None, top_up_usd: Decimal | None = None) -> Any:
        """Top up a batch's budget: ``top_up`` tokens, or ``top_up_usd`` dollars for a budget
        in dollars (an exact Decimal, sent as a JSON number)."""
        path = f"/batches/{_segment(batch_id)}/resume"
        check = f"see `swarm status {batch_id}` before resuming again (each resume tops up)"
        body: dict[str, Any] = {"top_up": top_up} if top_up_usd is None else {}
        if top_up_usd is not None:
            body["top_up_usd"] = top_up_usd
        return self.request("POST", path, body, check=check)[1]

    def upload(self, data: bytes) -> str:
        """Upload a manifest (``data``: a JSON array of units) through ``POST /uploads``: ask
        for a URL for its size, PUT it there with the method and headers the answer names, and
        return the key to submit as ``manifest.key``. Needs no rights on the bucket."""
        doc = self.request("POST", "/uploads", {"size_bytes": len(data)})[1]
        method, url = str(doc["method"]), str(doc["url"])
        headers = {str(k): str(v) for k, v in doc["headers"].items()}
        req = urllib.request.Request(url, data=data, method=method, headers=headers)
        where = url.split("?", 1)[0]  # the signature stays out of messages
        check = "run the command again: it uploads to a new key"
        status, raw, _ = self._exchange(req, method, where, check)
        if status >= 400:
            code = re.search(rb"<Code>([^<]{1,64})</Code>", raw)
            said = f" ({code.group(1).decode(errors='replace')})" if code else ""
            raise SwarmError(
                f"the upload to {where} was refused: HTTP {status}{said}; run the command again "
                "for a new upload URL (each one lasts minutes and writes once)"
            )
        return str(doc["key"])

    def fleet(self) -> Any:
        return self.request("GET", "/fleet", operator=True)[1]

    def drain_status(self) -> Any:
        return self.request("GET", "/drain", operator=True)[1]

    def rebind(self, tenant: str) -> Any:
        """Forget the role ``tenant`` is bound to (an operator's action)."""
        path = f"/tenants/{urllib.parse.quote(tenant, safe='')}/rebind"
        return self.request("POST", path, operator=True)[1]

    # -- the drain switch (an operator action: it needs SSM rights, not a tenant role)
    def set_drain(self, on: bool) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            ssm = self._aws("ssm")  # locally: the operator's role, assumed first
            ssm.put_parameter(
                Name=self.target.drain_parameter,
                Value="on" if on else "off",
                Type="String",
                Overwrite=True,
            )
        except (BotoCoreError, ClientError) as e:  # unreachable, denied, no credentials
            reason = one_line(str(e)) if self.target.local else aws_failure(e)
            raise SwarmError(
                f"cannot set the drain switch {self.target.drain_parameter}: {reason}"
            ) from None
        except SwarmError as e:  # locally: the emulator is out of reach, or has no such role
            raise SwarmError(
                f"cannot set the drain switch {self.target.drain_parameter}: {e}"
            ) from None


def _segment(batch_id: str) -> str:
    """A batch id as one URL path segment: a space, '/' or '?' in it must not break the URL."""
    return urllib.parse.quote(batch_id, safe="")


def target_from_args(
    api_url: str | None, stack: str | None, region: str | None, tenant: str | None
) -> Target:
    if api_url and stack:
        raise InvalidInput("--api-url", "give --api-url or --stack, not both")
    if stack:
        return Target.from_stack(stack, region)
    if api_url:
        return Target(
            api_url=api_url.rstrip("/"),
            region=region or os.environ.get("AWS_REGION", "us-east-1"),
            drain_parameter=os.environ.get("SWARM_DRAIN_PARAMETER", drain_parameter_name("dev")),
        )
    target = Target.load()
    if tenant and target.local:
        return Target(**{**asdict(target), "tenant": tenant})
    return target
