"""The batch API's behaviour: submit (inline units or the tenant's uploaded manifest, the
``Idempotency-Key``), status, resume, the fleet and drain views; every answer is built through
the response models of :mod:`swarm.api.models`.

Submission order is chosen so a failure leaves nothing half-written that a retry cannot finish:
everything is validated first; then the map manifest and the spec (every unit's id and projected
tokens: ``manifests/<run>/spec.json``) go to S3 (an orphan object is harmless and expires by
lifecycle rule), then the ledger records the run as ``opening`` (two items in one transaction,
idempotent for the same spec), then the fan-out execution starts, named after the batch id
(idempotent by name): its first step writes the unit records in pages and opens the run
(:mod:`swarm.service.opener`). The submit's own writes are O(1) in the batch size. A client that
retries with the same ``Idempotency-Key`` gets the same batch id, so a retried submit resumes
exactly where the failed one stopped and never creates a second batch.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from swarm.api.models import (
    BATCH_ID_PREFIX,
    MAX_BUDGET_USD,
    MAX_IDEMPOTENCY_KEY_CHARS,
    MAX_MANIFEST_BYTES,
    MAX_MAP_ITEM_BYTES,
    MAX_REMAINDER_LISTED,
    AgentTotals,
    BatchResume,
    BatchStatus,
    BatchSubmission,
    Fleet,
    GovernorState,
    LaneDepthView,
    ModelState,
    MoneyBook,
    RequestBucketState,
    TokenBook,
    Unit,
    UnitCounts,
)
from swarm.contract import DEFAULT_UNITS_PER_CHILD
from swarm.core import agent
from swarm.core.agent import Tool
from swarm.core.backpressure import (
    MIN_RETRY_AFTER_S,
    Shed,
    ShedPolicy,
    binding_snapshot,
    drain_rate,
    shed_decision,
    tenant_shed,
)
from swarm.core.burndown import asked_output, call_output_bound, unit_draw
from swarm.core.codec import spec_to_doc
from swarm.core.errors import (
    Conflict,
    Contended,
    InvalidInput,
    NotFound,
    ObjectTooLarge,
    ReadDenied,
    SwarmError,
)
from swarm.core.governor import GovernorSnapshot, check_amount
from swarm.core.ports import (
    BlobStore,
    DrainSwitch,
    Executions,
    Governor,
    LaneDepth,
    LaneQueue,
    Ledger,
    RunningUnits,
    RunningWork,
)
from swarm.core.pricing import MICRO, Prices, parse_usd, unit_cost_bound, usd
from swarm.core.prompts import Prompt
from swarm.core.records import (
    Lane,
    RunRecord,
    RunSpec,
    RunState,
    UnitSpec,
    UnitState,
    check_id,
)
from swarm.core.report import healthy_line
from swarm.core.routes import ModelRoute, ModelRoutes
from swarm.core.scheduling import fanout_order
from swarm.core.tenancy import (
    MAX_HOLDS,
    TenantPolicy,
    TenantQueue,
    check_batch_size,
    check_budget,
    check_budget_usd,
    check_lane,
)
from swarm.service.api_models import TooLarge, check_manifest_key, parse_manifest_units
from swarm.service.drain import drain_view

DRAIN_RETRY_AFTER_S = 60


class Draining(SwarmError):
    """The drain switch is on: intake is stopped for a deploy."""

    retry_after_s = DRAIN_RETRY_AFTER_S


#: decisions on a tenant's queued units before a submission colliding with the tenant's others
#: is refused (429): each collision means another submission of the tenant was just accepted
QUEUE_HOLD_TRIES = 3


class Shedding(SwarmError):
    """Backpressure: the tenant's own queue is full, the lanes are too deep or the model plane
    is throttling."""

    def __init__(self, shed: Shed, tenant: str | None = None) -> None:
        if shed.reason == "tenant_busy":
            message = (
                f"other submissions of tenant {tenant!r} were being decided at the same moment "
                f"(tenant_queue; at most {MAX_HOLDS} a minute); retry after {shed.retry_after_s}s"
            )
        elif shed.reason == "tenant_queue":
            message = (
                f"tenant {tenant!r} has {shed.tenant_queued:,} units queued and may have at most "
                f"{shed.tenant_max:,} (tenant_queue; cdk.json tenants); retry after "
                f"{shed.retry_after_s}s, when its queued work has drained"
            )
            if shed.drain_units_s is not None:
                message += f" (it drains at {shed.drain_units_s:.1f} units/s)"
        else:
            message = (
                f"the control plane is shedding load ({shed.reason}, {shed.depth_ahead} units "
                f"ahead); retry after {shed.retry_after_s}s"
            )
        super().__init__(message)
        self.shed = shed
        self.retry_after_s = shed.retry_after_s


@dataclass(frozen=True)
class UnitInput:
    unit_id: str
    projected_tokens: int
    input: Prompt = ""  # swarm.core.prompts: a prompt text or a Converse-shaped request


@dataclass(frozen=True)
class SubmitRequest:
    lane: Lane
    budget: int  # tokens, or micro-dollars when ``usd``
    max_attempts: int
    units: Sequence[UnitInput]
    usd: bool = False  # the budget is in micro-dollars (budget_usd)


@dataclass(frozen=True)
class Submitted:
    run: RunRecord
    created: bool  # False: an earlier submit with the same Idempotency-Key made it


@dataclass(frozen=True)
class BatchesConfig:
    shed_policy: ShedPolicy
    max_budget: int
    default_budget: int = 0  # a submission that gives no budget
    default_attempts: int = 3  # a submission that gives no max_attempts
    # per tenant: lanes, queue cap and share, budget per batch (default: no limits of their own)
    tenants: TenantPolicy = field(default_factory=TenantPolicy)
    # a map child's units at most (cdk.json fanout.units_per_child): one child, one chunk
    units_per_child: int = DEFAULT_UNITS_PER_CHILD
    # the most units one lane message carries (cdk.json worker.bundle_units): SQS counts the
    # lanes' messages, and the shed depths count units
    units_per_message: int = 1
    #: the deployment's tools (cdk.json ``tools``), which an agent unit's input names
    tools: Mapping[str, Tool] = field(default_factory=dict)
    #: the tools a tenant may use (cdk.json ``tenants``' ``tools``: the defaults, or its own)
    allowed_tools: Callable[[str], frozenset[str]] = lambda tenant: frozenset()
    #: the one model's prices, without ``models`` (cdk.json ``model.prices``): each unit's
    #: projected cost, and budgets in dollars. None: spend in tokens only, budget_usd refused
    prices: Prices | None = None


def manifest_key(run_id: str, part: str = "units") -> str:
    return f"manifests/{run_id}/{part}.json"


def spec_key(run_id: str) -> str:
    """The run's spec with its unit list, as the open step reads it."""
    return manifest_key(run_id, "spec")


