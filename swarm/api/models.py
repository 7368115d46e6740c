"""Every request and response body of the batch API, and its limits.

A model's docstring and its fields' descriptions are public: they are the descriptions in
``docs/openapi.json`` (and in API Gateway's request models). The requests validate strictly
(unknown fields, wrong types and out-of-range values are refused); the responses are what the
service answers, built through these models so the document cannot drift from them.
"""

from __future__ import annotations

import json
import re
from decimal import Decimal
from enum import StrEnum
from typing import Annotated, Any, Literal, NotRequired

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    StrictInt,
    StrictStr,
    TypeAdapter,
    ValidatorFunctionWrapHandler,
    WithJsonSchema,
    WrapValidator,
    field_validator,
    model_validator,
    with_config,
)
from pydantic.json_schema import SkipJsonSchema
from typing_extensions import TypedDict

from swarm.core import agent, prompts
from swarm.core.pricing import USD_PLACES
from swarm.core.records import ID_PATTERN, Lane, RunState, UnitState

#: Lambda's synchronous invocation payload (the whole API Gateway event): "6 MB", 6 MiB exactly
LAMBDA_PAYLOAD_BYTES = 6 * 1024 * 1024
#: the event but its body, at most: API Gateway takes up to 10,240 bytes of request line and
#: headers, which the event carries twice (headers, multiValueHeaders), JSON-escaped (at worst 6
#: bytes a character), plus the request context (identity, path) and the event's keys
EVENT_OVERHEAD_BYTES = 256 * 1024
#: an inline body's limit, counted as the event carries it: JSON-escaped (:func:`escaped_bytes`).
#: Whatever API Gateway's escaping, a body within it fits Lambda's payload with the rest of the
#: event, so the handler sees it and answers; past it the handler answers 413, or, when the event
#: does not fit Lambda at all, API Gateway answers its REQUEST_TOO_LARGE 413 (swarm.api.gateway)
MAX_BODY_BYTES = LAMBDA_PAYLOAD_BYTES - EVENT_OVERHEAD_BYTES  # 5.75 MiB
#: escaping makes a byte at most 6 (a control character: \u00XX), so a body of up to this many
#: bytes fits whatever it holds
SAFE_BODY_BYTES = 1_000_000
MAX_INLINE_UNITS = 10_000


def escaped_bytes(body: str) -> int:
    """``body``'s bytes as a JSON string in API Gateway's event, at worst: a quote, backslash or
    control character escaped (``\\"``, ``\\u0001``: 2 to 6 bytes), every non-ASCII character
    too (``\\u00e9``: 6 bytes a UTF-16 unit), quotes excluded."""
    return len(json.dumps(body, ensure_ascii=True)) - 2


def response_bytes(doc: Any) -> int:
    """``doc``'s bytes in the API function's response to Lambda, at worst: its JSON as the handler
    writes a body (``json.dumps``: every non-ASCII character escaped), JSON-escaped once more as
    the proxy response's ``body`` string (:func:`escaped_bytes`). A page's bound
    (:data:`MAX_RESULTS_PAGE_BYTES`) counts this, not the UTF-8 bytes of its JSON: a quote in a
    model's answer is 4 bytes here, a CJK character 7, an emoji 14."""
    return escaped_bytes(json.dumps(doc))


#: an uploaded manifest's units: the submit writes O(1) items whatever the count (the open step
#: writes the unit records, swarm.service.opener), so the bound is the API function's time
#: and memory to read, validate and write the manifest (measured: docs/explanation/scale.md)
MAX_MANIFEST_UNITS = 100_000
#: a unit's input: the characters of its text in all (a string, or every text of a request).
#: Its JSON must also fit a Distributed Map item (swarm.service.batches.check_fits_the_fan_out)
MAX_INPUT_CHARS = 100_000
#: Step Functions' limit on a state's input: a Distributed Map child's (a chunk of units as the
#: fan-out carries it: each unit must fit alone, swarm.service.batches.check_fits_the_fan_out,
#: and the chunks are cut to fit, swarm.service.batches.chunk_units)
MAX_MAP_ITEM_BYTES = 256 * 1024
#: a Converse-shaped input's shape: turns, text blocks per turn, system blocks, stop sequences
MAX_MESSAGES = 100
MAX_CONTENT_BLOCKS = 20
#: an agent unit's tools at most (a Converse toolConfig holds the unit's tool specs on every turn)
MAX_UNIT_TOOLS = 128
MAX_SYSTEM_BLOCKS = 10
MAX_STOP_SEQUENCES = 4
MAX_STOP_SEQUENCE_CHARS = 100
#: the remainder ids a status lists: a large batch's whole remainder would pass Lambda's 6 MB
#: response (128-character ids: ~130 KB listed)
MAX_REMAINDER_LISTED = 1_000
MAX_PROJECTED_TOKENS = 10_000_000
MAX_ATTEMPTS = 100
MAX_MANIFEST_KEY_CHARS = 1024  # S3's longest key
MAX_IDEMPOTENCY_KEY_CHARS = 255
#: the most tokens a batch's budget may hold: a deployment's ``budget.max_tokens`` is at most
#: this (infra.config), and the API refuses a budget or a top-up past the deployment's own
MAX_BUDGET_TOKENS = 1_000_000_000
#: the most US dollars a batch's budget may hold (budget_usd, after every top_up_usd)
MAX_BUDGET_USD = 1_000_000


