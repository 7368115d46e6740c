"""Tenants cannot hurt each other: each tenant's lanes, queue share and budget per batch.

A deployment gives every tenant the same limits (cdk.json ``tenants.defaults``) unless it names
the tenant (``tenants.overrides.<tenant>``, any subset of the keys):

- ``lanes``: the lanes the tenant may submit to (anyone else's lane is a 400 naming ``lane``);
- ``max_budget_per_batch``: the most tokens one of its batches may have as its budget, top-ups
  included (a 400 naming ``budget`` or ``top_up``); None: the deployment's ``budget.max_tokens``;
- ``max_budget_usd_per_batch`` (here in micro-dollars): the most a budget in dollars may reach,
  top-ups included (a 400 naming ``budget_usd`` or ``top_up_usd``). A tenant capped in one unit
  only must give its budgets in that unit: a cap in tokens says nothing of dollars, nor one in
  dollars of tokens, so a budget in the other unit would be uncapped (a 400 saying which to
  give);
- ``max_queued_units``: the most units the tenant may have queued (its open runs' units not yet
  terminal, as the ledger counts them) with a new batch included; past it the submission is
  refused with 429 ``tenant_queue`` and a Retry-After, whatever the other tenants do; None: no
  cap of its own;
- ``guaranteed_units``: the tenant's share of the lanes. The lanes' ``shed_depth`` stays as the
  deployment's ceiling (the work queued on a lane and every higher one), but it refuses only a
  tenant that is past its share: a submission that leaves the tenant's queued units within
  ``guaranteed_units`` is never shed for lane depth, so one tenant's flood cannot shut out a
  tenant with little queued.

Pure decisions, standard library only: :func:`check_lane`, :func:`check_budget`,
:func:`check_batch_size` raise :class:`~swarm.core.errors.InvalidInput` naming the field;
:func:`swarm.core.backpressure.shed_decision` takes a :class:`TenantQueue` for the queue rules.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from swarm.core.errors import InvalidInput
from swarm.core.pricing import usd
from swarm.core.records import LANES, Lane

#: how long a submission's hold on its tenant's queue counts (Ledger.hold_queue): longer than the
#: ledger's index takes to show a new run (DynamoDB's global secondary indexes: typically well
#: under a second)
HOLD_WINDOW_S = 60.0
#: the most holds a tenant's queue keeps in the window: more submissions than this in a minute
#: from one tenant are refused with 429 until older holds expire
MAX_HOLDS = 500


@dataclass(frozen=True)
class TenantLimits:
    lanes: frozenset[Lane] = frozenset(LANES)
    max_queued_units: int | None = None  # None: no cap of its own (the lanes' ceiling only)
    guaranteed_units: int = 0  # queued units never shed for lane depth
    max_budget_per_batch: int | None = None  # None: the deployment's maximum
    max_budget_micro_per_batch: int | None = None  # in micro-dollars; None: the API's maximum
    models: frozenset[str] | None = None  # the registry's models it may use; None: every one

    def allowed_lanes(self) -> list[Lane]:
        """The lanes in priority order (high first)."""
        return [lane for lane in LANES if lane in self.lanes]


@dataclass(frozen=True)
class TenantPolicy:
    defaults: TenantLimits = TenantLimits()
    overrides: Mapping[str, TenantLimits] = field(default_factory=dict)

    def of(self, tenant: str) -> TenantLimits:
        return self.overrides.get(tenant, self.defaults)


@dataclass(frozen=True)
class TenantQueue:
    """What the queue rules need to know of the submitting tenant."""

    tenant: str
    limits: TenantLimits
    queued: int  # its open runs' units not yet terminal (before this batch)
    adding: int  # the units this submission queues
    #: how fast its queue drains, measured (units a second: swarm.core.backpressure.drain_rate),
    #: or None when too little has drained to tell
    drain_units_s: float | None = None

    @property
    def after(self) -> int:
        return self.queued + self.adding

    @property
    def over_cap(self) -> int:
        """Units past ``max_queued_units`` if the submission were accepted (0: within it)."""
        cap = self.limits.max_queued_units
        return 0 if cap is None else max(0, self.after - cap)

    @property
    def within_share(self) -> bool:
        """Within its guaranteed share: never shed for the lanes' depth."""
        return self.after <= self.limits.guaranteed_units


