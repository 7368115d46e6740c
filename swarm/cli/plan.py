"""`swarm plan`: the fleet a quota and a workload call for, and what a batch will take and cost.

From a quota, a governor share, a unit profile (a size range, or the units of a manifest file:
the file ``swarm submit`` takes) and a budget: N*, the recommended worker concurrency per lane,
the expected makespan, spend and model cost, and the cdk.json values to deploy. See
docs/explanation/planner.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from swarm.cli.argtypes import non_negative_int, number, positive_int, share
from swarm.cli.ops import read_units_file
from swarm.cli.sim import (
    fleet_of,
    model_line,
    model_options,
    policy,
    turn_options,
    turns_of,
    workload_of,
    workload_options,
)
from swarm.core.errors import InvalidInput
from swarm.core.records import UnitSpec
from swarm.core.scheduling import DEFAULT_SCHEDULE, ServiceModel
from swarm.sim.engine import FleetConfig
from swarm.sim.models import Models, dollars
from swarm.sim.plan import (
    DEFAULT_ACCOUNT_LIMIT,
    ModelsPlan,
    Outcome,
    Plan,
    Spread,
    plan,
    plan_models,
)
from swarm.sim.workload import Workload

DEFAULT_BUDGET = 6_000_000  # cdk.json's budget.default_tokens
DEFAULT_ATTEMPTS = 3  # cdk.json's max_attempts


def manifest_workload(
    path: Path, args: argparse.Namespace
) -> tuple[Workload, dict[str, Any], list[str | None]]:
    """The units of a manifest (a JSON array of units, or a batch object with ``units``), the
    batch's own ``budget`` / ``max_attempts`` if it has them, and the model each unit names
    (its ``input.model``; None: the default)."""
    try:
        body = read_units_file(path)
    except InvalidInput as e:
        raise InvalidInput("--manifest", e.message) from None
    units = body.get("units")
    if not isinstance(units, list) or not units:
        raise InvalidInput(
            "--manifest",
            f"{path} has no units: give a JSON array of units or a batch object with "
            '"units" (an uploaded manifest\'s S3 key cannot be planned: plan its file)',
        )
    ids, sizes, named = [], [], []
    for index, unit in enumerate(units):
        if not isinstance(unit, dict):
            raise InvalidInput(f"--manifest: units[{index}]", "must be an object")
        given = unit.get("input")
        model = given.get("model") if isinstance(given, dict) else None
        if model is not None and not isinstance(model, str):
            raise InvalidInput(
                f"--manifest: units[{index}].input.model", f"must be a model name, got {model!r}"
            )
        named.append(model)
        unit_id, tokens = unit.get("unit_id"), unit.get("projected_tokens")
        if not isinstance(unit_id, str):
            raise InvalidInput(f"--manifest: units[{index}].unit_id", "must be a string")
        if not isinstance(tokens, int) or isinstance(tokens, bool):
            raise InvalidInput(
                f"--manifest: units[{index}].projected_tokens",
                f"must be a whole number of tokens, got {tokens!r}",
            )
        try:
            spec = UnitSpec(unit_id, tokens)
        except InvalidInput as e:
            name = "projected_tokens" if e.field.endswith("projected_tokens") else "unit_id"
            raise InvalidInput(f"--manifest: units[{index}].{name}", e.message) from None
        ids.append(spec.unit_id)
        sizes.append(spec.projected_tokens)
    repeated = [unit_id for unit_id, n in Counter(ids).items() if n > 1]
    if repeated:
        raise InvalidInput("--manifest", f"{path}: unit id {repeated[0]!r} appears more than once")
    service = ServiceModel(args.base_seconds, args.tokens_per_second)
    workload = Workload.from_sizes(
        sizes, ids, args.failure_rate, args.seed, service, turns=turns_of(args)
    )
    batch = {
        k: v
        for k in ("budget", "max_attempts")
        if isinstance(v := body.get(k), int) and not isinstance(v, bool)
    }
    return workload, batch, named


def named_models(
    fleet: FleetConfig, named: list[str | None], args: argparse.Namespace
) -> FleetConfig:
    """The fleet with each unit on the model its ``input.model`` names (the catalog's default
    for the others), when any names one."""
    if not any(named):
        return fleet
    if fleet.models is None:
        index = next(i for i, n in enumerate(named) if n)
        raise InvalidInput(
            f"--manifest: units[{index}].input.model",
            f"names model {named[index]!r}: give the catalog with --models FILE",
        )
    if args.mix is not None:
        raise InvalidInput(
            "--mix", "the manifest's units name their models (input.model): leave out --mix"
        )
    catalog = fleet.models.catalog
    for index, name in enumerate(named):
        if name is not None and name not in catalog.models:
            raise InvalidInput(
                f"--manifest: units[{index}].input.model",
                f"{name!r} is not a model of the catalog: use one of {', '.join(catalog.models)}",
            )
    per_unit = [catalog.default if n is None else n for n in named]
    return replace(fleet, models=Models.named(catalog, per_unit, fleet.models.output_share))


def _tokens(spread: Spread, seeds: int) -> str:
    if seeds == 1:
        return f"{spread.mean:,.0f}"
    return f"{spread.mean:,.0f} (from {spread.low:,.0f} to {spread.high:,.0f})"


def _outcome_doc(o: Outcome) -> dict[str, Any]:
    floor = o.seeded.floor
    return {
        "workers_per_lane": o.workers,
        "makespan_s": o.seeded.elapsed,
        "floor_s": None if floor is None else floor.seconds,
        "floor_ratio": None if o.seeded.floor_ratio is None else round(o.seeded.floor_ratio, 4),
        "makespan_over_seeds_s": {
            "mean": round(o.elapsed.mean, 1),
            "min": o.elapsed.low,
            "max": o.elapsed.high,
        },
        "spent": o.seeded.run.spent,
        "spent_over_seeds": {"mean": round(o.spent.mean), "min": o.spent.low, "max": o.spent.high},
        "runs_completed": o.completed_runs,
        "agent": None if o.seeded.agent is None else o.seeded.agent.doc(),
        "state": o.seeded.run.state.value,
        "completed_units": o.seeded.run.completed,
    }


def _turns_doc(p: Plan) -> dict[str, Any] | None:
    t = p.workload.turns
    if not t.agent:
        return None
    return {
        "min": t.turns_min,
        "max": t.turns_max,
        "tool_seconds": t.tool_seconds,
        "tool_tokens": t.tool_tokens,
        "output_tokens": t.output_tokens,
        "output_bound": t.output_bound,
        "prompt_tokens": t.prompt_tokens,
        "cap_headroom": t.headroom,
        "hold_seconds": t.hold_seconds,
    }


def plan_doc(p: Plan) -> dict[str, Any]:
    w, f = p.workload, p.fleet
    cost = p.cost(p.outcome.spent.mean)
    return {
        "units": w.units,
        "first_attempt_tokens": w.first_attempt_tokens,
        "unit_tokens": {"min": w.min_tokens, "max": w.max_tokens},
        "quota_tpm": f.quota_tpm,
        "governor_share": f.share,
        "governed_tokens_per_s": round(f.governor.rate, 3),
        "budget": f.budget,
        "max_attempts": f.max_attempts,
        "failure_rate": w.failure_rate,
        "turns": _turns_doc(p),
        "policy": f.schedule.value,
        "seeds": p.seeds,
        "profile": p.profile_doc(),
        "n_star": p.sizing.n_star,
        "concurrency_per_lane": p.sizing.per_lane,
        "reserved_concurrency": p.sizing.reserved,
        "account_concurrency_limit": p.account_limit,
        "fits_account": p.problem is None,
        "problem": p.problem,
        "expected": _outcome_doc(p.outcome),
        "within_account": None if p.fitting is None else _outcome_doc(p.fitting),
        "expected_spend": round(p.expected_spend),
        "budget_covering_every_seed": p.budget_covering() or None,
        "usd_per_mtok": p.usd_per_mtok,
        "model_cost_usd": None if cost is None else round(cost, 2),
        "cdk_context": p.cdk_context(),
        "cdk_context_auto": p.cdk_context_auto(),
    }


def _print_spend(p: Plan | ModelsPlan) -> None:
    """The plan's expected spend against its budget, and the budget that covers every seed."""
    f, w = p.fleet, p.workload
    print(
        f"expected spend: {p.expected_spend:,.0f} tokens (first attempts plus "
        f"{p.expected_spend / w.first_attempt_tokens - 1:.1%} of retries); simulated "
        f"{_tokens(p.outcome.spent, p.seeds)} of the {f.budget:,} budget"
    )
    covering = p.budget_covering()
    if covering and covering <= f.budget:
        print(f"the budget covers every simulated seed (the most spent was {covering:,})")
    elif covering:
        print(f"a budget of {covering:,} tokens covers every simulated seed")


