"""The batch API's request bodies parsed into :mod:`swarm.api.models`, and the caller's tenant, with
clear messages.

Every error names the field: ``units[3].projected_tokens: must be >= 1``. Nothing is written
before a request has passed all of this.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from swarm.api.models import (
    MAX_BODY_BYTES,
    MAX_INLINE_UNITS,
    MAX_MANIFEST_UNITS,
    SAFE_BODY_BYTES,
    UPLOADS_PREFIX,
    ApprovalDecision,
    ApprovalsQuery,
    BatchResume,
    BatchSubmission,
    ResultsQuery,
    TranscriptQuery,
    Unit,
    UploadRequest,
    escaped_bytes,
)
from swarm.core.errors import InvalidInput, SwarmError


class TooLarge(SwarmError):
    """413: the request is over a size limit; the message says which and what to do instead."""


class Unauthenticated(SwarmError):
    """401: the request carries no caller identity."""


class Forbidden(SwarmError):
    """403: the caller is authenticated but is not a tenant of this deployment."""


def _first_error(error: ValidationError, prefix: str = "") -> InvalidInput:
    """The first problem, named like ``units[3].projected_tokens``."""
    item = error.errors()[0]
    path = prefix
    for part in item["loc"]:
        path += f"[{part}]" if isinstance(part, int) else f"{'.' if path else ''}{part}"
    return InvalidInput(path or "body", item["msg"].removeprefix("Value error, "))


M = TypeVar("M", bound=BaseModel)


def _validate(model: type[M], doc: Any, prefix: str = "") -> M:
    try:
        return model.model_validate(doc)
    except ValidationError as e:
        raise _first_error(e, prefix) from None


def parse_json(body: str | None) -> Any:
    if body is None or not body.strip():
        raise InvalidInput("body", "the request needs a JSON body")
    size = escaped_bytes(body)
    if size > MAX_BODY_BYTES:
        raise TooLarge(
            f"the body is {size:,} bytes as API Gateway's event carries it (JSON-escaped: a "
            "quote or backslash counts 2 bytes, a control or non-ASCII character 6), over the "
            f"inline limit of {MAX_BODY_BYTES:,} (any body of up to {SAFE_BODY_BYTES:,} bytes "
            f"fits): upload the units as a manifest under {UPLOADS_PREFIX}<tenant>/ (POST "
            "/uploads gives the key and a URL) and submit {'manifest': {'key': ...}}"
        )
    try:
        return json.loads(body)
    except json.JSONDecodeError as e:
        raise InvalidInput("body", f"not valid JSON ({e.msg} at line {e.lineno})") from None
    except ValueError:  # an integer literal past Python's 4,300-digit conversion limit
        raise InvalidInput("body", "a number in the body has too many digits") from None
    except RecursionError:
        raise InvalidInput("body", "the JSON is nested too deeply") from None


def parse_submit(body: str | None) -> BatchSubmission:
    doc = parse_json(body)
    units = doc.get("units") if isinstance(doc, dict) else None
    if isinstance(units, list) and len(units) > MAX_INLINE_UNITS:
        raise TooLarge(
            f"{len(units):,} inline units is over the limit of {MAX_INLINE_UNITS:,}: "
            f"upload them as a manifest under {UPLOADS_PREFIX}<tenant>/ (POST /uploads)"
        )
    return _validate(BatchSubmission, doc)


def parse_manifest_units(doc: Any) -> list[Unit]:
    if not isinstance(doc, list):
        raise InvalidInput("manifest", "a manifest is a JSON array of units")
    if len(doc) > MAX_MANIFEST_UNITS:
        raise TooLarge(f"the manifest has {len(doc):,} units; the limit is {MAX_MANIFEST_UNITS:,}")
    if not doc:
        raise InvalidInput("manifest", "the manifest has no units")
    return [_validate(Unit, item, prefix=f"manifest[{i}]") for i, item in enumerate(doc)]


def check_manifest_key(tenant: str, key: str) -> None:
    allowed = f"{UPLOADS_PREFIX}{tenant}/"
    if not key.startswith(allowed) or ".." in key:
        raise InvalidInput("manifest.key", f"must be an object under {allowed}")


def parse_resume(body: str | None) -> BatchResume:
    return _validate(BatchResume, parse_json(body))


def parse_decision(body: str | None) -> ApprovalDecision:
    """``POST /batches/{id}/units/{unit}/approvals/{toolUseId}``'s body; a rejection needs a
    reason (InvalidInput naming ``reason``)."""
    decision = _validate(ApprovalDecision, parse_json(body))
    reason = decision.reason.strip()
    if decision.decision == "reject" and not reason:
        raise InvalidInput("reason", "a rejection needs a reason: the model reads it")
    return decision.model_copy(update={"reason": reason})


def role_name_of(user_arn: str | None) -> str | None:
    """The IAM role's name of a caller's ARN (a role or an assumed role's session), or None."""
    match = _ROLE.match(user_arn or "")
    return match.group("role") if match else None


def parse_upload(body: str | None) -> UploadRequest:
    return _validate(UploadRequest, parse_json(body))


def parse_transcript_query(params: Mapping[str, str] | None) -> TranscriptQuery:
    """``GET /batches/{id}/units/{unit}/transcript``'s query string (``from_turn``)."""
    return _validate(TranscriptQuery, dict(params or {}))


def parse_approvals_query(params: Mapping[str, str] | None) -> ApprovalsQuery:
    """``GET /batches/{id}/approvals``'s query string (``limit``, ``next_token``)."""
    return _validate(ApprovalsQuery, dict(params or {}))


def parse_results_query(params: Mapping[str, str] | None) -> ResultsQuery:
    """``GET /batches/{id}/results``'s query string (``state``, ``limit``, ``next_token``)."""
    return _validate(ResultsQuery, dict(params or {}))


_ROLE = re.compile(
    r"^arn:aws[a-z-]*:(?:iam::(?P<iam>\d+):role/(?:.*/)?|sts::(?P<sts>\d+):assumed-role/)"
    r"(?P<role>[^/]+)"
)


@dataclass(frozen=True)
class Caller:
    """Who is calling: a tenant (its batches only) or an operator (the fleet-wide views)."""

    tenant: str | None  # None for an operator
    #: the role's unique id (AROA...: API Gateway's ``identity.user`` before the ':'), which a
    #: recreated role of the same name does not share; None when the request does not carry it
    role_id: str | None = None

    @property
    def operator(self) -> bool:
        return self.tenant is None


def caller_of(
    user_arn: str | None,
    user: str | None,
    tenant_prefix: str,
    operator_prefix: str,
    account: str | None = None,
) -> Caller:
    """An operator role (``<operator_prefix><name>``) or a tenant (:func:`tenant_of`)."""
    role_id = user.split(":", 1)[0] if user and user.startswith("AROA") else None
    match = _ROLE.match(user_arn or "")
    role = match.group("role") if match else ""
    if match is not None and role.startswith(operator_prefix) and role != operator_prefix:
        caller_account = match.group("iam") or match.group("sts")
        if account is None or caller_account == account:
            return Caller(None, role_id)
    return Caller(tenant_of(user_arn, tenant_prefix, account), role_id)


class OperatorsOnly(Forbidden):
    """403: a fleet-wide view or action, and the caller is a tenant."""


def tenant_of(user_arn: str | None, prefix: str, account: str | None = None) -> str:
    """The tenant is the caller's IAM role name without the deployment's tenant prefix.

    ``arn:aws:sts::123:assumed-role/swarm-tenant-acme/session`` with prefix ``swarm-tenant-``
    is tenant ``acme``. ``account``: the deployment's own account; a role of another account
    is not a tenant, whatever its name (another account may name its roles as it likes).
    Anything else is authenticated but not a tenant: 403.
    """
    match = _ROLE.match(user_arn or "")
    role = match.group("role") if match else ""
    if match is None or not role.startswith(prefix) or role == prefix:
        raise Forbidden(
            f"the caller is not a tenant of this deployment: call with a role named "
            f"'{prefix}<tenant>'"
        )
    caller_account = match.group("iam") or match.group("sts")
    if account is not None and caller_account != account:
        raise Forbidden(
            f"the caller's account {caller_account} is not this deployment's: call with a "
            "tenant role of the account the stack runs in"
        )
    return role[len(prefix) :]
