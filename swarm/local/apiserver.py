"""The batch API on localhost: HTTP requests become API Gateway proxy events for the API function.

moto creates the RestApi but cannot invoke an AWS_PROXY integration, so this server plays API
Gateway: it builds the REST proxy event (payload 1.0) for the request, invokes the deployed API
function through moto's Lambda API, and writes the function's status, headers and body back.

Identity, as API Gateway's ``AWS_IAM`` authorization does it: the request must be SigV4-signed
(service ``execute-api``) with credentials the emulator's IAM knows (a tenant's or operator's
assumed role, see :mod:`swarm.local.patches.iam`); the signature is verified, the caller must be
allowed ``execute-api:Invoke`` on the method's ARN (``arn:aws:execute-api:<region>:<account>:<api>/
<stage>/<METHOD>/<path>``) by its own policies, and its ARN goes into the event's
``requestContext.identity.userArn``, where the handler's tenant logic reads it. An unsigned,
wrongly signed, expired or unauthorized request is a 403 with API Gateway's message, before the
function runs.

API Gateway's own errors (403s, a 413 for a body past its 10 MB or an event Lambda refuses past
its 6 MiB payload, a 502 for a function error) are rendered by the API's gateway responses
(:mod:`swarm.api.gateway`): the local stack reads them from its synthesized template.

``/_local/...`` is the emulator's own control surface (not part of the API, never deployed): the
simulated model plane's counters, a quota storm, injected worker deaths, the pollers' stats.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
import time
import urllib.parse
from collections.abc import Callable
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from swarm.api.gateway import GatewayError, GatewayResponses
from swarm.local import billing
from swarm.local.events import proxy_event
from swarm.local.patches import iam
from swarm.local.watchdog import Watchdog

log = logging.getLogger("swarm.local")

MAX_BODY_BYTES = 10 * 1024 * 1024  # API Gateway's payload limit
SIGNATURE_MAX_SKEW_S = 300  # API Gateway refuses a signature more than 5 minutes off


def gateway_error(
    response_type: str,
    message: str,
    responses: GatewayResponses | None = None,
    status: int | None = None,
) -> tuple[int, dict[str, Any]]:
    """An error API Gateway answers itself, rendered by the API's gateway responses (by default
    the ones infra/api.py deploys; the local stack's are read from its synthesized template), as
    (status, body): a client reads the same ``Error`` body as from the function."""
    status, _, body = (responses or GatewayResponses.of()).answer(
        GatewayError(response_type, message, status=status)
    )
    doc: dict[str, Any] = json.loads(body)
    return status, doc


def _error_code(error: Exception) -> str:
    """A botocore ClientError's code ("" for any other exception)."""
    response = getattr(error, "response", None)
    return str(response.get("Error", {}).get("Code", "")) if isinstance(response, dict) else ""


AdminHandler = Callable[[str, str, Any, dict[str, str]], tuple[int, Any]]


def route(method: str, path: str) -> str:
    """A request's resource, as the bill names it: ``GET /batches/{id}/results``."""
    segments = [s for s in path.split("/") if s]
    if len(segments) > 1:
        segments[1] = "{id}"
    return f"{method.upper()} /{'/'.join(segments)}"