def _print_outcome(o: Outcome, p: Plan | ModelsPlan, label: str) -> None:
    r = o.seeded
    ratio = "" if r.floor_ratio is None else f", {r.floor_ratio:.2f}x its floor of"
    floor = "" if r.floor is None else f"{ratio} {r.floor.seconds:,}s"
    print(
        f"{label}: {r.elapsed:,}s on seed {p.workload.seed}{floor} "
        f"({p.fleet.schedule.value} policy, {o.workers} workers)"
    )
    if p.seeds > 1:
        e = o.elapsed
        print(
            f"  over {p.seeds} seeds: mean {e.mean:,.0f}s, from {e.low:,.0f}s to {e.high:,.0f}s "
            "(which late attempts fail sets the end)"
        )
    if r.agent is not None:
        print(f"  {r.agent.line()}")
    if o.completed_runs < p.seeds:
        c = o.completed_units
        print(
            f"  the budget runs out in {p.seeds - o.completed_runs} of {p.seeds} seeds: "
            f"run.exhausted with {c.mean:,.0f} of {p.workload.units} units done on average"
        )


def print_plan(p: Plan) -> None:
    w, f = p.workload, p.fleet
    sizes, fails = "per unit", "of attempts fail"
    if w.turns.agent:
        sizes, fails = "caps per unit", "of model turns fail"
    print(
        f"{w.units:,} units, {w.first_attempt_tokens:,} tokens of first-attempt work "
        f"({w.min_tokens:,}-{w.max_tokens:,} {sizes}) | quota {f.quota_tpm:,} TPM x "
        f"{f.share:g} = {f.governor.rate:,.0f} tokens/s | {w.failure_rate:.0%} {fails}, "
        f"{f.max_attempts} attempts"
    )
    t = w.turns
    if t.agent:
        turns = f"{t.turns_min}" if t.turns_min == t.turns_max else f"{t.turns_min}-{t.turns_max}"
        print(
            f"agent units: {turns} model turns each, {t.tool_seconds}s of tool calls after "
            f"each but the last (the worker held), {t.hold_seconds}s bounded hold; a unit's "
            "tokens are its loop's, its seconds every second the loop holds a worker"
        )
    prof = p.profile
    print(
        f"N* = {p.sizing.n_star} workers (Little's law: {f.governor.rate:,.0f} tokens/s x "
        f"{prof.mean_seconds:,.1f}s / {prof.mean_tokens:,.0f} tokens per unit); "
        f"{p.sizing.per_lane} keep the quota busy while the small units "
        f"({prof.small_tokens:,} tokens, {prof.small_seconds:,.0f}s) run"
    )
    per_lane = ", ".join(f"{lane} {p.sizing.per_lane}" for lane in ("high", "normal", "low"))
    print(
        f"recommended worker concurrency per lane: {per_lane} "
        f"(worker reserved concurrency {p.sizing.reserved})"
    )
    problem = p.problem
    if problem is not None:
        print(f"does not fit account_concurrency_limit={p.account_limit}: {problem}")
    _print_outcome(p.outcome, p, "expected makespan")
    if p.fitting is not None:
        _print_outcome(p.fitting, p, f"within the account ({p.fitting.workers} per lane)")
    _print_spend(p)
    cost = p.cost(p.outcome.spent.mean)
    if cost is None:
        print("model cost: give --usd-per-mtok (your model's price per million tokens)")
    else:
        print(
            f"model cost: ${cost:,.2f} at ${p.usd_per_mtok:g} per million tokens "
            f"(the whole budget: ${p.cost(f.budget) or 0:,.2f})"
        )
    print('cdk.json context (merge into "context"; keys not shown keep their values):')
    print(json.dumps(p.cdk_context(), indent=2))
    print(
        "or let synth derive the same fleet (leave out lanes.*.max_concurrency and "
        "worker.reserved_concurrency):"
    )
    print(json.dumps(p.cdk_context_auto(), indent=2))


