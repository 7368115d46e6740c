"""Several models on in-memory ports (cdk.json ``models``): a unit names its model
(``input.model``) or takes the default; the API refuses a model that is not registered or not the
tenant's, naming the unit's field; a unit draws from its own model's bucket and is answered by its
model, an agent unit turn by turn; a unit of a model the worker's registry lost fails unbilled."""

from __future__ import annotations

import json
from typing import Any

import pytest

from swarm.adapters.simulated_model import answered_by
from swarm.core.errors import InvalidInput
from swarm.core.governor import Draw, GovernorConfig, Grant, Ticket, TrueUp
from swarm.core.memory import InMemoryGovernor
from swarm.core.records import Lane, RunState, UnitState
from swarm.core.routes import ModelRoute, ModelRoutes
from swarm.core.tenancy import TenantLimits, TenantPolicy
from swarm.service.batches import Shedding, SubmitRequest, UnitInput
from tests.unit.test_service_flow import QUOTA, Plane

HAIKU = "anthropic.claude-3-5-haiku-20241022-v1:0"
SONNET = "us.anthropic.claude-sonnet-4-20250514-v1:0"


class CountingGovernor(InMemoryGovernor):
    """Notes every granted draw and every true-up."""

    def __init__(self, config: GovernorConfig, now: float) -> None:
        super().__init__(config, now)
        self.granted: list[int] = []
        self.trued: list[int] = []

    def draw(
        self, amount: int, lane: Lane, now: float, ticket: Ticket | None = None, tenant: str = ""
    ) -> Draw:
        got = super().draw(amount, lane, now, ticket, tenant)
        if got.granted:
            self.granted.append(amount)
        return got

    def true_up(self, grant: Grant, used: int, now: float) -> TrueUp:
        self.trued.append(used)
        return super().true_up(grant, used, now)


def two_models(plane: Plane, worker_knows_sonnet: bool = True) -> dict[str, CountingGovernor]:
    """Haiku (the default, burndown 1) and Sonnet (burndown 5), each with its own bucket, on the
    API, the fan-out and the worker of ``plane``."""
    now = plane.clock.now()
    governors = {
        "haiku": CountingGovernor(GovernorConfig(QUOTA, 0.95, initial_fill=1.0), now),
        "sonnet": CountingGovernor(
            GovernorConfig(QUOTA, 0.95, initial_fill=1.0, output_burndown=5.0), now
        ),
    }
    ids = {"haiku": HAIKU, "sonnet": SONNET}
    routes = {name: ModelRoute(name, ids[name], g) for name, g in governors.items()}
    plane.batches.models = ModelRoutes("haiku", routes)
    plane.fanout.models = plane.batches.models
    known = routes if worker_knows_sonnet else {"haiku": routes["haiku"]}
    plane.worker.models = ModelRoutes("haiku", known)
    plane.worker.governor = governors["haiku"]
    return governors


def request(model: str | None = None, agent: bool = False, n: int = 1) -> SubmitRequest:
    prompt: dict[str, Any] = {"messages": [{"role": "user", "content": [{"text": "Hello."}]}]}
    if model is not None:
        prompt["model"] = model
    if agent:
        prompt["limits"] = {"max_turns": 3}
    units = [UnitInput(f"u{i}", 20_000, dict(prompt)) for i in range(n)]
    return SubmitRequest(lane=Lane.NORMAL, budget=10**7, max_attempts=2, units=units)


def submit(plane: Plane, req: SubmitRequest, tenant: str = "acme") -> str:
    return plane.batches.submit(tenant, req, None, plane.clock.now()).run.run_id


def outcomes(plane: Plane, run_id: str) -> list[dict[str, Any]]:
    """Every attempt's outcome the workers kept for the run (alone or in pages)."""
    docs = [
        json.loads(body)
        for key, body in plane.results.objects.items()
        if key.startswith(f"results/{run_id}/attempts/")
    ]
    return [o for d in docs for o in d.get("outcomes", [d])]


def test_each_unit_draws_from_its_models_bucket_and_is_answered_by_its_model() -> None:
    plane = Plane()
    governors = two_models(plane)
    sonnet_run = submit(plane, request("sonnet", n=3))
    assert plane.run(sonnet_run)["closed"]
    # the Sonnet units drew Sonnet's quota tokens (their output bound at its burndown of 5,
    # more than their 20,000 projected tokens) and were trued up there; Haiku's bucket untouched
    assert len(governors["sonnet"].granted) == 3 and governors["haiku"].granted == []
    assert all(amount > 20_000 for amount in governors["sonnet"].granted)
    assert len(governors["sonnet"].trued) == 3
    haiku_run = submit(plane, request(None, n=2))  # no model named: the default
    assert plane.run(haiku_run)["closed"]
    assert governors["haiku"].granted == [20_000, 20_000]  # burndown 1: its projection
    # each answer names the model asked (the simulated plane's stand-in for Bedrock's id)
    assert {o["model_id"] for o in outcomes(plane, sonnet_run)} == {answered_by(SONNET)}
    assert {o["model_id"] for o in outcomes(plane, haiku_run)} == {answered_by(HAIKU)}