def _a_number(value: Any) -> Any:
    """A dollar amount is a JSON number: not a string, not a boolean (as the gateway's model)."""
    if isinstance(value, bool) or not isinstance(value, int | float | Decimal):
        raise ValueError(f"must be a number of US dollars, got {value!r}")
    return value


#: US dollars as a JSON number, > 0, at most 6 decimal places (whole micro-dollars), kept as an
#: exact Decimal (swarm.core.pricing parses it to micro-dollars; money is never a float there)
UsdAmount = Annotated[
    Decimal,
    BeforeValidator(_a_number),
    Field(gt=0, le=MAX_BUDGET_USD, decimal_places=USD_PLACES),
    WithJsonSchema({"type": "number", "minimum": 10**-USD_PLACES, "maximum": MAX_BUDGET_USD}),
]
UPLOADS_PREFIX = "manifests/uploads/"
#: every batch id starts with this (swarm.service.batches.batch_id_for): the API's own manifests
#: are manifests/b-.../, never under UPLOADS_PREFIX (infra grants each prefix its own writes)
BATCH_ID_PREFIX = "b-"
#: every batch id (swarm.service.batches.batch_id_for): the prefix and 24 hex digits
BATCH_ID_PATTERN = rf"^{BATCH_ID_PREFIX}[0-9a-f]{{24}}$"
#: an uploaded manifest's bytes: the API function reads, parses and copies one in memory (512 MB)
#: within API Gateway's 29 s; S3 refuses an upload of another size than the one the URL was
#: signed for (swarm.service.uploads), and the API refuses a bigger object when it reads it
MAX_MANIFEST_BYTES = 32 * 1024 * 1024
#: units per page of results: a page's answer stays under Lambda's 6 MB (answers are inlined up
#: to swarm.core.results.MAX_INLINE_OUTPUT_BYTES, and a page stops early when it grows past
#: MAX_RESULTS_PAGE_BYTES, counted as the response carries it: response_bytes)
DEFAULT_RESULTS_PAGE = 100
MAX_RESULTS_PAGE = 1_000
MAX_RESULTS_PAGE_BYTES = 4 * 1024 * 1024
MAX_NEXT_TOKEN_CHARS = 512
#: parked units per page of approvals (GET /batches/{id}/approvals: a unit's waiting calls are
#: never split across pages; a page also stops early when it grows past MAX_RESULTS_PAGE_BYTES)
DEFAULT_APPROVALS_PAGE = 100
MAX_APPROVALS_PAGE = 1_000


# ------------------------------------------------------------------ a unit's input


def _has_text(value: str) -> str:
    # Bedrock's Converse API refuses an empty or whitespace-only text block (the unit would fail
    # every attempt, tokens billed for nothing): refused here, on the simulated model too, so a
    # batch green locally is green on Bedrock. The schema says the same (minLength, pattern).
    problem = prompts.text_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


#: a character that is not whitespace, as the check above counts it (Python's str.isspace;
#: JSON Schema's \S is ECMA's, which misses U+001C-U+001F and U+0085 and counts U+FEFF: the
#: fuzzer's text "\x1e" was valid by the document and refused): every whitespace code point
#: spelled out (a unit test holds it to str.isspace)
NOT_WHITESPACE = (
    r"[^\t\n\x0b\x0c\r\x1c-\x1f \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]"
)
_TEXT_SCHEMA: dict[str, Any] = {"minLength": 1, "pattern": NOT_WHITESPACE}

#: a text the model reads (a string input, or a text block): at least one character that is not
#: whitespace, and at most a whole input's characters
Text = Annotated[
    StrictStr,
    Field(max_length=MAX_INPUT_CHARS, json_schema_extra=_TEXT_SCHEMA),
    AfterValidator(_has_text),
]
StopSequence = Annotated[
    StrictStr,
    Field(max_length=MAX_STOP_SEQUENCE_CHARS, json_schema_extra=_TEXT_SCHEMA),
    AfterValidator(_has_text),
]
Probability = Annotated[float, Field(strict=True, ge=0, le=1, allow_inf_nan=False)]