def _lanes_text(limits: TenantLimits) -> str:
    allowed = limits.allowed_lanes()
    return ", ".join(lane.value for lane in allowed) if allowed else "none"


def check_lane(tenant: str, limits: TenantLimits, lane: Lane, field_name: str = "lane") -> None:
    """A lane the tenant may not use is a 400 naming the field and the lanes it may use."""
    if lane not in limits.lanes:
        raise InvalidInput(
            field_name,
            f"tenant {tenant!r} may not use the {lane.value!r} lane; its lanes: "
            f"{_lanes_text(limits)} (cdk.json tenants)",
        )


def check_budget(
    tenant: str, limits: TenantLimits, budget: int, field_name: str = "budget", room: int = 0
) -> None:
    """A batch budget in tokens (after a top-up: ``budget`` is the total) above the tenant's
    per-batch maximum is a 400 naming the field; ``room`` is what the message says may still be
    added. A tenant capped in dollars only may not give one in tokens (it would be uncapped)."""
    cap = limits.max_budget_per_batch
    if cap is None and limits.max_budget_micro_per_batch is not None:
        other = "top_up_usd" if field_name == "top_up" else "budget_usd"
        raise InvalidInput(
            field_name,
            f"tenant {tenant!r}'s budget per batch is capped in dollars "
            f"(max_budget_usd_per_batch ${usd(limits.max_budget_micro_per_batch)}, cdk.json "
            f"tenants): give {other}",
        )
    if cap is not None and budget > cap:
        hint = f": top up at most {room:,}" if field_name == "top_up" else ""
        raise InvalidInput(
            field_name,
            f"the batch's budget would be {budget:,} tokens, above the maximum of {cap:,} per "
            f"batch for tenant {tenant!r} (cdk.json tenants){hint}",
        )


def check_budget_usd(
    tenant: str,
    limits: TenantLimits,
    budget_micro: int,
    field_name: str = "budget_usd",
    room_micro: int = 0,
) -> None:
    """:func:`check_budget` for a budget in dollars (whole micro-dollars): above the tenant's
    ``max_budget_usd_per_batch`` is a 400 naming the field; a tenant capped in tokens only may
    not give one in dollars (it would be uncapped)."""
    cap = limits.max_budget_micro_per_batch
    if cap is None and limits.max_budget_per_batch is not None:
        other = "top_up" if field_name == "top_up_usd" else "budget"
        raise InvalidInput(
            field_name,
            f"tenant {tenant!r}'s budget per batch is capped in tokens (max_budget_per_batch "
            f"{limits.max_budget_per_batch:,}, cdk.json tenants): give {other} in tokens",
        )
    if cap is not None and budget_micro > cap:
        hint = f": top up at most ${usd(room_micro)}" if field_name == "top_up_usd" else ""
        raise InvalidInput(
            field_name,
            f"the batch's budget would be ${usd(budget_micro)}, above the maximum of "
            f"${usd(cap)} per batch for tenant {tenant!r} (cdk.json tenants){hint}",
        )


def check_batch_size(tenant: str, limits: TenantLimits, units: int) -> None:
    """A batch that alone exceeds the tenant's queue cap could never be accepted: a 400 naming
    ``units`` (a 429 would have the client retry forever)."""
    cap = limits.max_queued_units
    if cap is not None and units > cap:
        raise InvalidInput(
            "units",
            f"{units:,} units are more than tenant {tenant!r} may have queued at once "
            f"({cap:,}, cdk.json tenants): split the work into smaller batches",
        )
