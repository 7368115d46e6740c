"""The operator's client: the batch API over HTTP, and the drain switch.

A :class:`Target` says where the control plane is: a deployed stack (API URL and drain parameter
from the stack's outputs, requests signed with SigV4 using the caller's AWS credentials), or the
local stack started by ``swarm local up`` (it writes ``.swarm/local.json``; requests go to its
localhost endpoint, which takes the tenant from the ``X-Swarm-Tenant`` header since there is no
IAM there).
"""

from __future__ import annotations

import http.client
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from swarm.core.errors import InvalidInput, SwarmError

LOCAL_TARGET_FILE = Path(".swarm") / "local.json"
TENANT_HEADER = "X-Swarm-Tenant"


class ApiError(SwarmError):
    def __init__(self, status: int, code: str, message: str, retry_after: int | None) -> None:
        hint = f" (retry after {retry_after}s)" if retry_after is not None else ""
        super().__init__(f"{status} {code}: {message}{hint}")
        self.status = status
        self.code = code
        self.retry_after = retry_after


@dataclass(frozen=True)
class Target:
    api_url: str
    region: str
    drain_parameter: str
    aws_endpoint: str | None = None  # the local emulator; None for a real account
    tenant: str | None = None  # local only: who the local API treats you as
    sign: bool = True

    @property
    def local(self) -> bool:
        return self.aws_endpoint is not None

    def save(self, path: Path = LOCAL_TARGET_FILE) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")

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

        cfn = boto3.client("cloudformation", region_name=region)
        try:
            described = cfn.describe_stacks(StackName=stack)["Stacks"][0]
        except Exception as e:
            raise InvalidInput("--stack", f"cannot read stack {stack!r}: {e}") from None
        outputs = {o["OutputKey"]: o["OutputValue"] for o in described.get("Outputs", [])}
        missing = {"ApiUrl", "DrainParameterName"} - set(outputs)
        if missing:
            raise InvalidInput("--stack", f"stack {stack!r} has no output {', '.join(missing)}")
        return cls(
            api_url=outputs["ApiUrl"].rstrip("/"),
            region=cfn.meta.region_name,
            drain_parameter=outputs["DrainParameterName"],
        )


class Client:
    def __init__(self, target: Target, timeout_s: float = 30.0) -> None:
        self.target = target
        self.timeout_s = timeout_s

    def _aws(self, service: str) -> Any:
        import boto3

        if self.target.local:  # the emulator takes any credentials; never send real ones there
            return boto3.client(
                service,
                region_name=self.target.region,
                endpoint_url=self.target.aws_endpoint,
                aws_access_key_id="local",
                aws_secret_access_key="local",
            )
        return boto3.client(service, region_name=self.target.region)

    def request(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        url = self.target.api_url.rstrip("/") + path
        data = None if body is None else json.dumps(body).encode()
        hdrs = {"Content-Type": "application/json", "Accept": "application/json", **(headers or {})}
        if self.target.tenant and self.target.local:
            hdrs[TENANT_HEADER] = self.target.tenant
        if self.target.sign and not self.target.local:
            hdrs = self._signed(method, url, data, hdrs)
        req = urllib.request.Request(url, data=data, method=method, headers=hdrs)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                doc = json.loads(raw)
            except json.JSONDecodeError:
                doc = {"error": "http_error", "message": raw.decode(errors="replace")[:500]}
            retry = e.headers.get("Retry-After")
            raise ApiError(
                e.code,
                str(doc.get("error", "error")),
                str(doc.get("message", "")),
                int(retry) if retry and retry.isdigit() else None,
            ) from None
        except urllib.error.URLError as e:
            raise SwarmError(f"cannot reach {url}: {e.reason}") from None
        except json.JSONDecodeError:
            raise SwarmError(f"{url} did not answer with JSON: is it the swarm API?") from None
        except (OSError, http.client.HTTPException) as e:  # closed or timed out mid-response
            raise SwarmError(f"no answer from {url}: {e or type(e).__name__}") from None

    def _signed(
        self, method: str, url: str, data: bytes | None, headers: dict[str, str]
    ) -> dict[str, str]:
        import boto3
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest

        credentials = boto3.Session().get_credentials()
        if credentials is None:
            raise SwarmError("no AWS credentials to sign the request with (SigV4)")
        request = AWSRequest(method=method, url=url, data=data, headers=headers)
        SigV4Auth(credentials, "execute-api", self.target.region).add_auth(request)
        return dict(request.headers.items())

    # -- the API
    def submit(self, body: dict[str, Any], idempotency_key: str | None = None) -> Any:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        return self.request("POST", "/batches", body, headers)[1]

    def status(self, batch_id: str) -> Any:
        return self.request("GET", f"/batches/{_segment(batch_id)}")[1]

    def resume(self, batch_id: str, top_up: int) -> Any:
        path = f"/batches/{_segment(batch_id)}/resume"
        return self.request("POST", path, {"top_up": top_up})[1]

    def fleet(self) -> Any:
        return self.request("GET", "/fleet")[1]

    def drain_status(self) -> Any:
        return self.request("GET", "/drain")[1]

    # -- the drain switch (an operator action: it needs SSM rights, not a tenant role)
    def set_drain(self, on: bool) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self._aws("ssm").put_parameter(
                Name=self.target.drain_parameter,
                Value="on" if on else "off",
                Type="String",
                Overwrite=True,
            )
        except (BotoCoreError, ClientError) as e:  # unreachable, no credentials, access denied
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
            drain_parameter=os.environ.get("SWARM_DRAIN_PARAMETER", "/swarm/dev/drain"),
        )
    target = Target.load()
    if tenant and target.local:
        return Target(**{**asdict(target), "tenant": tenant})
    return target
