"""The batch API's request bodies and the tenant of a caller, validated with clear messages.

Every error names the field: ``units[3].projected_tokens: must be >= 1``. Nothing is written
before a request has passed all of this.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)

from swarm.core.errors import InvalidInput, SwarmError
from swarm.core.records import Lane
from swarm.service.batches import SubmitRequest, UnitInput

MAX_BODY_BYTES = 5 * 1024 * 1024  # under Lambda's 6 MB synchronous payload limit
MAX_INLINE_UNITS = 10_000
MAX_MANIFEST_UNITS = 50_000  # the ledger stores a run's spec in one item
MAX_INPUT_CHARS = 100_000
UPLOADS_PREFIX = "manifests/uploads/"


class TooLarge(SwarmError):
    """413: the request is over a size limit; the message says which and what to do instead."""


class Unauthenticated(SwarmError):
    """401: the request carries no caller identity."""


class Forbidden(SwarmError):
    """403: the caller is authenticated but is not a tenant of this deployment."""


class UnitBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    unit_id: StrictStr = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
    projected_tokens: StrictInt = Field(ge=1, le=10_000_000)
    # required, with text: it is the model's prompt, and Bedrock's Converse API refuses an
    # empty or whitespace-only text block (the unit would fail every attempt, tokens billed
    # for nothing); checked here, on the simulated model too, so a batch green locally is
    # green on Bedrock
    input: StrictStr = Field(max_length=MAX_INPUT_CHARS)

    @field_validator("input")
    @classmethod
    def _has_text(cls, value: str) -> str:
        if not value.strip():
            raise ValueError(
                "must contain text: it is the model's prompt, and the model refuses an empty "
                "or whitespace-only prompt"
            )
        return value


class ManifestRef(BaseModel):
    model_config = ConfigDict(extra="forbid")

    key: StrictStr = Field(min_length=1, max_length=1024)


class SubmitBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    lane: Lane = Lane.NORMAL
    budget: StrictInt | None = Field(default=None, ge=0)
    max_attempts: StrictInt | None = Field(default=None, ge=1, le=100)
    units: list[UnitBody] | None = Field(default=None, min_length=1)
    manifest: ManifestRef | None = None

    @model_validator(mode="after")
    def one_source(self) -> SubmitBody:
        if (self.units is None) == (self.manifest is None):
            raise ValueError("give either 'units' (inline) or 'manifest' (an S3 key), not both")
        return self


class ResumeBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    top_up: StrictInt = Field(ge=1)


def _first_error(error: ValidationError, prefix: str = "") -> InvalidInput:
    """The first problem, named like ``units[3].projected_tokens``."""
    item = error.errors()[0]
    path = prefix
    for part in item["loc"]:
        path += f"[{part}]" if isinstance(part, int) else f"{'.' if path else ''}{part}"
    return InvalidInput(path or "body", item["msg"].removeprefix("Value error, "))


def parse_json(body: str | None) -> Any:
    if body is None or not body.strip():
        raise InvalidInput("body", "the request needs a JSON body")
    if len(body.encode()) > MAX_BODY_BYTES:
        raise TooLarge(
            f"the body is over {MAX_BODY_BYTES // (1024 * 1024)} MiB: upload the units as a "
            f"manifest under {UPLOADS_PREFIX}<tenant>/ and submit {{'manifest': {{'key': ...}}}}"
        )
    try:
        return json.loads(body)
    except json.JSONDecodeError as e:
        raise InvalidInput("body", f"not valid JSON ({e.msg} at line {e.lineno})") from None


def parse_submit(body: str | None) -> SubmitBody:
    doc = parse_json(body)
    units = doc.get("units") if isinstance(doc, dict) else None
    if isinstance(units, list) and len(units) > MAX_INLINE_UNITS:
        raise TooLarge(
            f"{len(units):,} inline units is over the limit of {MAX_INLINE_UNITS:,}: "
            f"upload them as a manifest under {UPLOADS_PREFIX}<tenant>/"
        )
    try:
        return SubmitBody.model_validate(doc)
    except ValidationError as e:
        raise _first_error(e) from None


def parse_manifest_units(doc: Any) -> list[UnitBody]:
    if not isinstance(doc, list):
        raise InvalidInput("manifest", "a manifest is a JSON array of units")
    if len(doc) > MAX_MANIFEST_UNITS:
        raise TooLarge(f"the manifest has {len(doc):,} units; the limit is {MAX_MANIFEST_UNITS:,}")
    if not doc:
        raise InvalidInput("manifest", "the manifest has no units")
    units = []
    for i, item in enumerate(doc):
        try:
            units.append(UnitBody.model_validate(item))
        except ValidationError as e:
            raise _first_error(e, prefix=f"manifest[{i}]") from None
    return units


def check_manifest_key(tenant: str, key: str) -> None:
    allowed = f"{UPLOADS_PREFIX}{tenant}/"
    if not key.startswith(allowed) or ".." in key:
        raise InvalidInput("manifest.key", f"must be an object under {allowed}")


def parse_resume(body: str | None) -> ResumeBody:
    try:
        return ResumeBody.model_validate(parse_json(body))
    except ValidationError as e:
        raise _first_error(e) from None


def submit_request(
    body: SubmitBody, units: list[UnitBody], default_budget: int, default_attempts: int
) -> SubmitRequest:
    return SubmitRequest(
        lane=body.lane,
        budget=default_budget if body.budget is None else body.budget,
        max_attempts=default_attempts if body.max_attempts is None else body.max_attempts,
        units=[UnitInput(u.unit_id, u.projected_tokens, u.input) for u in units],
    )


_ROLE = re.compile(r"^arn:aws[a-z-]*:(?:iam::\d+:role/(?:.*/)?|sts::\d+:assumed-role/)([^/]+)")


def tenant_of(user_arn: str | None, prefix: str) -> str:
    """The tenant is the caller's IAM role name without the deployment's tenant prefix.

    ``arn:aws:sts::123:assumed-role/swarm-tenant-acme/session`` with prefix ``swarm-tenant-``
    is tenant ``acme``. Anything else is authenticated but not a tenant: 403.
    """
    match = _ROLE.match(user_arn or "")
    if match is None or not match.group(1).startswith(prefix) or match.group(1) == prefix:
        raise Forbidden(
            f"the caller is not a tenant of this deployment: call with a role named "
            f"'{prefix}<tenant>'"
        )
    return match.group(1)[len(prefix) :]