def _by_json_type(forms: tuple[tuple[type, TypeAdapter[Any]], ...], refusal: str) -> WrapValidator:
    """Validate a value of a union with the one form its JSON type selects, so an error names
    that form's own field (``input.messages[0].content[0].text``), not every form's; a value of
    no form's type is refused with ``refusal``."""

    def validate(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        for kind, adapter in forms:
            if isinstance(value, kind):
                # its ValidationError goes out with the form's own locations, under this field's
                # (as a wrap validator re-raises its handler's)
                return adapter.validate_python(value)
        raise ValueError(refusal)

    return WrapValidator(validate)


# The parts of a request are TypedDicts, not models: validated in pydantic's core without a
# Python object per block (a manifest of 50,000 requests parses in a fraction of the time).


@with_config(ConfigDict(extra="forbid"))
class TextBlock(TypedDict):
    """A block of text (a Converse content block holding text)."""

    text: Text


@with_config(ConfigDict(extra="forbid"))
class Message(TypedDict):
    """One turn of the conversation."""

    role: Literal["user", "assistant"]
    content: Annotated[list[TextBlock], Field(min_length=1, max_length=MAX_CONTENT_BLOCKS)]


@with_config(ConfigDict(extra="forbid"))
class InferenceConfig(TypedDict):
    """Inference settings (Converse's inferenceConfig), each optional: the model's default
    otherwise."""

    maxTokens: NotRequired[
        Annotated[
            StrictInt,
            Field(
                ge=1,
                le=MAX_PROJECTED_TOKENS,
                description=(
                    "the longest answer wanted, in tokens. The answer is also bounded by the "
                    "unit's reservation: the model is asked for at most the smaller of this and "
                    "projected_tokens minus the input's tokens"
                ),
            ),
        ]
        | None
    ]
    temperature: NotRequired[Probability | None]
    topP: NotRequired[Probability | None]
    stopSequences: NotRequired[
        Annotated[
            list[StopSequence],
            Field(
                max_length=MAX_STOP_SEQUENCES,
                description="texts that end the answer when the model writes them",
            ),
        ]
        | None
    ]


SystemBlocks = Annotated[list[TextBlock], Field(min_length=1, max_length=MAX_SYSTEM_BLOCKS)]
SYSTEM_FORMS = "must be a string or a list of text blocks (leave system out for none)"


ToolName = Annotated[StrictStr, Field(pattern=agent.NAME_PATTERN)]


@with_config(ConfigDict(extra="forbid"))
class ToolChoiceTool(TypedDict):
    """Force one tool (until the model has called a tool since the last user message)."""

    tool: ToolName


@with_config(ConfigDict(extra="forbid"))
class Limits(TypedDict):
    """An agent unit's limits (its tokens are capped by projected_tokens)."""

    max_turns: NotRequired[
        Annotated[
            StrictInt,
            Field(
                ge=1,
                le=agent.MAX_TURNS,
                description=f"model turns at most ({agent.DEFAULT_MAX_TURNS} if left out)",
            ),
        ]
    ]
    approve_tools: NotRequired[
        Annotated[
            list[ToolName],
            Field(
                max_length=MAX_UNIT_TOOLS,
                description=(
                    "tools of the unit whose calls each wait for a person's decision before they "
                    "run (human gates: GET /batches/{batch_id}/approvals); each must be one of "
                    "the unit's tools"
                ),
            ),
        ]
    ]


FollowUp = Annotated[
    Text | Annotated[list[TextBlock], Field(min_length=1, max_length=MAX_CONTENT_BLOCKS)],
    _by_json_type(
        ((str, TypeAdapter(Text)), (list, TypeAdapter(list[TextBlock]))),
        "must be a text or a list of text blocks",
    ),
]


class ConverseInput(BaseModel):
    """A Converse-shaped request: the conversation (user and assistant turns, from the user first
    and last, alternating), an optional system prompt and inference settings. Its texts together
    hold at most the characters of a string input. With ``tools``, ``toolChoice``, ``limits`` or
    ``followUps`` it is an *agent unit*: a loop of model turns and tool calls (docs/agents.md)."""

    model_config = ConfigDict(extra="forbid")

    # no null (the schema has none: an explicit null is refused, like any other type)
    system: Annotated[
        Text | SystemBlocks | SkipJsonSchema[None],
        _by_json_type(((str, TypeAdapter(Text)), (list, TypeAdapter(SystemBlocks))), SYSTEM_FORMS),
    ] = Field(default=None, description="instructions for the model: a string, or text blocks")
    messages: list[Message] = Field(min_length=1, max_length=MAX_MESSAGES)
    inferenceConfig: InferenceConfig | None = None
    model: str | SkipJsonSchema[None] = Field(
        default=None,
        json_schema_extra={"pattern": prompts.MODEL_NAME_PATTERN},
        description=(
            "the model that answers: a name of the deployment's model registry (cdk.json "
            "models.catalog, GET /fleet lists them) that the batch's tenant may use; absent: "
            "the registry's default. Each model has its own quota and prices (a 400 names an "
            "unknown or forbidden one)"
        ),
    )
    tools: Annotated[list[ToolName], Field(max_length=MAX_UNIT_TOOLS)] | SkipJsonSchema[None] = (
        Field(
            default=None,
            description=(
                "an agent unit's tools: names from the deployment's tool registry that the batch's "
                "tenant may use, each once (a 400 names an unknown, forbidden or repeated one)"
            ),
        )
    )
    toolChoice: Literal["auto", "any"] | ToolChoiceTool | SkipJsonSchema[None] = Field(
        default=None,
        description=(
            '"auto" (default), "any", or {"tool": name}: the model must call a tool (any, or '
            "that one) until it has called one since the last user message. A named tool is "
            "one of the unit's tools, and only with tools is a toolChoice given (a 400 "
            "otherwise). A forced choice must be one the deployment's model takes (Bedrock's "
            'Converse: Anthropic Claude 3 and later and Amazon Nova take "any" and {"tool"}, '
            'Mistral Large "any", other models "auto" only): a 400 names the choices the '
            "deployment's model takes"
        ),
    )
    limits: Limits | None = None
    followUps: Annotated[list[FollowUp], Field(max_length=MAX_MESSAGES)] | SkipJsonSchema[None] = (
        Field(
            default=None,
            description="later user messages, each sent once the model has answered the one before",
        )
    )

    @field_validator("model")
    @classmethod
    def _model_name(cls, value: str | None) -> str | None:
        if value is not None and not re.match(prompts.MODEL_NAME_PATTERN, value):
            raise ValueError(
                "must be a model's name in the deployment's registry (lowercase letters, digits "
                "and -, starting with a letter): GET /fleet lists them"
            )
        return value

    @field_validator("messages")
    @classmethod
    def _turns(cls, value: list[Message]) -> list[Message]:
        problem = prompts.turns_problem([m["role"] for m in value])
        if problem is not None:
            raise ValueError(problem)
        return value

    _normal: dict[str, Any] = PrivateAttr()  # the request in normal form, set by _size

    @model_validator(mode="after")
    def _size(self) -> ConverseInput:
        # checked by this model with the core's rules: only the shape is the core's to give
        request = {"system": self.system, "messages": self.messages}
        self._normal = prompts.normal_form({**request, "inferenceConfig": self.inferenceConfig})
        chars = sum(len(text) for text in prompts.texts(self._normal))
        if chars > MAX_INPUT_CHARS:
            raise ValueError(
                f"its texts hold {chars:,} characters in all; the limit is {MAX_INPUT_CHARS:,}"
            )
        return self

    def prompt(self) -> prompts.Prompt:
        """The request in the core's normal form (:mod:`swarm.core.prompts`), with an agent
        unit's fields (:data:`swarm.core.agent.AGENT_FIELDS`) as given."""
        extra = {
            name: getattr(self, name)
            for name in (*agent.AGENT_FIELDS, prompts.MODEL_FIELD)
            if getattr(self, name) is not None
        }
        return {**self._normal, **extra} if extra else self._normal


# ---------------------------------------------------------------------------------- requests


class Unit(BaseModel):
    """One unit of work: an id unique in its batch, the tokens admission reserves for one
    attempt, and the prompt."""

    model_config = ConfigDict(extra="forbid")

    unit_id: StrictStr = Field(pattern=ID_PATTERN)
    projected_tokens: StrictInt = Field(
        ge=1,
        le=MAX_PROJECTED_TOKENS,
        description=(
            "what admission reserves: the most one attempt may bill, input and answer together "
            "(for an agent unit, its whole loop's: at least what its first turn draws, its "
            "input and its output bound). "
            "At most what the fleet's governor can grant at once on the batch's lane (its "
            "bucket's capacity less the reserve it keeps for higher lanes, a deployment's "
            "setting): a bigger unit could never run, and is a 400 naming it"
        ),
    )
    input: Annotated[
        Text | ConverseInput,
        _by_json_type(
            ((str, TypeAdapter(Text)), (dict, TypeAdapter(ConverseInput))),
            prompts.NOT_A_PROMPT,
        ),
    ] = Field(
        description=(
            "the unit's prompt for the model: a string (sent as one user message), or a "
            "Converse-shaped request. Every text needs a character that is not whitespace (the "
            "model refuses an empty or whitespace-only text) and is valid Unicode (an unpaired "
            f"surrogate, which JSON can escape, is refused); {MAX_INPUT_CHARS:,} characters "
            "of text at most in all, and the unit as the fan-out carries it (its JSON in UTF-8, "
            "where a non-ASCII character takes 2-4 bytes) must fit a Distributed Map item "
            f"({MAX_MAP_ITEM_BYTES // 1024} KiB): a 400 naming the unit's input otherwise"
        ),
    )

    def prompt(self) -> prompts.Prompt:
        """The input as the control plane carries it (:mod:`swarm.core.prompts`)."""
        return self.input if isinstance(self.input, str) else self.input.prompt()


class ManifestRef(BaseModel):
    """Units uploaded to S3 rather than sent inline."""

    model_config = ConfigDict(extra="forbid")

    key: StrictStr = Field(
        min_length=1,
        max_length=MAX_MANIFEST_KEY_CHARS,
        description=(
            f"an object under {UPLOADS_PREFIX}<tenant>/ holding a JSON array of units "
            f"(up to {MAX_MANIFEST_UNITS:,}, {MAX_MANIFEST_BYTES // (1024 * 1024)} MiB): the "
            "key POST /uploads gave"
        ),
    )


class BatchSubmission(BaseModel):
    """Exactly one of units or manifest."""

    # the schema says "exactly one" too, so the gateway's model refuses both and neither: one
    # branch per source, given and not null (a null source counts as left out, as here)
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "oneOf": [
                {"required": ["units"], "properties": {"units": {"type": "array"}}},
                {"required": ["manifest"], "properties": {"manifest": {"type": "object"}}},
            ]
        },
    )

    lane: Lane = Field(
        default=Lane.NORMAL,
        description=(
            "one of the lanes the caller's tenant may use (cdk.json tenants); another is a 400 "
            "naming lane and listing the allowed lanes"
        ),
    )
    budget: StrictInt | None = Field(
        default=None,
        ge=0,
        le=MAX_BUDGET_TOKENS,
        description=(
            "tokens; defaults to the deployment's default budget. At most the tenant's "
            "max_budget_per_batch (cdk.json tenants) and the deployment's maximum "
            f"(budget.max_tokens, itself at most {MAX_BUDGET_TOKENS:,}): over either is a 400 "
            "naming budget"
        ),
    )
    budget_usd: UsdAmount | None = Field(
        default=None,
        description=(
            "the budget in US dollars instead of tokens (a number > 0 with at "
            f"most {USD_PLACES} decimal places, at most {MAX_BUDGET_USD:,}): admission reserves "
            "each attempt's most expensive cost at the model's prices and settlement bills "
            "what the model reports (input, output, cache reads and writes at their own rates). "
            "Give budget or budget_usd, not both (a 400 naming both). At most the tenant's "
            "max_budget_usd_per_batch (cdk.json tenants); a unit whose model has no prices, or "
            "a tenant capped in tokens only (max_budget_per_batch), refuses it with a 400 "
            "naming budget_usd (and a tenant capped in dollars only refuses budget)"
        ),
    )
    max_attempts: StrictInt | None = Field(
        default=None,
        ge=1,
        le=MAX_ATTEMPTS,
        description="attempts per unit; defaults to the deployment's setting",
    )
    # over MAX_INLINE_UNITS is a 413 naming the manifest alternative, checked before this model
    # (swarm.service.api_models.parse_submit): the bound is here for the document
    units: list[Unit] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_INLINE_UNITS,
        description="the units inline, each unit_id unique in the batch (a repeated id is a 400)",
    )
    manifest: ManifestRef | None = None

    @model_validator(mode="after")
    def one_source(self) -> BatchSubmission:
        if (self.units is None) == (self.manifest is None):
            raise ValueError("give either 'units' (inline) or 'manifest' (an S3 key), not both")
        return self


