"""The healthy line: completion, elapsed, spend against budget, retries, dead letters."""

from __future__ import annotations

from swarm.core.pricing import usd
from swarm.core.records import RunRecord, RunState


def spend(run: RunRecord) -> str:
    """Spend against budget, in tokens and dollars: ``spent 1,200 of 6,000,000 tokens (0.0%),
    $0.002400`` (a deployment with prices), or for a budget in dollars ``spent $0.002400 of
    $5.000000 (0.0%), 1,200 tokens``."""
    share = f" ({run.charged / run.budget:.1%})" if run.budget else ""
    if run.spec.usd:
        return f"spent ${usd(run.spent_micro)} of ${usd(run.budget)}{share}, {run.spent:,} tokens"
    line = f"spent {run.spent:,} of {run.budget:,} tokens{share}"
    if run.spec.prices is not None or run.spent_micro:
        line += f", ${usd(run.spent_micro)}"
    return line


def healthy_line(run: RunRecord, elapsed_s: float) -> str:
    line = (
        f"completed {run.completed}/{run.units_total} in {elapsed_s:,.0f}s | "
        f"{spend(run)} | "
        f"retries {run.retries} | dead-lettered {run.dead_lettered}"
    )
    if run.state in (RunState.EXHAUSTING, RunState.EXHAUSTED):
        line += f" | remainder {run.remainder}"
    if run.state is not RunState.OPEN:
        line = f"{run.state.event}: {line}"
    return line