def _model_docs(p: ModelsPlan, o: Outcome) -> list[dict[str, Any]]:
    limits = {m.name: m for m in p.limits}
    binding = p.binding(o)
    out = []
    for m in o.seeded.models:
        limit = limits.get(m.name)
        elapsed = o.seeded.elapsed
        out.append(
            {
                **m.doc(),
                "binding": binding.get(m.name),
                "n_star": None if limit is None else limit.n_star,
                "makespan_share": round(m.last_end_s / elapsed, 4) if elapsed else None,
                "limits": None if limit is None else limit.doc(),
            }
        )
    return out


def models_plan_doc(p: ModelsPlan) -> dict[str, Any]:
    w, f = p.workload, p.fleet
    cost = p.cost_micro_usd()
    return {
        "units": w.units,
        "first_attempt_tokens": w.first_attempt_tokens,
        "unit_tokens": {"min": w.min_tokens, "max": w.max_tokens},
        "mix": p.models.mix.text(),
        "units_name_their_models": bool(p.models.per_unit),
        "output_share": p.models.output_share,
        "governor_share": f.share,
        "budget": f.budget,
        "max_attempts": f.max_attempts,
        "failure_rate": w.failure_rate,
        "policy": f.schedule.value,
        "seeds": p.seeds,
        "n_star": p.sizing.n_star,
        "concurrency_per_lane": p.sizing.per_lane,
        "reserved_concurrency": p.sizing.reserved,
        "account_concurrency_limit": p.account_limit,
        "fits_account": p.problem is None,
        "problem": p.problem,
        "models": _model_docs(p, p.outcome),
        "expected": _outcome_doc(p.outcome),
        "within_account": None
        if p.fitting is None
        else {**_outcome_doc(p.fitting), "models": _model_docs(p, p.fitting)},
        "expected_spend": round(p.expected_spend),
        "budget_covering_every_seed": p.budget_covering() or None,
        "cost_micro_usd": cost,
        "cost_usd": None if cost is None else dollars(cost),
        "cost_micro_usd_over_seeds": None
        if p.costs is None
        else {"mean": round(p.costs.mean), "min": round(p.costs.low), "max": round(p.costs.high)},
        "cdk_context": p.cdk_context(),
    }