def results_key(run_id: str, state: RunState, epoch: int) -> str:
    """One object per closure: a run closes as exhausted at most once per exhaustion epoch and
    as completed once, so ``state-epoch`` never repeats."""
    return f"results/{run_id}/{state.value}-{epoch}.json"


def batch_id_for(tenant: str, idempotency_key: str | None) -> str:
    if idempotency_key is None:
        return f"{BATCH_ID_PREFIX}{uuid.uuid4().hex[:24]}"
    digest = hashlib.sha256(f"{tenant}\0{idempotency_key}".encode()).hexdigest()
    return f"{BATCH_ID_PREFIX}{digest[:24]}"


def manifest_unit(unit_id: str, input_: Prompt) -> dict[str, Any]:
    """One unit as a manifest chunk holds it: what the fan-out needs and the ledger does not
    hold (the ledger is the truth for the tenant, the lane, the budget and the projection)."""
    return {"unit_id": unit_id, "input": input_}


def map_child_input(run_id: str, index: int, chunk: Mapping[str, Any]) -> dict[str, Any]:
    """What one Distributed Map child starts with (the ``ItemSelector`` of
    statemachines/fanout.asl.json): the manifest's chunk ``index``, wrapped."""
    return {"batch_id": run_id, "index": index, "chunk": dict(chunk)}


def _json_bytes(doc: Any) -> int:
    """The size Step Functions measures a payload in: its JSON, in UTF-8."""
    return len(json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode())


def child_input_bytes(run_id: str, index: int, chunk: Mapping[str, Any]) -> int:
    """The exact size of the map child's input for ``chunk`` at ``index`` (256 KiB at most)."""
    return _json_bytes(map_child_input(run_id, index, chunk))


def check_fits_the_fan_out(run_id: str, units: Sequence[Mapping[str, Any]]) -> None:
    """Every unit must fit a map child's input (256 KiB) alone in its chunk, or it could never
    be admitted: refuse the batch with the unit's field named, before anything is written.
    ``units`` (:func:`manifest_unit`) in submission order. Measured at the last index the
    manifest could give its chunk (one unit per chunk), so the chunker can always place it."""
    last = max(0, len(units) - 1)
    for index, unit in enumerate(units):
        size = child_input_bytes(run_id, last, {"run_id": run_id, "units": [dict(unit)]})
        if size > MAX_MAP_ITEM_BYTES:
            raise InvalidInput(
                f"units[{index}].input",
                f"unit {unit['unit_id']!r} is {size:,} bytes as the fan-out carries it (its "
                f"JSON in UTF-8, where a non-ASCII character takes 2-4 bytes); the limit is "
                f"{MAX_MAP_ITEM_BYTES:,}: shorten its input",
            )