class BatchResume(BaseModel):
    """A top-up of the batch's budget, in its budget's unit: ``top_up`` (tokens) for a budget in
    tokens, ``top_up_usd`` for one in dollars; the remainder is requeued."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "oneOf": [
                {"required": ["top_up"], "properties": {"top_up": {"type": "integer"}}},
                {"required": ["top_up_usd"], "properties": {"top_up_usd": {"type": "number"}}},
            ]
        },
    )

    top_up: StrictInt | None = Field(
        default=None,
        ge=1,
        le=MAX_BUDGET_TOKENS,
        description=(
            "tokens added to a budget in tokens: the budget after it is at most the tenant's "
            "max_budget_per_batch (cdk.json tenants) and the deployment's maximum (a 400 naming "
            "top_up says how much may be added)"
        ),
    )
    top_up_usd: UsdAmount | None = Field(
        default=None,
        description=(
            "US dollars added to a budget in dollars (budget_usd), at most "
            f"{USD_PLACES} decimal places; the budget after it is at most the tenant's "
            f"max_budget_usd_per_batch (cdk.json tenants) and {MAX_BUDGET_USD:,} (a 400 naming "
            "top_up_usd says how much may be added)"
        ),
    )

    @model_validator(mode="after")
    def one_amount(self) -> BatchResume:
        if (self.top_up is None) == (self.top_up_usd is None):
            raise ValueError(
                "give top_up (tokens, for a budget in tokens) or top_up_usd (US dollars, for a "
                "budget in dollars): exactly one"
            )
        return self


class UploadRequest(BaseModel):
    """A manifest about to be uploaded (a JSON array of units, as ``units`` would hold them)."""

    model_config = ConfigDict(extra="forbid")

    size_bytes: StrictInt = Field(
        ge=1,
        le=MAX_MANIFEST_BYTES,
        description=(
            "the manifest file's exact size in bytes: the URL accepts an upload of exactly this "
            "many"
        ),
    )


# --------------------------------------------------------------------------------- responses


class UnitCounts(BaseModel):
    """The batch's units by outcome."""

    completed: int
    dead_lettered: int
    remainder: int = Field(description="not run: the budget ran out")
    running: int = Field(
        description="held by a worker claiming or running its attempt now (not yet settled)"
    )
    queued: int = Field(
        description=(
            "admitted (its tokens reserved) and waiting in its lane: visible, delayed, or "
            "hidden until its turn; not running"
        )
    )
    pending: int = Field(description="waiting for admission (a retry owed, or not yet admitted)")
    awaiting_approval: int = Field(
        default=0,
        description=(
            "agent units parked until a person decides on a tool call (GET /batches/{id}/"
            "approvals): their tokens stay reserved, no message or worker holds them"
        ),
    )