def _print_models_outcome(p: ModelsPlan, o: Outcome) -> None:
    limits = {m.name: m for m in p.limits}
    binding = p.binding(o)
    for m in o.seeded.models:
        print("  " + model_line(m, limits.get(m.name), binding.get(m.name), o.seeded.elapsed))


def print_models_plan(p: ModelsPlan) -> None:
    w, f = p.workload, p.fleet
    models = p.models
    if models.per_unit:
        counts = ", ".join(f"{n} {models.per_unit.count(n):,}" for n in models.mix.names)
        mix = f"units on the models they name: {counts}"
    else:
        mix = f"mix {models.mix.text()}"
    print(
        f"{w.units:,} units, {w.first_attempt_tokens:,} tokens of first-attempt work "
        f"({w.min_tokens:,}-{w.max_tokens:,} per unit, {models.output_share:.0%} of them "
        f"output) | {mix} | {w.failure_rate:.0%} of attempts fail, {f.max_attempts} attempts"
    )
    for spec in p.models.used:
        share = spec.share(f.share)
        rpm = "no RPM quota" if spec.rpm is None else f"RPM {spec.rpm:,} x {share:g}"
        limit = next((m for m in p.limits if m.name == spec.name), None)
        if limit is None:
            print(f"{spec.name} ({spec.model_id}): no units in the mix")
            continue
        by_rpm = "" if limit.rpm_rate is None else f", {limit.rpm_rate:,.2f} by RPM"
        print(
            f"{spec.name} ({spec.model_id}): TPM {spec.tpm:,} x {share:g}, {rpm}, output "
            f"burndown {spec.output_burndown:g} | {limit.units:,} units of "
            f"{limit.mean_quota_tokens:,.0f} quota tokens and {limit.mean_seconds:,.1f}s on "
            f"average: {limit.units_per_s_tpm:,.2f} units/s by TPM{by_rpm} | binding: "
            f"{limit.quota} | N* = {limit.n_star} (Little's law), {limit.workers} keep it busy"
        )
    per_lane = ", ".join(f"{lane} {p.sizing.per_lane}" for lane in ("high", "normal", "low"))
    print(
        f"N* = {p.sizing.n_star} workers in all (the models' N* added up: they run at once); "
        f"recommended worker concurrency per lane: {per_lane} (worker reserved concurrency "
        f"{p.sizing.reserved})"
    )
    problem = p.problem
    if problem is not None:
        print(f"does not fit account_concurrency_limit={p.account_limit}: {problem}")
    o = p.outcome
    _print_outcome(o, p, "expected makespan")
    _print_models_outcome(p, o)
    if p.fitting is not None:
        _print_outcome(p.fitting, p, f"within the account ({p.fitting.workers} per lane)")
        _print_models_outcome(p, p.fitting)
    _print_spend(p)
    cost = p.cost_micro_usd()
    if cost is None or p.costs is None:
        print(f"cost: unknown (no prices in the catalog for {', '.join(p.unpriced())})")
    else:
        parts = " + ".join(f"{m.name} {dollars(m.cost_micro_usd or 0)}" for m in o.seeded.models)
        spread = ""
        if p.seeds > 1:
            c = p.costs
            spread = (
                f"; over {p.seeds} seeds mean ${c.mean / 1e6:,.2f}, from "
                f"${c.low / 1e6:,.2f} to ${c.high / 1e6:,.2f}"
            )
        print(f"cost: {dollars(cost)} on seed {w.seed} ({parts}){spread}")
    print(
        'cdk.json context (merge into "context"; the models\' quotas stay in models; '
        'set the concurrency by hand: worker.concurrency "auto" sizes for the models\' rates '
        "added up, not for each model's N*):"
    )
    print(json.dumps(p.cdk_context(), indent=2))