class LocalApi:
    def __init__(
        self,
        clients: Any,
        function_arn: str,
        account: str,
        region: str,
        api_id: str,
        admin: AdminHandler,
        port: int = 0,
        stage: str = "local",
        responses: GatewayResponses | None = None,
    ) -> None:
        self.clients = clients
        self.function_arn = function_arn
        self.account = account
        self.region = region
        self.api_id = api_id
        self.admin = admin
        self.stage = stage
        self.responses = responses or GatewayResponses.of()
        #: names a stall of the process in its log (a request in flight too long, and why)
        self.watchdog = Watchdog()
        self.server = ThreadingHTTPServer(("127.0.0.1", port), self._handler_class())
        self.server.daemon_threads = True
        self.thread = threading.Thread(
            target=self.server.serve_forever, name="local-api", daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> None:
        self.watchdog.start()
        self.thread.start()

    def stop(self) -> None:
        self.watchdog.stop()
        self.server.shutdown()
        self.server.server_close()

    def method_arn(self, method: str, path: str) -> str:
        return (
            f"arn:aws:execute-api:{self.region}:{self.account}:{self.api_id}/{self.stage}/"
            f"{method.upper()}/{path.lstrip('/')}"
        )

    def refuse(
        self, response_type: str, message: str, status: int = 403
    ) -> tuple[int, dict[str, Any]]:
        """API Gateway's own error (an authorization refusal: 403), as (status, Error body)."""
        return gateway_error(response_type, message, self.responses, status)

    def gateway_answer(
        self, response_type: str, message: str, status: int | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        """API Gateway's own error as its gateway responses render it: status, headers, body."""
        return self.responses.answer(GatewayError(response_type, message, status=status))

    def authenticate(
        self, method: str, path: str, raw_query: str, headers: dict[str, str], body: bytes
    ) -> str | tuple[int, dict[str, Any]]:
        """The caller's ARN, or API Gateway's 403 (status, body) for this request."""
        from moto.iam.access_control import IAMRequest
        from requests.structures import CaseInsensitiveDict

        named = {k.lower(): v for k, v in headers.items()}
        authorization = named.get("authorization", "")
        if not authorization.startswith("AWS4-HMAC-SHA256 "):
            missing = "Missing Authentication Token"
            return self.refuse("MISSING_AUTHENTICATION_TOKEN", missing)
        try:
            signed_at = datetime.strptime(named.get("x-amz-date", ""), "%Y%m%dT%H%M%SZ")
        except ValueError:
            return self.refuse(
                "INVALID_SIGNATURE", "Authorization header requires existence of a valid X-Amz-Date"
            )
        skew = abs(time.time() - signed_at.replace(tzinfo=UTC).timestamp())
        if skew > SIGNATURE_MAX_SKEW_S:
            return self.refuse(
                "INVALID_SIGNATURE", "Signature expired: the request was signed too long ago"
            )
        if "/execute-api/aws4_request" not in authorization:
            scope = "Credential should be scoped to correct service: 'execute-api'."
            return self.refuse("INVALID_SIGNATURE", scope)
        try:
            request = IAMRequest(
                account_id=self.account,
                method=method,
                path=path + (f"?{raw_query}" if raw_query else ""),
                data={},
                body=body,
                headers=CaseInsensitiveDict(headers),  # type: ignore[arg-type]  # urllib sends "X-amz-date"
                action="Invoke",
            )
            request.check_signature()
            principal = str(request._access_key.arn)
        except Exception as e:  # moto's InvalidClientTokenId / SignatureDoesNotMatch
            log.info("local API: signature refused: %r", e)
            if "Signature" in type(e).__name__:
                message = (
                    "The request signature we calculated does not match the signature you "
                    "provided. Check your AWS Secret Access Key and signing method."
                )
                return self.refuse("INVALID_SIGNATURE", message)
            # an access key IAM does not know: API Gateway's 403 with this message (its
            # response type here is the emulator's choice: the DEFAULT_4XX one)
            message = "The security token included in the request is invalid."
            return self.refuse("DEFAULT_4XX", message)
        resource = self.method_arn(method, path)
        try:
            request.check_action_permitted(resource)
        except Exception:
            message = (
                f"User: {principal} is not authorized to perform: execute-api:Invoke on "
                f"resource: {resource}"
            )
            return self.refuse("ACCESS_DENIED", message)
        return principal

    def invoke(
        self,
        method: str,
        path: str,
        query: dict[str, str],
        headers: dict[str, str],
        body: str,
        raw_query: str = "",
        raw_body: bytes | None = None,
    ) -> tuple[int, dict[str, str], bytes]:
        signed = body.encode() if raw_body is None else raw_body
        caller = self.authenticate(method, path, raw_query, headers, signed)
        if isinstance(caller, tuple):
            status, doc = caller
            return status, {"Content-Type": "application/json"}, json.dumps(doc).encode()
        # API Gateway bills the requests it serves (not those its authorization refuses)
        billing.METER.add("apigateway", route(method, path), "client", billing.APIGW_REST)
        event = proxy_event(
            method,
            path,
            body=body or None,
            headers=headers,
            user_arn=caller,
            user=iam.role_user(self.account, caller),
            stage=self.stage,
            query=query or None,
        )
        request = json.dumps(event, ensure_ascii=False).encode()
        try:
            response = self.clients("lambda-invoke").invoke(
                FunctionName=self.function_arn, Payload=request
            )
        except Exception as e:
            if _error_code(e) != "RequestEntityTooLargeException":
                raise
            # the event (the body JSON-escaped, the headers twice, the request context) is
            # past Lambda's 6 MiB request payload though the body is within API Gateway's 10 MB:
            # Lambda refuses the invocation and API Gateway answers its REQUEST_TOO_LARGE 413
            log.info("local API: Lambda refused a %d-byte event: %s", len(request), e)
            return self.gateway_answer("REQUEST_TOO_LARGE", "Request Too Long")
        payload = response["Payload"].read()
        if response.get("FunctionError"):
            log.error("API function error: %s", payload[:2000])
            return self.gateway_answer("DEFAULT_5XX", "Internal server error", status=502)
        result = json.loads(payload)
        out_headers = {k: str(v) for k, v in (result.get("headers") or {}).items()}
        for name, values in (result.get("multiValueHeaders") or {}).items():
            if values:
                out_headers.setdefault(name, str(values[0]))
        raw = result.get("body") or ""
        data = base64.b64decode(raw) if result.get("isBase64Encoded") else raw.encode()
        return int(result.get("statusCode", 200)), out_headers, data

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("%s " + format, self.address_string(), *args)

            def _respond(self, status: int, headers: dict[str, str], data: bytes) -> None:
                self.send_response(status)
                for name, value in headers.items():
                    if name.lower() not in ("content-length", "connection"):
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _json(self, status: int, doc: Any) -> None:
                self._respond(
                    status, {"Content-Type": "application/json"}, json.dumps(doc).encode()
                )

            def _handle(self) -> None:
                started = time.monotonic()
                parsed = urllib.parse.urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                if length > MAX_BODY_BYTES:
                    self._respond(*api.gateway_answer("REQUEST_TOO_LARGE", "Request Too Long"))
                    self.close_connection = True  # the body is not read
                    return
                raw = self.rfile.read(length) if length else b""
                with api.watchdog.request(f"{self.command} {parsed.path}"):
                    try:
                        self._answer(parsed, raw)
                    except Exception as e:
                        log.exception("local API failure")
                        self._json(502, {"error": "internal", "message": str(e)})
                log.debug("%s %s in %.3fs", self.command, self.path, time.monotonic() - started)

            def _answer(self, parsed: urllib.parse.SplitResult, raw: bytes) -> None:
                # a body that is not UTF-8 reaches the function as text with U+FFFD for the
                # bytes that do not decode (the function refuses what does not parse); the
                # signature is checked on the bytes sent
                body = raw.decode(errors="replace")
                query = dict(urllib.parse.parse_qsl(parsed.query))
                if parsed.path.startswith("/_local/"):
                    doc = json.loads(body) if body else None
                    status, out = api.admin(self.command, parsed.path, doc, query)
                    self._json(status, out)
                    return
                headers = {k: v for k, v in self.headers.items()}
                status, hdrs, data = api.invoke(
                    self.command, parsed.path, query, headers, body, parsed.query, raw
                )
                self._respond(status, hdrs, data)

            do_GET = _handle
            do_POST = _handle
            do_PUT = _handle
            do_DELETE = _handle
            do_PATCH = _handle

        return Handler