def test_an_agent_units_turns_draw_from_its_models_bucket_and_call_its_model() -> None:
    plane = Plane()
    governors = two_models(plane)
    run_id = submit(plane, request("sonnet", agent=True))
    assert plane.run(run_id)["closed"]
    assert plane.ledger.run(run_id).completed == 1
    assert governors["sonnet"].granted and governors["haiku"].granted == []
    assert len(governors["sonnet"].trued) == len(governors["sonnet"].granted)  # every turn's
    calls = plane.model.log(run_id)
    assert calls and {c.unit_id for c in calls} == {"u0"}


@pytest.mark.parametrize(
    ("model", "tenants", "says"),
    [
        ("opus", TenantPolicy(), "'opus' is not a model of this deployment (models: haiku, "),
        ("sonnet", TenantPolicy(TenantLimits(models=frozenset({"haiku"}))), "may not use model"),
    ],
)
def test_a_model_not_registered_or_not_the_tenants_is_a_400_naming_the_units_field(
    model: str, tenants: TenantPolicy, says: str
) -> None:
    plane = Plane(tenants=tenants)
    two_models(plane)
    req = request(None, n=2)
    named = UnitInput("u9", 20_000, {**dict(req.units[0].input), "model": model})  # type: ignore[arg-type]
    with pytest.raises(InvalidInput) as error:
        submit(plane, SubmitRequest(Lane.NORMAL, 10**7, 2, [*req.units, named]))
    assert error.value.field == "units[2].input.model"
    assert says in error.value.message
    assert plane.ledger.records() == ([], [], [])  # nothing written


def test_a_unit_of_a_model_the_workers_registry_lost_fails_unbilled() -> None:
    # Given a unit the API took for Sonnet, then a deploy whose registry has no Sonnet
    plane = Plane()
    two_models(plane, worker_knows_sonnet=False)
    run_id = submit(plane, request("sonnet"))
    # When the workers take it: each attempt fails without calling any model
    assert plane.run(run_id)["closed"]
    run = plane.ledger.run(run_id)
    assert run.state is RunState.COMPLETED and run.completed == 0 and run.spent == 0
    assert plane.ledger.unit(run_id, "u0").state is UnitState.DEAD_LETTERED
    assert run.attempts == 2  # each of its attempts: failed at no cost
    assert plane.model.log(run_id) == []
    errors = {o["error"] for o in outcomes(plane, run_id)}
    assert len(errors) == 1 and "'sonnet' is not a model of this deployment" in errors.pop()


def test_the_simulated_plane_keeps_a_quota_per_model_id() -> None:
    """Bedrock's quotas are per model: a storm of one model's calls does not throttle another's."""
    from swarm.adapters.simulated_model import SimulatedModelPlane
    from swarm.core.ports import ModelRequest, ModelThrottled

    plane = SimulatedModelPlane(60_000, clock=lambda: 0.0, quotas={SONNET: 1_000})
    plane.invoke(ModelRequest("r", "a", 0, 900, "Hello.", model_id=SONNET))
    with pytest.raises(ModelThrottled, match="1,000 TPM"):  # Sonnet's own bucket is spent
        plane.invoke(ModelRequest("r", "b", 0, 900, "Hello.", model_id=SONNET))
    # the default's quota (a request naming no model, or another id) is untouched
    assert plane.invoke(ModelRequest("r", "c", 0, 900, "Hello.")).succeeded
    assert plane.invoke(ModelRequest("r", "d", 0, 900, "Hello.", model_id=HAIKU)).succeeded


def test_backpressure_answers_to_the_buckets_of_the_models_a_submission_names() -> None:
    plane = Plane()
    governors = two_models(plane)
    governors["sonnet"].report_throttle(plane.clock.now())  # Bedrock throttled Sonnet just now
    # work bound for Sonnet (alone, or beside Haiku's) is shed at the front door: its units
    # would wait on Sonnet's throttles
    for req in (request("sonnet"), _mixed()):
        with pytest.raises(Shedding) as e:
            submit(plane, req)
        assert e.value.shed.reason == "throttling"
    # work bound for Haiku alone is not: Haiku's bucket was never throttled
    submit(plane, request("haiku"))
    submit(plane, request(None))  # the default, Haiku


def _mixed() -> SubmitRequest:
    req = request("haiku", n=2)
    sonnet = request("sonnet").units[0]
    return SubmitRequest(
        req.lane, req.budget, req.max_attempts, [*req.units, UnitInput("s0", 20_000, sonnet.input)]
    )
