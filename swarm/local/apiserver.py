"""The batch API on localhost: HTTP requests become API Gateway proxy events for the API function.

moto creates the RestApi but cannot invoke an AWS_PROXY integration, so this server plays API
Gateway: it builds the REST proxy event (payload 1.0) for the request, invokes the deployed API
function through moto's Lambda API, and writes the function's status, headers and body back.

Identity. There is no IAM here: the caller names its tenant in the ``X-Swarm-Tenant`` header
(default ``demo``) and the server puts ``arn:aws:sts::<account>:assumed-role/<prefix><tenant>/
local`` in the event's ``requestContext.identity.userArn``, which is what API Gateway does for a
SigV4-signed caller, so the handler's tenant logic runs unchanged.

``/_local/...`` is the emulator's own control surface (not part of the API, never deployed): the
simulated model plane's counters, a quota storm, injected worker deaths, the pollers' stats.
"""

from __future__ import annotations

import base64
import json
import logging
import re
import threading
import time
import urllib.parse
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from swarm.local.events import proxy_event

log = logging.getLogger("swarm.local")

TENANT_HEADER = "X-Swarm-Tenant"
DEFAULT_TENANT = "demo"
MAX_BODY_BYTES = 10 * 1024 * 1024  # API Gateway's payload limit
_TENANT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")

AdminHandler = Callable[[str, str, Any, dict[str, str]], tuple[int, Any]]


class LocalApi:
    def __init__(
        self,
        clients: Any,
        function_arn: str,
        account: str,
        tenant_prefix: str,
        admin: AdminHandler,
        port: int = 0,
        stage: str = "local",
    ) -> None:
        self.clients = clients
        self.function_arn = function_arn
        self.account = account
        self.tenant_prefix = tenant_prefix
        self.admin = admin
        self.stage = stage
        self.server = ThreadingHTTPServer(("127.0.0.1", port), self._handler_class())
        self.server.daemon_threads = True
        self.thread = threading.Thread(
            target=self.server.serve_forever, name="local-api", daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def user_arn(self, tenant: str) -> str:
        return f"arn:aws:sts::{self.account}:assumed-role/{self.tenant_prefix}{tenant}/local"

    def invoke(
        self, method: str, path: str, query: dict[str, str], headers: dict[str, str], body: str
    ) -> tuple[int, dict[str, str], bytes]:
        # header names are case-insensitive (urllib sends "X-swarm-tenant", HTTP/2 lowercase)
        named = {k.lower(): v for k, v in headers.items()}
        tenant = named.get(TENANT_HEADER.lower()) or DEFAULT_TENANT
        if not _TENANT.match(tenant):
            doc = {"error": "unauthenticated", "message": f"bad {TENANT_HEADER} header"}
            return 401, {"Content-Type": "application/json"}, json.dumps(doc).encode()
        event = proxy_event(
            method,
            path,
            body=body or None,
            headers=headers,
            user_arn=self.user_arn(tenant),
            stage=self.stage,
            query=query or None,
        )
        response = self.clients("lambda-invoke").invoke(
            FunctionName=self.function_arn, Payload=json.dumps(event).encode()
        )
        payload = response["Payload"].read()
        if response.get("FunctionError"):
            log.error("API function error: %s", payload[:2000])
            doc = {"error": "internal", "message": "Internal server error"}
            return 502, {"Content-Type": "application/json"}, json.dumps(doc).encode()
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
                    self._json(413, {"message": "Request Too Long"})
                    return
                body = self.rfile.read(length).decode() if length else ""
                try:
                    query = dict(urllib.parse.parse_qsl(parsed.query))
                    if parsed.path.startswith("/_local/"):
                        doc = json.loads(body) if body else None
                        status, out = api.admin(self.command, parsed.path, doc, query)
                        self._json(status, out)
                        return
                    headers = {k: v for k, v in self.headers.items()}
                    status, hdrs, data = api.invoke(self.command, parsed.path, query, headers, body)
                    self._respond(status, hdrs, data)
                except Exception as e:
                    log.exception("local API failure")
                    self._json(502, {"error": "internal", "message": str(e)})
                finally:
                    log.debug("%s %s in %.3fs", self.command, self.path, time.monotonic() - started)

            do_GET = _handle
            do_POST = _handle
            do_PUT = _handle
            do_DELETE = _handle
            do_PATCH = _handle

        return Handler