class TokenBook(BaseModel):
    """The batch's tokens: its budget, what was billed, what admitted units hold (for a budget
    in dollars, ``budget``, ``reserved`` and ``available`` are in ``usd``; here ``spent`` only)."""

    budget: int | SkipJsonSchema[None] = Field(
        default=None, description="a budget in tokens: absent for a budget in dollars"
    )
    spent: int
    reserved: int | SkipJsonSchema[None] = None
    available: int | SkipJsonSchema[None] = None


class MoneyBook(BaseModel):
    """The batch's money, exact decimal US dollars (kept as whole micro-dollars): what was billed
    at the prices of each attempt's settlement and, for a budget in dollars, its budget, what
    admitted units hold and what is left."""

    spent: str = Field(description="every settled attempt's and turn's priced usage, in dollars")
    budget: str | SkipJsonSchema[None] = Field(
        default=None, description="a budget in dollars: absent for a budget in tokens"
    )
    reserved: str | SkipJsonSchema[None] = None
    available: str | SkipJsonSchema[None] = None


class AgentTotals(BaseModel):
    """A batch's agent units so far, from its books."""

    turns: int = Field(description="model turns settled (billed, lost or refused)")
    tool_calls: int = Field(description="tool calls recorded with those turns")


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
    usd: MoneyBook | SkipJsonSchema[None] = Field(
        default=None,
        description=(
            "spend in dollars: present when the deployment prices its model (cdk.json "
            "model.prices) or the budget is in dollars"
        ),
    )
    elapsed_s: float
    healthy_line: str
    agent: AgentTotals | SkipJsonSchema[None] = Field(
        default=None,
        description="the batch's agent units so far: present once one of their turns settled",
    )
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
    units_written: int | SkipJsonSchema[None] = Field(
        default=None,
        description=(
            "while the batch is opening (state opening: its execution writes the unit records "
            "before any is admitted): how many of its units are written so far"
        ),
    )


