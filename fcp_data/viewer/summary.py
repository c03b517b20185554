"""The terminal side of a comparison: the same numbers as the picture, and where it is.

Planning times are warm (`compare.warm_up`: each strategy planned a tiny batch first), and
the column says so. A plan that leaves sequences out (too long for the whole cluster) is named
under the table with how many it placed, so no count is silently smaller than the batch.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

from ..planner.compare import StrategyResult
from .batch import Batch

__all__ = ["degree_mix", "left_out", "print_comparison", "summarize"]


def degree_mix(res: StrategyResult) -> str:
    """ "⟨8⟩×2, ⟨1⟩×12": CP groups per degree, widest first (6 at most); "; 3 hybrid" counts
    the groups that run the head-parallel hybrid instead of the ring."""
    if res.plan is None:
        return "-"
    c = Counter(res.plan.degrees)
    hybrid = sum(g.ulysses > 1 for g in res.plan.groups)
    return (
        ", ".join(f"⟨{d}⟩×{n}" for d, n in sorted(c.items(), reverse=True)[:6])
        + (" …" if len(c) > 6 else "")
        + (f"; {hybrid} hybrid" if hybrid else "")
    )


def left_out(res: StrategyResult, num_sequences: int) -> str:
    """ "" when the plan places every sequence, else "placed 139 of 220 sequences: 81 too long
    for the cluster, left out" (and any that are neither placed nor listed as dropped)."""
    if res.plan is None:
        return ""
    placed = len(res.plan.sequence_ids())
    if placed >= num_sequences:
        return ""
    dropped = len(res.plan.dropped)
    missing = num_sequences - placed - dropped
    parts = [f"{dropped} too long for the cluster, left out"] if dropped else []
    if missing > 0:
        parts.append(f"{missing} missing from the plan")
    return f"placed {placed} of {num_sequences} sequences: {', '.join(parts)}"


def print_comparison(
    results: list[StrategyResult], title: str, num_sequences: int | None = None
) -> None:
    """A table of makespan, ratio to the bound, speedup over static CP, degrees, warm planning
    ms; then, given the batch's `num_sequences`, one line per plan that left sequences out."""
    from rich.console import Console
    from rich.table import Table

    static = next((r.makespan for r in results if r.strategy == "static" and r.plan), math.nan)
    table = Table(title=title)
    cols = (
        "strategy",
        "makespan (s)",
        "× lower bound",
        "speedup vs static",
        "utilization",
        "waves",
        "degrees",
        "plan (ms, warm)",
    )
    for col in cols:
        table.add_column(col, justify="left" if col in ("strategy", "degrees") else "right")
    for r in results:
        if r.plan is None:
            table.add_row(r.strategy, "-", "-", "-", "-", "-", f"[red]{r.error[:60]}[/]", "-")
            continue
        table.add_row(
            r.strategy,
            f"{r.makespan:.3f}",
            f"{r.ratio:.3f}",
            f"{static / r.makespan:.2f}x" if static == static else "-",
            f"{r.utilization:.1%}",
            str(r.plan.num_waves),
            degree_mix(r),
            "-" if math.isnan(r.planning_ms) else f"{r.planning_ms:.1f}",  # saved: not planned
        )
    console = Console()
    if not console.is_terminal:
        console = Console(width=150)
    console.print(table)
    for r in results if num_sequences is not None else ():
        note = left_out(r, num_sequences)
        if note:
            console.print(f"[yellow]{r.strategy}: {note}[/]", soft_wrap=True)


def summarize(results: list[StrategyResult], batch: Batch, path: Path) -> None:
    """The comparison table, then the path of the picture that was written."""
    lens = batch.seqlens
    print_comparison(
        results, f"{batch.label}: {lens.size} sequences, max {int(lens.max()):,} tokens", lens.size
    )
    print(f"plan picture: {path}", flush=True)