def chunk_units(
    run_id: str, units: Sequence[Mapping[str, Any]], units_per_child: int
) -> list[dict[str, Any]]:
    """The Distributed Map's items: ``units`` (:func:`manifest_unit`, in fan-out order) cut in
    order into chunks ``{"run_id", "units": [...]}`` of at most ``units_per_child`` units each,
    and each small enough that its child's input (:func:`child_input_bytes`, exactly) is at
    most MAX_MAP_ITEM_BYTES. One child execution and one fan-out invocation per chunk: the
    billing of an ``ItemBatcher``, which moto cannot run (statemachines/fanout.asl.json)."""
    if units_per_child < 1:
        raise InvalidInput("units_per_child", f"must be at least 1, got {units_per_child!r}")
    chunks: list[dict[str, Any]] = []
    current: list[dict[str, Any]] = []
    current_bytes = 0  # the current chunk's units' JSON, without the commas between them
    base = child_input_bytes(run_id, 0, {"run_id": run_id, "units": []})

    def close() -> None:
        nonlocal current, current_bytes, base
        chunks.append({"run_id": run_id, "units": current})
        current, current_bytes = [], 0
        base = child_input_bytes(run_id, len(chunks), {"run_id": run_id, "units": []})

    for unit in units:
        item = dict(unit)
        size = _json_bytes(item)
        # the child's JSON is its empty form plus each unit's, with a comma between two units
        if current and (
            len(current) >= units_per_child
            or base + current_bytes + len(current) + size > MAX_MAP_ITEM_BYTES
        ):
            close()
        if base + size > MAX_MAP_ITEM_BYTES:  # check_fits_the_fan_out refuses it at submit
            raise InvalidInput(
                "units", f"unit {item['unit_id']!r} does not fit a map child's input alone"
            )
        current.append(item)
        current_bytes += size
    if current:
        close()
    return chunks


def manifest_items(
    spec: RunSpec, inputs: Mapping[str, Prompt], units_per_child: int
) -> list[dict[str, Any]]:
    """The manifest the Distributed Map reads: the run's units in the scheduling policy's
    fan-out order (swarm.core.scheduling: largest first), cut into chunks (:func:`chunk_units`),
    so the order holds across chunks."""
    ordered = fanout_order(spec.units, lambda u: u.projected_tokens)
    units = [manifest_unit(u.unit_id, inputs.get(u.unit_id, "")) for u in ordered]
    return chunk_units(spec.run_id, units, units_per_child)


def manifest_units(doc: Any) -> list[dict[str, Any]]:
    """Every unit of a manifest, in its order: a chunk's units (``{"run_id", "units"}``), or an
    item that is one unit itself (a manifest written before chunks, whose run may still be
    open: its items also carried the tenant, lane and projection, which nothing reads)."""
    units: list[dict[str, Any]] = []
    for item in doc:
        if isinstance(item, Mapping) and isinstance(item.get("units"), list):
            units.extend(item["units"])
        else:
            units.append(item)
    return units


def execution_input(run_id: str, key: str, opening: bool = False) -> dict[str, Any]:
    """An execution's input; ``opening``: the run is still being opened, so the execution
    starts with the open step (statemachines/fanout.asl.json ``OpenUnits``) at cursor 0 (the
    step's idempotent: a run open already is left alone)."""
    doc: dict[str, Any] = {"batch_id": run_id, "manifest_key": key}
    if opening:
        doc["open"] = {"spec_key": spec_key(run_id), "cursor": 0, "done": False}
    return doc