class AgentUsage(BaseModel):
    """An agent unit's billed tokens by kind, over its turns."""

    inputTokens: int
    outputTokens: int
    cacheReadInputTokens: int
    cacheWriteInputTokens: int


class AgentFigures(BaseModel):
    """What a results page carries of an agent unit's loop."""

    turns: int = Field(description="model turns started (lost and refused ones included)")
    lost_turns: int = Field(description="turns whose answer was never recorded: billed at draw")
    refused_turns: int = Field(description="turns the model plane refused for quota: billed 0")
    tool_calls: int
    tool_errors: int = Field(description="tool calls whose result is an error")
    usage: AgentUsage
    stop: str = Field(description="completed, limit_turns, limit_tokens or failed")
    detail: str = Field(description="why it stopped, in words (empty when completed)")


class UnitResult(BaseModel):
    """One unit's outcome: the ledger's state, attempts and tokens, and its last settled
    attempt's answer (completed units) or error."""

    unit_id: str
    state: UnitState
    attempts: int = Field(description="attempts settled")
    tokens: int = Field(description="tokens billed over every attempt")
    usd: str | SkipJsonSchema[None] = Field(
        default=None,
        description=(
            "US dollars billed over every attempt, exact decimal text (whole micro-dollars): "
            "present when its attempts were priced (cdk.json model.prices)"
        ),
    )
    attempt: int | SkipJsonSchema[None] = Field(
        default=None, description="the last settled attempt (numbered from 0); absent before one"
    )
    output: str | SkipJsonSchema[None] = Field(
        default=None, description="the model's answer: present for completed units only"
    )
    output_url: str | SkipJsonSchema[None] = Field(
        default=None,
        description=(
            "instead of output, when the answer is too long to inline in a page: a short-lived "
            "URL of the attempt's stored record (JSON, the answer whole)"
        ),
    )
    error: str | SkipJsonSchema[None] = Field(
        default=None, description="why the last attempt failed (units not completed)"
    )
    stop_reason: str | SkipJsonSchema[None] = Field(
        default=None,
        description=(
            "the model's stop reason; for an agent unit, why its loop ended: completed, "
            "limit_turns, limit_tokens or failed"
        ),
    )
    input_tokens: int | SkipJsonSchema[None] = None
    output_tokens: int | SkipJsonSchema[None] = None
    model_id: str | SkipJsonSchema[None] = None
    agent: AgentFigures | SkipJsonSchema[None] = Field(
        default=None,
        description=(
            "an agent unit's loop: its turns, tool calls and why it stopped; the whole "
            "transcript is GET /batches/{batch_id}/units/{unit_id}/transcript"
        ),
    )


class TranscriptQuery(BaseModel):
    """The query of ``GET /batches/{batch_id}/units/{unit_id}/transcript``."""

    model_config = ConfigDict(extra="forbid")

    from_turn: int = Field(
        default=1, ge=1, le=1_000_000, description="the first model turn to return (1: all)"
    )


class TranscriptStop(BaseModel):
    reason: str = Field(description="completed, limit_turns, limit_tokens or failed")
    detail: str


