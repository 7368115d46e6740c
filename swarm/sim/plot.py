"""The sweep as a picture: makespan against workers for each policy, with the makespan floor,
the quota's floor, N* and the fleet that keeps the quota busy (matplotlib, no display needed)."""

from __future__ import annotations

from pathlib import Path

from swarm.core.errors import InvalidInput
from swarm.sim.sweep import Sweep

STYLES = {"book": "#d62728", "largest-first": "#1f77b4", "largest-fit": "#2ca02c"}


def plot_sweep(sweep: Sweep, path: Path) -> None:
    """Write the figure to ``path``; its suffix picks the format (.png, .svg, .pdf...)."""
    # imported here: the Lambda functions ship swarm/ without matplotlib
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 5.5), dpi=120, layout="constrained")
    formats = fig.canvas.get_supported_filetypes()
    suffix = path.suffix.lstrip(".").lower()
    if suffix not in formats:
        raise InvalidInput(
            "--plot", f"{path}: give a file ending in one of .{', .'.join(sorted(formats))}"
        )
    ax = fig.add_subplot()
    xs = sweep.workers
    many = len(sweep.seeds) > 1
    for policy in sweep.policies:
        cells = [sweep.cell(n, policy) for n in xs]
        color = STYLES.get(policy.value)
        ax.plot(xs, [c.elapsed for c in cells], marker="o", color=color, label=policy.value)
        if many:
            low = [min(r.elapsed for r in c.runs) for c in cells]
            high = [max(r.elapsed for r in c.runs) for c in cells]
            ax.fill_between(xs, low, high, color=color, alpha=0.07, linewidth=0)
    floors = [f for f in (sweep.floor(n) for n in xs) if f is not None]
    if len(floors) == len(xs):
        ax.plot(xs, floors, color="black", linestyle="--", label="floor (quota and workers)")
    quota = sweep.quota_floor
    if quota is not None:
        ax.axhline(quota, color="grey", linestyle=":", label=f"quota floor {quota:,.0f} s")
    ax.axvline(sweep.n_star, color="purple", linestyle="-.", label=f"N* = {sweep.n_star}")
    if sweep.busy != sweep.n_star:
        ax.axvline(
            sweep.busy,
            color="purple",
            linestyle=":",
            label=f"{sweep.busy} workers keep the quota busy",
        )
    ax.set_xscale("log")
    ticks = sorted({*xs, sweep.n_star})
    ax.set_xticks(ticks, [f"{t:,}" for t in ticks])
    ax.minorticks_off()
    ax.set_ylim(bottom=0)
    ax.set_xlabel("workers")
    ax.set_ylabel("makespan (s)" + (f", mean of {len(sweep.seeds)} seeds" if many else ""))
    w, f = sweep.workload, sweep.fleet
    seeds = f"seeds {sweep.seeds[0]}-{sweep.seeds[-1]}" if many else f"seed {w.seed}"
    limits = f"quota {f.quota_tpm:,} TPM x {f.share:g}"
    if f.models is not None:
        limits = f"models {f.models.mix.text()}"
    ax.set_title(
        f"{w.units:,} units of {w.min_tokens:,}-{w.max_tokens:,} tokens ({seeds}) | {limits} | "
        f"failure rate {w.failure_rate:g}, "
        f"{f.max_attempts} attempts",
        fontsize=10,
    )
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    try:
        fig.savefig(path, format=suffix)
    except OSError as e:
        raise InvalidInput("--plot", f"cannot write {path}: {e.strerror or e}") from None