@dataclass
class Batches:
    ledger: Ledger
    governor: Governor
    queue: LaneQueue
    blobs: BlobStore
    executions: Executions
    drain: DrainSwitch
    config: BatchesConfig
    #: the register of running work: what a batch status and the drain view count as running
    #: (None: nothing is counted as running; tests without workers)
    running: RunningWork | None = None
    #: the registry's models (cdk.json ``models``): a unit names one its tenant may use, and
    #: its draws are checked against that model's bucket (an agent unit's toolChoice against
    #: its Bedrock id). None: one model, ``governor`` (its toolChoices not checked)
    models: ModelRoutes | None = None

    def _route(self, tenant: str, unit: UnitInput, field: str) -> ModelRoute:
        """The model ``unit`` (at ``field``, e.g. ``units[3]``) names, or the default; a 400
        naming ``<field>.input.model`` for a model not registered or not the tenant's."""
        if self.models is None:
            return ModelRoute("default", None, self.governor, self.config.prices)
        allowed = self.config.tenants.of(tenant).models
        return self.models.check(unit.input, allowed, f"{field}.input")

    # ------------------------------------------------------------------ submit

    def submit_body(
        self, tenant: str, body: BatchSubmission, idempotency_key: str | None, now: float
    ) -> Submitted:
        """``POST /batches``: the units inline or read from the tenant's uploaded manifest, the
        deployment's defaults for what the body leaves out, then :meth:`submit`."""
        if idempotency_key is not None and not (
            1 <= len(idempotency_key) <= MAX_IDEMPOTENCY_KEY_CHARS
        ):
            raise InvalidInput(
                "Idempotency-Key", f"must be 1-{MAX_IDEMPOTENCY_KEY_CHARS} characters"
            )
        if body.manifest is not None:
            units = self._upload(tenant, body.manifest.key)
        else:
            units = body.units or []  # the model requires exactly one of the two
        usd_budget = None
        if body.budget_usd is not None:
            if body.budget is not None:
                raise InvalidInput(
                    "budget, budget_usd",
                    "give the budget in tokens (budget) or in US dollars (budget_usd), not both",
                )
            usd_budget = parse_usd(body.budget_usd, "budget_usd", positive=True)
        request = SubmitRequest(
            lane=body.lane,
            budget=(
                usd_budget
                if usd_budget is not None
                else self.config.default_budget
                if body.budget is None
                else body.budget
            ),
            max_attempts=(
                self.config.default_attempts if body.max_attempts is None else body.max_attempts
            ),
            units=[UnitInput(u.unit_id, u.projected_tokens, u.prompt()) for u in units],
            usd=usd_budget is not None,
        )
        self._check_agents(tenant, request.units, "manifest.units" if body.manifest else "units")
        return self.submit(tenant, request, idempotency_key, now)

    def _check_usd_budget(
        self, tenant: str, budget_micro: int, routes: Sequence[ModelRoute]
    ) -> None:
        """A budget in dollars needs every unit's model's prices (a 400 naming the first unit
        whose model has none) and stays within the tenant's cap in dollars; a tenant whose cap
        is in tokens only cannot give one (400s naming budget_usd)."""
        for index, route in enumerate(routes):
            if route.prices is None:
                raise InvalidInput(
                    "budget_usd",
                    f"units[{index}]'s model {route.name!r} has no prices (cdk.json "
                    f"models.catalog.{route.name}.prices): give budget in tokens",
                )
        if budget_micro > MAX_BUDGET_USD * MICRO:
            raise InvalidInput(
                "budget_usd", f"${usd(budget_micro)} is above the maximum of ${MAX_BUDGET_USD:,}"
            )
        check_budget_usd(tenant, self.config.tenants.of(tenant), budget_micro)

    def _projected_micro(self, unit: UnitInput, prices: Prices | None) -> int:
        """The most one attempt of ``unit`` can cost at its model's ``prices`` (0: no prices):
        its projected tokens, at most its ``maxTokens`` of them output (none asked, or an agent
        unit's loop: any split). Not Bedrock's adapter's cap on the answer: a model plane
        without it (the simulated one) would bill past the projection, and a budget in dollars
        must never be overrun."""
        if prices is None:
            return 0
        tokens = unit.projected_tokens
        if agent.is_agent_input(unit.input):
            return unit_cost_bound(tokens, tokens, prices)
        bound = call_output_bound(tokens, asked_output(unit.input))
        return unit_cost_bound(tokens, bound, prices)

    def _check_agents(self, tenant: str, units: Sequence[UnitInput], field: str) -> None:
        """Every agent unit's input against the tool registry and the tenant's tools (a 400
        naming the unit's field: an unknown tool, a tool the tenant may not use, a toolChoice
        naming a tool the unit does not list or one the deployment's model does not take, a
        cap its first turn cannot fit)."""
        for index, unit in enumerate(units):
            if agent.is_agent_input(unit.input):
                self._agent_spec(tenant, unit, f"{field}[{index}]")

    def _agent_spec(self, tenant: str, unit: UnitInput, field: str) -> agent.AgentSpec:
        """The agent unit ``unit`` (at ``field``, e.g. ``units[3]``) as the worker will run it,
        or InvalidInput naming the field at fault (``units[3].input.tools[0]``, ...)."""
        return agent.parse_agent_input(
            unit.input,
            batch="check",
            unit=unit.unit_id,
            projected_tokens=unit.projected_tokens,
            registry=self.config.tools,
            allowed=self.config.allowed_tools(tenant),
            field=f"{field}.input",
            cap_field=f"{field}.projected_tokens",
            model_id=self._route(tenant, unit, field).model_id,
        )

    def _upload(self, tenant: str, key: str) -> list[Unit]:
        """The units of a manifest the tenant uploaded: every problem is a 400 on
        ``manifest.key`` (nothing is written yet, so a 4xx is safe whatever S3 meant), or a 413
        for one over the size limit (its body is not read, whatever wrote it)."""
        check_manifest_key(tenant, key)
        try:
            doc = self.blobs.get_json(key, max_bytes=MAX_MANIFEST_BYTES)
        except NotFound:
            raise InvalidInput(
                "manifest.key", f"no object {key!r}: upload the manifest there, then submit"
            ) from None
        except ObjectTooLarge as e:
            raise TooLarge(
                f"manifest.key: {e}: split the units into batches of at most "
                f"{MAX_MANIFEST_BYTES // (1024 * 1024)} MiB each"
            ) from None
        except ReadDenied:
            # With the stack's s3:ListBucket grant on manifests/* a missing key is a 404
            # (above), so this is an object the API may not read (e.g. uploaded with SSE-KMS
            # under the tenant's own key); without that grant, S3 says 403 for a missing key.
            raise InvalidInput(
                "manifest.key",
                f"cannot read {key!r}: it does not exist, or it was uploaded in a way this "
                "service cannot read (upload it again with the bucket's default encryption)",
            ) from None
        except InvalidInput as e:  # the object is not JSON
            raise InvalidInput("manifest.key", f"{key!r} is {e.message}") from None
        return parse_manifest_units(doc)

    def submit(
        self, tenant: str, request: SubmitRequest, idempotency_key: str | None, now: float
    ) -> Submitted:
        limits = self.config.tenants.of(tenant)
        # each unit's model (a 400 naming units[i].input.model: not registered, not the tenant's)
        routes = [self._route(tenant, u, f"units[{i}]") for i, u in enumerate(request.units)]
        if request.usd:
            self._check_usd_budget(tenant, request.budget, routes)
        elif request.budget > self.config.max_budget:
            raise InvalidInput(
                "budget",
                f"{request.budget:,} is above this deployment's maximum of "
                f"{self.config.max_budget:,} tokens",
            )
        # the tenant's own limits (swarm.core.tenancy), validated like the rest of the body
        check_lane(tenant, limits, request.lane)
        if not request.usd:
            check_budget(tenant, limits, request.budget)
        check_batch_size(tenant, limits, len(request.units))
        run_id = batch_id_for(tenant, idempotency_key)
        spec = RunSpec(
            run_id=run_id,
            tenant=tenant,
            lane=request.lane,
            budget=request.budget,
            units=tuple(
                UnitSpec(u.unit_id, u.projected_tokens, self._projected_micro(u, route.prices))
                for u, route in zip(request.units, routes, strict=True)
            ),
            max_attempts=request.max_attempts,
            usd=request.usd,
            # what a lost attempt's record names as its prices (its cost is its own unit's
            # projection, at its own model's): the first unit's model's
            prices=next((r.prices for r in routes if r.prices is not None), None),
        )
        # a unit the governor can never grant would retry until its dead letter (an agent
        # unit draws turn by turn: its first turn's draw; a later turn too large for the bucket
        # stops it limit_tokens, swarm.core.agent.AgentSpec.max_draw)
        # (in quota tokens: the output bound counted at the model's burndown,
        # docs/explanation/governor.md) (each against its model's bucket: a model the tenant may not
        # use is a 400 here)
        for index, (u, route) in enumerate(zip(request.units, routes, strict=True)):
            config = route.governor.config
            burndown = config.output_burndown
            amount = u.projected_tokens
            if agent.is_agent_input(u.input):
                loop = self._agent_spec(tenant, u, f"units[{index}]")
                amount = agent.first_draw(replace(loop, output_burndown=burndown))
            else:  # what its worker draws (its tokens at burndown 1)
                amount = unit_draw(amount, u.input, burndown)
            try:
                check_amount(config, amount, request.lane)
            except InvalidInput as e:
                raise InvalidInput(f"units[{index}].projected_tokens", e.message) from None
        inputs = {u.unit_id: u.input for u in request.units}
        # in submission order: its errors name units[i]
        check_fits_the_fan_out(run_id, [manifest_unit(u.unit_id, u.input) for u in request.units])
        items = manifest_items(spec, inputs, self.config.units_per_child)
        # a replay too: it may start the batch's execution (a first attempt that died before)
        # cached for a few seconds: GET /drain calls a deploy safe only once every cache has
        # seen the switch (swarm.service.drain.safe_to_deploy)
        if self.drain.draining():
            raise Draining("the control plane is draining for a deploy; intake is stopped")
        if idempotency_key is not None:
            existing = self._existing(spec, items)
            if existing is not None:
                opening = existing.state is RunState.OPENING
                payload = execution_input(run_id, manifest_key(run_id), opening)
                self.executions.start(run_id, payload)
                return Submitted(existing, created=False)
        avg = spec.projected_total / spec.units_total
        # units queued, at most: a message carries up to units_per_message of them, so a lane
        # sheds no later than at its depth limit in units (a bundle of fewer sheds sooner)
        per_message = self.config.units_per_message
        depths = {lane: d.queued * per_message for lane, d in self.queue.depths().items()}
        policy = self.config.shed_policy
        # the buckets of the models its units name: one read each (swarm.core.backpressure)
        governors = {id(route.governor): route.governor for route in routes}.values()
        snapshot = binding_snapshot(
            [governor.snapshot(now) for governor in governors], now, policy.throttle_window_s
        )

        def decide(queue: TenantQueue | None) -> Shed | None:
            return shed_decision(policy, spec.lane, depths, snapshot, avg, now, queue)

        # the tenant's queued units (ledger reads, and a hold) matter only with a cap or a share
        if limits.max_queued_units is not None or limits.guaranteed_units > 0:
            self._decide_and_hold(tenant, run_id, spec.units_total, now, decide)
        elif (shed := decide(None)) is not None:
            raise Shedding(shed, tenant)
        key = manifest_key(run_id)
        self.blobs.put_json(key, items)
        self.blobs.put_json(spec_key(run_id), spec_to_doc(spec))
        run = self.ledger.begin_open(spec, spec_key(run_id), now)
        self.executions.start(run_id, execution_input(run_id, key, run.state is RunState.OPENING))
        return Submitted(run, created=True)

    def _decide_and_hold(
        self,
        tenant: str,
        run_id: str,
        units: int,
        now: float,
        decide: Callable[[TenantQueue], Shed | None],
    ) -> None:
        """Decide on the tenant's queued units and hold them for ``run_id`` (Ledger.hold_queue),
        deciding again on a fresh count when another submission of the tenant held meanwhile:
        racing submissions cannot both pass its cap. Shedding (429) when the decision refuses,
        or when the tenant's submissions keep colliding."""
        limits = self.config.tenants.of(tenant)
        for _ in range(QUEUE_HOLD_TRIES):
            view = self.ledger.tenant_queue(tenant, now)
            rate = drain_rate(view.progress, now)  # its queue's measured drain: Retry-After
            shed = decide(TenantQueue(tenant, limits, view.units, units, rate))
            if shed is not None:
                raise Shedding(shed, tenant)
            try:
                self.ledger.hold_queue(tenant, view.version, run_id, units, now)
                return
            except Contended:
                continue
        raise Shedding(Shed("tenant_busy", MIN_RETRY_AFTER_S, 0), tenant)

    def _existing(self, spec: RunSpec, items: list[dict[str, Any]]) -> RunRecord | None:
        """The batch this Idempotency-Key already made, if the request is the same one: the same
        spec (lane, budget, units and their projections) and the same inputs (as its manifest
        holds them); a different request under the key is a Conflict."""
        try:
            run = self.ledger.run(spec.run_id, opening=True)
        except NotFound:
            return None
        same = run.spec == spec  # run-level fields and the units' digest
        # a manifest expired by the bucket's lifecycle leaves the spec as all there is to compare
        with contextlib.suppress(NotFound):
            if same:
                stored = manifest_units(self.blobs.get_json(manifest_key(spec.run_id)))
                # in any order and any chunking: a batch fanned out before the order or the
                # chunks changed is the same batch
                same = _unit_inputs(stored) == _unit_inputs(manifest_units(items))
        if not same:
            raise Conflict(
                "this Idempotency-Key was used for a different batch; use a new key for new work"
            )
        return run

    # ------------------------------------------------------------------ status

    def run_for(self, tenant: str | None, run_id: str) -> RunRecord:
        """The tenant's run ``run_id``; NotFound for an id that is not one of its batches.
        ``tenant`` None: an operator's read, of any batch."""
        try:
            # a batch id from the path is checked before it reaches a key (DynamoDB refuses a
            # partition key over 2,048 bytes with a ValidationException): one that cannot exist
            # is not found
            run: RunRecord | None = self.ledger.run(check_id("batch_id", run_id), opening=True)
        except (NotFound, InvalidInput):
            run = None
        # never reveal another tenant's batch: the same error as for an id that does not exist
        if run is None or (tenant is not None and run.spec.tenant != tenant):
            raise NotFound(f"no batch {run_id!r}")
        return run

    def status(self, tenant: str | None, run_id: str, now: float) -> dict[str, Any]:
        return self.describe(self.run_for(tenant, run_id), now)

    def describe(self, run: RunRecord, now: float) -> dict[str, Any]:
        """The status document of a run the caller already holds (and may see)."""
        return _doc(self._status(run, now))

    def _status(self, run: RunRecord, now: float) -> BatchStatus:
        elapsed = (run.closed_at if run.closed_at is not None else now) - run.opened_at
        remainder = None
        if run.state in (RunState.EXHAUSTING, RunState.EXHAUSTED):
            remainder = [
                u.unit_id for u in self.ledger.units(run.run_id) if u.state is UnitState.REMAINDER
            ][:MAX_REMAINDER_LISTED]
        running = 0
        if self.running is not None and run.in_flight:
            running = min(run.in_flight, self.running.running(now).by_run.get(run.run_id, 0))
        return BatchStatus(
            batch_id=run.run_id,
            tenant=run.spec.tenant,
            lane=run.spec.lane,
            state=run.state,
            units=run.units_total,
            counts=UnitCounts(
                completed=run.completed,
                dead_lettered=run.dead_lettered,
                remainder=run.remainder,
                running=running,
                queued=run.in_flight - running,
                pending=run.pending,
                awaiting_approval=run.awaiting,
            ),
            attempts=run.attempts,
            retries=run.retries,
            tokens=(
                TokenBook(spent=run.spent)
                if run.spec.usd
                else TokenBook(
                    budget=run.budget,
                    spent=run.spent,
                    reserved=run.reserved,
                    available=run.available,
                )
            ),
            usd=(
                MoneyBook(
                    spent=usd(run.spent_micro),
                    budget=usd(run.budget),
                    reserved=usd(run.reserved),
                    available=usd(run.available),
                )
                if run.spec.usd
                else MoneyBook(spent=usd(run.spent_micro))
                if run.spec.prices is not None or run.spent_micro
                else None
            ),
            elapsed_s=round(elapsed, 3),
            healthy_line=healthy_line(run, elapsed),
            remainder=remainder,
            units_written=run.units_written if run.state is RunState.OPENING else None,
            agent=AgentTotals(turns=run.turns, tool_calls=run.tool_calls) if run.turns else None,
        )

    # ------------------------------------------------------------------ resume

    def resume_body(
        self, tenant: str, run_id: str, body: BatchResume, now: float
    ) -> dict[str, Any]:
        """``POST /batches/{id}/resume``: ``top_up`` (tokens) for a budget in tokens,
        ``top_up_usd`` for one in dollars (400s naming the field otherwise)."""
        run = self.run_for(tenant, run_id)
        if body.top_up is not None and body.top_up_usd is not None:
            raise InvalidInput(
                "top_up, top_up_usd", "give top_up (tokens) or top_up_usd (dollars), not both"
            )
        if run.spec.usd:
            if body.top_up_usd is None:
                raise InvalidInput(
                    "top_up_usd" if body.top_up is None else "top_up",
                    f"batch {run_id}'s budget is in dollars: give top_up_usd",
                )
            amount = parse_usd(body.top_up_usd, "top_up_usd", positive=True)
        else:
            if body.top_up is None:
                raise InvalidInput(
                    "top_up" if body.top_up_usd is None else "top_up_usd",
                    f"batch {run_id}'s budget is in tokens: give top_up",
                )
            amount = body.top_up
        return self.resume(tenant, run_id, amount, now)

    def resume(self, tenant: str, run_id: str, top_up: int, now: float) -> dict[str, Any]:
        """A top-up of ``top_up`` in the budget's unit: tokens, or micro-dollars for a budget
        in dollars."""
        run = self.run_for(tenant, run_id)
        if run.state is RunState.COMPLETED:
            raise Conflict(f"batch {run_id} is completed: there is nothing to resume")
        if run.state is RunState.OPENING:
            raise Conflict(f"batch {run_id} is being opened: there is nothing to resume yet")
        if self.drain.draining():
            raise Draining("the control plane is draining for a deploy; resume after it")
        self._check_resume(tenant, run, top_up)
        # read what the requeue needs before the top-up commits: a manifest gone (the bucket's
        # lifecycle expired it) must refuse the resume, not leave the run reopened with nothing
        # fanned out
        try:
            original = manifest_units(self.blobs.get_json(manifest_key(run_id)))
        except (NotFound, ReadDenied):
            # ReadDenied is read as "expired" here, and only here among our own objects: this
            # role wrote the manifest itself (SSE-S3, bucket-owner-enforced) and may read
            # manifests/*, so S3's 403 can only mean the key is gone and s3:ListBucket is
            # missing (a stack from before the grant). Acting on it is a refusal that writes
            # nothing, so a wrong reading costs a 409, never a wrong write.
            raise Conflict(
                f"batch {run_id}'s manifest has expired (the bucket's lifecycle rule): it cannot "
                "be resumed; submit the remainder as a new batch"
            ) from None
        limits = self.config.tenants.of(tenant)
        cap = limits.max_budget_per_batch
        ceiling = self.config.max_budget if cap is None else min(cap, self.config.max_budget)
        if run.spec.usd:
            usd_cap = limits.max_budget_micro_per_batch
            ceiling = MAX_BUDGET_USD * MICRO if usd_cap is None else usd_cap
        # the remainder the resume queues again, within the tenant's queue cap (429), held last
        # and only for a top-up the ledger will take: a refused resume writes nothing
        valid = type(top_up) is int and 0 < top_up <= ceiling - run.budget
        if run.remainder > 0 and limits.max_queued_units is not None and valid:
            avg = run.spec.projected_total / max(1, run.spec.units_total)
            snapshot = self.governor.snapshot(now)
            self._decide_and_hold(
                tenant,
                run.run_id,
                run.remainder,
                now,
                lambda queue: tenant_shed(queue, avg, snapshot),
            )
        top = self.ledger.top_up(run_id, top_up, now, ceiling)
        if top.requeue:
            # the exhaustion this top-up ended (read atomically with it, not before: the run may
            # have exhausted again meanwhile); each exhaustion is resumed at most once, so the
            # execution's name and its manifest never collide with an earlier resume's
            epoch = top.run.exhaustions
            wanted = set(top.requeue)
            units = [
                manifest_unit(item["unit_id"], item.get("input", ""))
                for item in original  # in the fan-out order it was written in
                if item["unit_id"] in wanted
            ]
            key = manifest_key(run_id, f"resume-{epoch}")
            self.blobs.put_json(key, chunk_units(run_id, units, self.config.units_per_child))
            self.executions.start(f"{run_id}-resume-{epoch}", execution_input(run_id, key))
        status = self._status(self.run_for(tenant, run_id), now)
        return _doc(status.model_copy(update={"requeued": len(top.requeue)}))

    def _check_resume(self, tenant: str, run: RunRecord, top_up: int) -> None:
        """The tenant's limits as they stand now: the batch's lane must still be one of its
        lanes, and the budget after the top-up within its per-batch maximum (400s)."""
        limits = self.config.tenants.of(tenant)
        check_lane(tenant, limits, run.spec.lane)
        if not isinstance(top_up, int) or top_up <= 0:
            return  # the ledger's own 400 on the top-up
        if run.spec.usd:
            cap = limits.max_budget_micro_per_batch
            room = 0 if cap is None else max(0, cap - run.budget)
            check_budget_usd(tenant, limits, run.budget + top_up, "top_up_usd", room)
        else:
            cap = limits.max_budget_per_batch
            room = 0 if cap is None else max(0, cap - run.budget)
            check_budget(tenant, limits, run.budget + top_up, "top_up", room)

    # ------------------------------------------------------------------ fleet

    def fleet(self, now: float) -> dict[str, Any]:
        depths = self.queue.depths()
        models = self.models or ModelRoutes.single(self.governor)
        states = {
            name: ModelState(
                model_id=route.model_id,
                default=name == models.default,
                governor=_governor_state(route.governor, now),
            )
            for name, route in sorted(models.routes.items())
        }
        return Fleet(
            draining=self.drain.draining(),
            governor=states[models.default].governor,
            models=states,
            lanes={lane.value: _depth_view(d) for lane, d in depths.items()},
            in_flight=sum(d.in_flight for d in depths.values()),
            queued=sum(d.queued for d in depths.values()),
        ).model_dump(mode="json")

    # ------------------------------------------------------------------ drain

    def drain_status(self, now: float) -> dict[str, Any]:
        """``GET /drain``: the drain switch (an exact read, as an operator just flipped it) and
        the lanes. The API cannot see the workers' event source mappings, so ``safe_to_deploy``
        is :func:`swarm.service.drain.safe_to_deploy` without them (its docstring says why
        that holds); the drain function's report adds them."""
        running = RunningUnits() if self.running is None else self.running.running(now)
        return drain_view(self.drain.state(), self.queue.depths(), running, None, now)