class Transcript(BaseModel):
    """An agent unit's transcript (its event log, read as turns): every model turn with its
    draw and bill, the assistant's message, its stop reason and usage, and each tool call with
    its input, status, result and latency."""

    batch_id: str
    unit_id: str
    figures: AgentFigures | SkipJsonSchema[None] = Field(
        default=None, description="the loop's figures (absent while no turn is settled)"
    )
    answer: str = Field(description="the final answer (so far, while the loop runs)")
    stop: TranscriptStop | SkipJsonSchema[None] = Field(
        default=None, description="why the loop stopped; absent while it runs"
    )
    turns: list[dict[str, Any]] = Field(
        description=(
            "turns from from_turn on: turn, drawn, billed, lost, refused, message, stopReason, "
            "usage, tool_calls [{toolUseId, name, input, status, content, latency_s}]"
        )
    )
    next_turn: int | SkipJsonSchema[None] = Field(
        default=None, description="pass as from_turn for the rest (absent on the last part)"
    )


class ApprovalDecision(BaseModel):
    """A person's decision on one gated tool call (docs/agents.md, "Human gates")."""

    model_config = ConfigDict(extra="forbid")

    decision: Literal["approve", "reject"] = Field(
        description="approve: the tool runs (once); reject: the model gets an error result "
        "carrying the reason, and its loop goes on"
    )
    reason: str = Field(
        default="",
        max_length=1000,
        description="why (required to reject: the model reads it); kept in the transcript",
    )


class WaitingCall(BaseModel):
    """One tool call that waits for a decision."""

    unit_id: str
    toolUseId: str = Field(description="the call's id, as the model gave it")
    tool: str
    input: Any = Field(description="the input the model gave the tool")
    turn: int
    requested_at: float = Field(description="when the call started waiting (epoch seconds)")
    waited_s: float = Field(description="how long it has waited so far")
    deciders: list[str] | Literal["tenant"] = Field(
        default="tenant",
        description=(
            "who may decide the call: the operator role names (its tool's cdk.json "
            'approval.deciders, else approvals.deciders), or "tenant": the batch\'s tenant'
        ),
    )


class Approvals(BaseModel):
    """A page of a batch's tool calls that wait for a decision: the calls of up to ``limit``
    parked units, in the order of their timeouts (the longest waiting first), a unit's calls
    never split across pages."""

    batch_id: str
    waiting: list[WaitingCall]
    next_token: str | None = Field(
        default=None, description="pass as next_token for the next page; null on the last"
    )


class ApprovalsQuery(BaseModel):
    """The query of ``GET /batches/{batch_id}/approvals``."""

    model_config = ConfigDict(extra="forbid")

    limit: int = Field(
        default=DEFAULT_APPROVALS_PAGE,
        ge=1,
        le=MAX_APPROVALS_PAGE,
        description="parked units per page (each with all its waiting calls)",
    )
    next_token: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_NEXT_TOKEN_CHARS,
        description="the previous page's next_token",
    )


class Decided(BaseModel):
    """The decision recorded on a call (this one, or the same one recorded before)."""

    batch_id: str
    unit_id: str
    toolUseId: str
    tool: str
    decision: Literal["approve", "reject"]
    reason: str
    decided_by: str = Field(description="the deciding principal's ARN (or the timeout's name)")
    decided_at: float
    waited_s: float = Field(description="how long the call waited for the decision")
    recorded: bool = Field(description="false: the same decision was recorded before")
    unit_state: str = Field(
        description="the unit after it: awaiting_approval (others of its calls wait), "
        "in_flight (back in its lane) or remainder (its batch's budget ran out: a resume runs it)"
    )


class ResultsDownload(BaseModel):
    """The whole results file of a closed batch (JSON lines, one unit per line, the fields of
    a unit's result)."""

    url: str = Field(description="a presigned GET of exactly this file")
    expires_in_s: int
    location: str = Field(description="where the file is (s3://bucket/key)")


class ResultsPage(BaseModel):
    """A page of a batch's unit outcomes, in unit id order."""

    batch_id: str
    state: RunState
    units: list[UnitResult]
    next_token: str | SkipJsonSchema[None] = Field(
        default=None, description="pass as next_token for the next page; absent on the last"
    )
    download: ResultsDownload | SkipJsonSchema[None] = Field(
        default=None,
        description="present once the batch is closed and its results file is written",
    )


class ResultsQuery(BaseModel):
    """The query of ``GET /batches/{batch_id}/results``."""

    model_config = ConfigDict(extra="forbid")

    state: UnitState | None = Field(default=None, description="only units in this state")
    limit: int = Field(
        default=DEFAULT_RESULTS_PAGE, ge=1, le=MAX_RESULTS_PAGE, description="units per page"
    )
    next_token: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_NEXT_TOKEN_CHARS,
        description="the previous page's next_token",
    )


class Upload(BaseModel):
    """Where and how to upload a manifest: PUT the file to ``url`` with exactly ``headers``
    before ``expires_at``, then submit ``{"manifest": {"key": key}}``. The key is new, under the
    caller's own prefix; nobody else can submit it, and it can be written once."""

    key: str = Field(
        description=f"pass as manifest.key when submitting ({UPLOADS_PREFIX}<tenant>/...)"
    )
    url: str = Field(description="a presigned S3 URL of exactly this key")
    method: Literal["PUT"]
    headers: dict[str, str] = Field(
        description=(
            "send exactly these: S3 checks them (Content-Length: the size asked for; "
            "If-None-Match: * makes the upload write-once)"
        )
    )
    expires_in_s: int
    expires_at: int = Field(description="epoch seconds: the upload must start before then")