@contextlib.contextmanager
def _naming_the_manifest(args: argparse.Namespace) -> Iterator[None]:
    """A unit's error from a ``--manifest`` plan names the option and the unit."""
    try:
        yield
    except InvalidInput as e:
        if args.manifest is None or not e.field.startswith("units["):
            raise
        raise InvalidInput(f"--manifest: {e.field}", e.message) from None


def cmd_plan(args: argparse.Namespace) -> int:
    batch: dict[str, Any] = {}
    named: list[str | None] = []
    if args.manifest is not None:
        given = [o for o in ("units", "min_tokens", "max_tokens") if getattr(args, o) is not None]
        if given:
            flags = ", ".join(f"--{o.replace('_', '-')}" for o in given)
            raise InvalidInput("--manifest", f"gives the units: leave out {flags}")
        workload, batch, named = manifest_workload(args.manifest, args)
    else:
        args.units = 400 if args.units is None else args.units
        args.min_tokens = 8_000 if args.min_tokens is None else args.min_tokens
        args.max_tokens = 16_000 if args.max_tokens is None else args.max_tokens
        workload = workload_of(args)
    if args.budget is None:
        args.budget = batch.get("budget", DEFAULT_BUDGET)
    if args.max_attempts is None:
        args.max_attempts = batch.get("max_attempts", DEFAULT_ATTEMPTS)
    fleet = named_models(fleet_of(args, workers=1), named, args)
    if fleet.models is not None:
        if args.usd_per_mtok is not None:
            raise InvalidInput(
                "--usd-per-mtok",
                "with --models each model's prices come from its catalog entry: leave it out",
            )
        with _naming_the_manifest(args):
            multi = plan_models(
                workload, fleet, seeds=args.seeds, account_limit=args.account_concurrency_limit
            )
        if args.json:
            print(json.dumps(models_plan_doc(multi), indent=2))
        else:
            print_models_plan(multi)
        return 0
    with _naming_the_manifest(args):
        result = plan(
            workload,
            fleet,
            seeds=args.seeds,
            account_limit=args.account_concurrency_limit,
            usd_per_mtok=args.usd_per_mtok,
        )
    if args.json:
        print(json.dumps(plan_doc(result), indent=2))
    else:
        print_plan(result)
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "plan",
        help="size the fleet for a quota and a workload: N*, concurrency per lane, makespan, "
        "spend, cost, cdk.json values",
        description=(
            "Size the worker fleet for a quota and a workload (a size range, or the units of a "
            "manifest file), simulate the batch on it, and print the cdk.json values to deploy."
        ),
    )
    p.add_argument(
        "--manifest",
        type=Path,
        metavar="FILE",
        help="the units to plan for: the file `swarm submit` takes (a JSON array of units, or "
        "a batch object whose budget and max_attempts become the defaults)",
    )
    g = p.add_argument_group("a generated workload instead of --manifest (defaults: Lab 6.1)")
    g.add_argument("--units", type=positive_int, help="units in the batch (400)")
    g.add_argument("--min-tokens", type=positive_int, help="smallest unit (8,000)")
    g.add_argument("--max-tokens", type=positive_int, help="largest unit (16,000)")
    workload_options(p, sizes=False)
    turn_options(p)
    f = p.add_argument_group("quota, budget and fleet")
    f.add_argument(
        "--quota-tpm",
        type=positive_int,
        help="model quota (300,000; with --models each model's tpm instead)",
    )
    f.add_argument("--share", type=share, default=0.95, help="governor share of the quota (0.95)")
    f.add_argument(
        "--budget",
        type=non_negative_int,
        help=f"the batch's token budget (the manifest's, else {DEFAULT_BUDGET:,})",
    )
    f.add_argument(
        "--max-attempts", type=positive_int, help=f"then dead-letter ({DEFAULT_ATTEMPTS})"
    )
    f.add_argument(
        "--policy",
        default=DEFAULT_SCHEDULE,
        type=policy,
        help=f"scheduling policy to simulate ({DEFAULT_SCHEDULE.value})",
    )
    f.add_argument(
        "--account-concurrency-limit",
        type=positive_int,
        default=DEFAULT_ACCOUNT_LIMIT,
        help="the account's Lambda concurrent executions quota "
        f"({DEFAULT_ACCOUNT_LIMIT:,}, a fresh account's default)",
    )
    p.add_argument(
        "--usd-per-mtok",
        type=number(float, 0, None, "a price >= 0"),
        help="the model's price per million tokens, for the model cost (with --models: the "
        "catalog's prices instead)",
    )
    model_options(p)
    p.add_argument(
        "--seeds",
        type=positive_int,
        default=20,
        help="simulate this many seeds from --seed for the makespan and spend ranges (20)",
    )
    p.add_argument("--json", action="store_true", help="print a machine-readable plan")
    p.set_defaults(handler=cmd_plan, fairness="fifo")
