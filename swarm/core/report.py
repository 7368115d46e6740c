"""The healthy line: completion, elapsed, spend against budget, retries, dead letters."""

from __future__ import annotations

from swarm.core.records import RunRecord, RunState


def healthy_line(run: RunRecord, elapsed_s: float) -> str:
    share = f" ({run.spent / run.budget:.1%})" if run.budget else ""
    line = (
        f"completed {run.completed}/{run.units_total} in {elapsed_s:,.0f}s | "
        f"spent {run.spent:,} of {run.budget:,} tokens{share} | "
        f"retries {run.retries} | dead-lettered {run.dead_lettered}"
    )
    if run.state in (RunState.EXHAUSTING, RunState.EXHAUSTED):
        line += f" | remainder {run.remainder}"
    if run.state is not RunState.OPEN:
        line = f"{run.state.event}: {line}"
    return line