class RequestBucketState(BaseModel):
    """A model's request bucket (cdk.json models.catalog.<name>.rpm): one request per model
    call."""

    available: int = Field(description="requests in the bucket now")
    capacity: int = Field(description="the most it holds: one minute of the governed rate")
    rate_rps: float = Field(description="governed rate, requests/s (rpm / 60 x share)")
    effective_rate_rps: float = Field(
        description="the rate now: below rate_rps while a throttle's cut recovers"
    )


class GovernorState(BaseModel):
    """The fleet's token bucket (a snapshot; the API only reads it)."""

    available_tokens: int
    capacity_tokens: int
    governed_rate_tps: float
    effective_rate_tps: float
    throttles: int
    last_throttle_at: float | None = Field(description="epoch seconds; null: never throttled")
    output_burndown: float = Field(
        default=1.0,
        description=(
            "how many quota tokens one output token counts as (Bedrock's token burndown "
            "rate, cdk.json models.catalog.<name>.output_burndown): the figures above are "
            "quota tokens"
        ),
    )
    requests: RequestBucketState | None = Field(
        default=None,
        description=(
            "the request bucket beside the tokens, each model call taking one (null: "
            "the model's requests per minute are not governed: cdk.json gives it no rpm)"
        ),
    )


class LaneDepthView(BaseModel):
    """One lane's messages (a message carries one unit, or a bundle of units due together: at
    most the deployment's worker.bundle_units)."""

    visible: int = Field(description="waiting to be received")
    in_flight: int = Field(
        description=(
            "not visible: received by a worker, or hidden by one until its unit's turn (queued "
            "work, not running: GET /drain counts what runs)"
        )
    )
    delayed: int = Field(description="handed back with a delay, not yet visible")


class ModelState(BaseModel):
    """One model of the registry and its bucket."""

    model_id: str | None = Field(
        description="its Bedrock model id or inference profile (null: the plane's own)"
    )
    default: bool = Field(description="the model a unit that names none takes")
    governor: GovernorState


class Fleet(BaseModel):
    """The governors (one per model), the lanes and the drain switch."""

    draining: bool
    governor: GovernorState = Field(description="the default model's bucket")
    models: dict[str, ModelState] = Field(
        default_factory=dict,
        description="by name (what a unit's input.model gives): each model and its own bucket",
    )
    lanes: dict[str, LaneDepthView] = Field(description="by lane: high, normal, low")
    in_flight: int
    queued: int = Field(description="visible and delayed, every lane")


class Drain(BaseModel):
    """The drain switch and whether it is safe to deploy."""

    draining: bool
    settled: bool = Field(
        description=(
            "the switch's value has reached every function (they cache it for a few seconds: "
            "a submit or a worker may act on the old value until then)"
        )
    )
    running: int = Field(
        description=(
            "units of worker invocations claiming or running attempts now (not yet settled). "
            "Only these hold up a deploy"
        )
    )
    queued: int = Field(
        description=(
            "messages in the lanes: visible, delayed, and hidden by a worker until their "
            "unit's turn (a unit deep in its tenant's queue waits hidden for up to 12 hours). "
            "Queued work stays queued across a deploy and runs once the drain is off"
        )
    )
    safe_to_deploy: bool = Field(
        description=(
            "the drain switch is on, settled, and nothing is running, however deep the "
            "lanes. The API cannot see "
            "the workers' event source mappings: the drain function's own report, by the same "
            "rule (swarm.service.drain.safe_to_deploy), also requires every one to be stopped"
        )
    )


class Rebound(BaseModel):
    """A tenant's role binding, forgotten."""

    tenant: str
    was_bound: bool = Field(description="false: the tenant had no binding")


class ErrorCode(StrEnum):
    """The codes the API function answers errors with."""

    INVALID_REQUEST = "invalid_request"
    UNAUTHENTICATED = "unauthenticated"
    FORBIDDEN = "forbidden"
    NOT_FOUND = "not_found"
    CONFLICT = "conflict"
    TOO_LARGE = "too_large"
    SHEDDING = "shedding"
    TENANT_QUEUE = "tenant_queue"  # the caller's own max_queued_units, not the fleet's load
    DRAINING = "draining"
    MISCONFIGURED = "misconfigured"


class Error(BaseModel):
    """Every error."""

    error: str = Field(
        description=(
            "the API function's code: "
            + ", ".join(code.value for code in ErrorCode)
            + "; or, for an error API Gateway answers before the function runs, its response "
            "type (e.g. MISSING_AUTHENTICATION_TOKEN, ACCESS_DENIED, THROTTLED, "
            "REQUEST_TOO_LARGE; a body that fails the request model is invalid_request)"
        )
    )
    message: str