def _unit_inputs(units: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """Each unit's id and input (as JSON: text or a request), sorted: what a replay compares."""
    return sorted(
        (str(u["unit_id"]), json.dumps(u.get("input", ""), sort_keys=True)) for u in units
    )


def _doc(status: BatchStatus) -> dict[str, Any]:
    # remainder and requeued are absent, not null, when they do not apply
    return status.model_dump(mode="json", exclude_none=True)


def _governor_state(governor: Governor, now: float) -> GovernorState:
    """A model's bucket as ``GET /fleet`` shows it."""
    snap: GovernorSnapshot = governor.snapshot(now)
    return GovernorState(
        available_tokens=round(snap.available),
        capacity_tokens=round(snap.capacity),
        governed_rate_tps=round(snap.governed_rate, 3),
        effective_rate_tps=round(snap.effective_rate, 3),
        throttles=snap.throttles,
        last_throttle_at=snap.last_throttle_at,
        output_burndown=governor.config.output_burndown,
        requests=_request_view(snap),
    )


def _depth_view(d: LaneDepth) -> LaneDepthView:
    return LaneDepthView(visible=d.visible, in_flight=d.in_flight, delayed=d.delayed)


def _request_view(snap: GovernorSnapshot) -> RequestBucketState | None:
    """The governor's request bucket as ``GET /fleet`` shows it (None: it has none)."""
    if (
        snap.request_rate is None
        or snap.request_capacity is None
        or snap.requests_available is None
        or snap.effective_request_rate is None
    ):
        return None
    return RequestBucketState(
        available=math.floor(snap.requests_available),
        capacity=math.floor(snap.request_capacity),
        rate_rps=round(snap.request_rate, 3),
        effective_rate_rps=round(snap.effective_request_rate, 3),
    )
