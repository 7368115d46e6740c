"""The errors API Gateway answers itself (its *gateway responses*), as this API renders them.

One table (:data:`GATEWAY_RESPONSES`) is both what ``infra/api.py`` deploys as the RestApi's
``AWS::ApiGateway::GatewayResponse`` resources and, read back from the synthesized template
(:meth:`GatewayResponses.from_template`), what the local API answers with, through
:func:`render`, which substitutes the variables as API Gateway does.

API Gateway's semantics (a gateway response's template is *not* run by the VTL engine, it supports
simple variable substitution only, so ``$util.escapeJavaScript`` is not available there):

- ``$context.error.messageString`` is *the quoted value* of ``$context.error.message``: a JSON
  string literal, quotes included. A template writes it bare (``"message": $context.error.
  messageString``); in quotes it would render ``""Forbidden""``, which no client parses.
- ``$context.error.responseType`` is a type name (``ACCESS_DENIED``): safe inside quotes.
- ``$context.error.validationErrorString`` is a plain string, not escaped, and holds quotes
  (``[object has missing required properties (["units"])]``) and whatever the refused value held.
  With no way to escape it in a gateway response, no template here uses it: a body the request
  model refuses answers API Gateway's own quoted message (``"Invalid request body"``); the
  handler's validation of the same model names the field for everything the gateway passes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: every response type's status when no gateway response sets one (API Gateway's defaults)
DEFAULT_STATUS: Mapping[str, int] = {
    "ACCESS_DENIED": 403,
    "API_CONFIGURATION_ERROR": 500,
    "AUTHORIZER_CONFIGURATION_ERROR": 500,
    "AUTHORIZER_FAILURE": 500,
    "BAD_REQUEST_BODY": 400,
    "BAD_REQUEST_PARAMETERS": 400,
    "EXPIRED_TOKEN": 403,
    "INTEGRATION_FAILURE": 504,
    "INTEGRATION_TIMEOUT": 504,
    "INVALID_API_KEY": 403,
    "INVALID_SIGNATURE": 403,
    "MISSING_AUTHENTICATION_TOKEN": 403,
    "QUOTA_EXCEEDED": 429,
    "REQUEST_TOO_LARGE": 413,
    "RESOURCE_NOT_FOUND": 404,
    "THROTTLED": 429,
    "UNAUTHORIZED": 401,
    "UNSUPPORTED_MEDIA_TYPE": 415,
    "WAF_FILTERED": 403,
}
#: API Gateway's own body when no gateway response gives a template
AWS_DEFAULT_TEMPLATE = '{"message":$context.error.messageString}'
JSON = "application/json"

#: ``{"error": <the response type>, "message": <API Gateway's message>}``: the API's Error body
ERROR_TEMPLATE = '{"error": "$context.error.responseType", "message": $context.error.messageString}'
#: a body or parameters the gateway's request validation refused: the handler's code for it
VALIDATION_TEMPLATE = '{"error": "invalid_request", "message": $context.error.messageString}'


@dataclass(frozen=True)
class GatewayResponse:
    """One ``AWS::ApiGateway::GatewayResponse``: its type, status (None: the type's default),
    static headers (name -> value) and body templates (content type -> template)."""

    name: str  # its construct id
    response_type: str
    status: int | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    templates: Mapping[str, str] = field(default_factory=lambda: {JSON: ERROR_TEMPLATE})


#: what the stack deploys (infra/api.py) and the local API answers (swarm/local/apiserver.py)
GATEWAY_RESPONSES: tuple[GatewayResponse, ...] = (
    GatewayResponse("BadBody", "BAD_REQUEST_BODY", 400, templates={JSON: VALIDATION_TEMPLATE}),
    GatewayResponse(
        "BadParameters", "BAD_REQUEST_PARAMETERS", 400, templates={JSON: VALIDATION_TEMPLATE}
    ),
    GatewayResponse("Throttled", "THROTTLED", 429, headers={"Retry-After": "1"}),
    # a body past API Gateway's 10 MB, or an event past Lambda's 6 MB invocation payload (the
    # body as the event carries it, JSON-escaped, with the headers): API Gateway's 413
    GatewayResponse("TooLarge", "REQUEST_TOO_LARGE", 413),
    GatewayResponse("Default4xx", "DEFAULT_4XX"),
    GatewayResponse("Default5xx", "DEFAULT_5XX"),
)


@dataclass(frozen=True)
class GatewayError:
    """An error API Gateway raises: the ``$context.error`` variables a template substitutes."""

    response_type: str
    message: str
    validation: str = ""  # $context.error.validationErrorString (request validation only)
    #: the status when neither this type's response nor its default sets one (types API
    #: Gateway has no default for, e.g. a function error's 502)
    status: int | None = None

    @property
    def default_status(self) -> int:
        if self.status is not None:
            return self.status
        return DEFAULT_STATUS.get(self.response_type, 500)


_VARIABLE = re.compile(
    r"\$(?:\{context\.error\.(\w+)\}|context\.error\.(messageString|message|responseType|"
    r"validationErrorString))"
)


def render(template: str, error: GatewayError) -> str:
    """``template`` with the error's variables substituted as API Gateway does (simple
    substitution: ``messageString`` is a JSON string literal, the others are inserted as they
    are); an unknown ``$context.error`` variable renders empty."""
    values = {
        "messageString": json.dumps(error.message),
        "message": error.message,
        "responseType": error.response_type,
        "validationErrorString": error.validation,
    }
    return _VARIABLE.sub(lambda m: values.get(m.group(1) or m.group(2), ""), template)


class GatewayResponses:
    """A RestApi's gateway responses by type, answering a :class:`GatewayError` as API Gateway
    would: the type's own response, else ``DEFAULT_4XX``/``DEFAULT_5XX`` by its status, else
    API Gateway's built-in ``{"message": ...}``."""

    def __init__(self, responses: Mapping[str, GatewayResponse]) -> None:
        self.responses = dict(responses)

    @classmethod
    def of(cls, responses: tuple[GatewayResponse, ...] = GATEWAY_RESPONSES) -> GatewayResponses:
        return cls({r.response_type: r for r in responses})

    @classmethod
    def from_template(cls, template: Mapping[str, Any]) -> GatewayResponses:
        """The ``AWS::ApiGateway::GatewayResponse`` resources of a synthesized template."""
        found: dict[str, GatewayResponse] = {}
        for logical, resource in template.get("Resources", {}).items():
            if resource.get("Type") != "AWS::ApiGateway::GatewayResponse":
                continue
            props = resource.get("Properties", {})
            headers = {}
            for key, value in (props.get("ResponseParameters") or {}).items():
                name = key.removeprefix("gatewayresponse.header.")
                if name != key and value.startswith("'") and value.endswith("'"):
                    headers[name] = value[1:-1]  # a static value; mapped ones are not served
            status = props.get("StatusCode")
            found[props["ResponseType"]] = GatewayResponse(
                logical,
                props["ResponseType"],
                int(status) if status is not None else None,
                headers,
                dict(props.get("ResponseTemplates") or {}),
            )
        return cls(found)

    def answer(self, error: GatewayError) -> tuple[int, dict[str, str], bytes]:
        """The status, headers and body API Gateway answers ``error`` with (JSON)."""
        own = self.responses.get(error.response_type)
        fallback = self.responses.get(
            "DEFAULT_5XX" if error.default_status >= 500 else "DEFAULT_4XX"
        )
        status = error.default_status
        if own is not None and own.status is not None:
            status = own.status
        elif own is None and fallback is not None and fallback.status is not None:
            status = fallback.status
        chosen = own or fallback
        template = AWS_DEFAULT_TEMPLATE if chosen is None else chosen.templates.get(JSON)
        headers = {"Content-Type": JSON, **(chosen.headers if chosen is not None else {})}
        body = render(AWS_DEFAULT_TEMPLATE if template is None else template, error)
        return status, headers, body.encode()
