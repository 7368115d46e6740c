"""Every request and response body of the batch API, and its limits.

A model's docstring and its fields' descriptions are public: they are the descriptions in
``docs/openapi.json`` (and in API Gateway's request models). The requests validate strictly
(unknown fields, wrong types and out-of-range values are refused); the responses are what the
service answers, built through these models so the document cannot drift from them.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    field_validator,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema

from swarm.core.records import ID_PATTERN, Lane, RunState

MAX_BODY_BYTES = 5 * 1024 * 1024  # under Lambda's 6 MB synchronous payload limit
MAX_INLINE_UNITS = 10_000
MAX_MANIFEST_UNITS = 50_000  # the ledger stores a run's spec in one item
MAX_INPUT_CHARS = 100_000
#: the remainder ids a status lists: a large batch's whole remainder would pass Lambda's 6 MB
#: response (128-character ids: ~130 KB listed)
MAX_REMAINDER_LISTED = 1_000
MAX_PROJECTED_TOKENS = 10_000_000
MAX_ATTEMPTS = 100
MAX_MANIFEST_KEY_CHARS = 1024  # S3's longest key
MAX_IDEMPOTENCY_KEY_CHARS = 255
UPLOADS_PREFIX = "manifests/uploads/"


# ---------------------------------------------------------------------------------- requests


class Unit(BaseModel):
    """One unit of work: an id unique in its batch, the tokens admission reserves for one
    attempt, and the prompt."""

    model_config = ConfigDict(extra="forbid")

    unit_id: StrictStr = Field(pattern=ID_PATTERN)
    projected_tokens: StrictInt = Field(
        ge=1, le=MAX_PROJECTED_TOKENS, description="what admission reserves"
    )
    # required, with text: it is the model's prompt, and Bedrock's Converse API refuses an
    # empty or whitespace-only text block (the unit would fail every attempt, tokens billed
    # for nothing); checked here, on the simulated model too, so a batch green locally is
    # green on Bedrock. The schema says the same (minLength, pattern) for API Gateway.
    input: StrictStr = Field(
        max_length=MAX_INPUT_CHARS,
        description=(
            "the unit's prompt for the model: required, with at least one character that is "
            "not whitespace (the model refuses an empty or whitespace-only prompt)"
        ),
        json_schema_extra={"minLength": 1, "pattern": r"\S"},
    )

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
    """Units uploaded to S3 rather than sent inline."""

    model_config = ConfigDict(extra="forbid")

    key: StrictStr = Field(
        min_length=1,
        max_length=MAX_MANIFEST_KEY_CHARS,
        description=(
            f"an object under {UPLOADS_PREFIX}<tenant>/ holding a JSON array of units "
            f"(up to {MAX_MANIFEST_UNITS:,})"
        ),
    )


class BatchSubmission(BaseModel):
    """Exactly one of units or manifest."""

    model_config = ConfigDict(extra="forbid")

    lane: Lane = Lane.NORMAL
    budget: StrictInt | None = Field(
        default=None, ge=0, description="tokens; defaults to the deployment's default budget"
    )
    max_attempts: StrictInt | None = Field(
        default=None,
        ge=1,
        le=MAX_ATTEMPTS,
        description="attempts per unit; defaults to the deployment's setting",
    )
    # over MAX_INLINE_UNITS is a 413 naming the manifest alternative, checked before this model
    # (swarm.service.api_models.parse_submit): the bound is here for the document
    units: list[Unit] | None = Field(default=None, min_length=1, max_length=MAX_INLINE_UNITS)
    manifest: ManifestRef | None = None

    @model_validator(mode="after")
    def one_source(self) -> BatchSubmission:
        if (self.units is None) == (self.manifest is None):
            raise ValueError("give either 'units' (inline) or 'manifest' (an S3 key), not both")
        return self


class BatchResume(BaseModel):
    """A top-up of the batch's budget; the remainder is requeued."""

    model_config = ConfigDict(extra="forbid")

    top_up: StrictInt = Field(ge=1, description="tokens added to the budget")


# --------------------------------------------------------------------------------- responses


class UnitCounts(BaseModel):
    """The batch's units by outcome."""

    completed: int
    dead_lettered: int
    remainder: int = Field(description="not run: the budget ran out")
    in_flight: int
    pending: int


class TokenBook(BaseModel):
    """The batch's tokens: its budget, what was billed, what admitted units hold."""

    budget: int
    spent: int
    reserved: int
    available: int


class BatchStatus(BaseModel):
    """A batch: its state, counts per outcome, spend against budget and the healthy line."""

    batch_id: str
    tenant: str
    lane: Lane
    state: RunState
    units: int
    counts: UnitCounts
    attempts: int
    retries: int
    tokens: TokenBook
    elapsed_s: float
    healthy_line: str
    # absent, never null, when not given (the service dumps it with exclude_none)
    remainder: (
        Annotated[list[str], Field(max_length=MAX_REMAINDER_LISTED)] | SkipJsonSchema[None]
    ) = Field(
        default=None,
        description=(
            f"the remainder's unit ids, the first {MAX_REMAINDER_LISTED:,} in the ledger's order "
            "(counts.remainder is the whole count): present while exhausting or exhausted"
        ),
    )
    requeued: int | SkipJsonSchema[None] = Field(
        default=None, description="units requeued: present in a resume's answer only"
    )


class GovernorState(BaseModel):
    """The fleet's token bucket (a snapshot; the API only reads it)."""

    available_tokens: int
    capacity_tokens: int
    governed_rate_tps: float
    effective_rate_tps: float
    throttles: int
    last_throttle_at: float | None = Field(description="epoch seconds; null: never throttled")


class LaneDepthView(BaseModel):
    """One lane's messages."""

    visible: int = Field(description="waiting to be received")
    in_flight: int = Field(description="received by a worker, not yet done")
    delayed: int = Field(description="handed back with a delay, not yet visible")


class Fleet(BaseModel):
    """The governor, the lanes and the drain switch."""

    draining: bool
    governor: GovernorState
    lanes: dict[str, LaneDepthView] = Field(description="by lane: high, normal, low")
    in_flight: int
    queued: int = Field(description="visible and delayed, every lane")


class Drain(BaseModel):
    """The drain switch and whether it is safe to deploy."""

    draining: bool
    in_flight: int
    queued: int
    safe_to_deploy: bool = Field(
        description=(
            "the drain switch is on and nothing is in flight on any lane. The API cannot see "
            "the workers' event source mappings: the drain function's own report, by the same "
            "rule (swarm.service.drain.safe_to_deploy), also requires every one to be stopped"
        )
    )


class ErrorCode(StrEnum):
    """The codes the API function answers errors with."""

    INVALID_REQUEST = "invalid_request"
    UNAUTHENTICATED = "unauthenticated"
    FORBIDDEN = "forbidden"
    NOT_FOUND = "not_found"
    CONFLICT = "conflict"
    TOO_LARGE = "too_large"
    SHEDDING = "shedding"
    DRAINING = "draining"
    MISCONFIGURED = "misconfigured"


class Error(BaseModel):
    """Every error."""

    error: str = Field(
        description=(
            "the API function's code: "
            + ", ".join(code.value for code in ErrorCode)
            + "; or, for an error API Gateway answers before the function runs, its response "
            "type (e.g. MISSING_AUTHENTICATION_TOKEN, ACCESS_DENIED, THROTTLED; a body that "
            "fails the request model is invalid_request)"
        )
    )
    message: str
