"""The terminal side of a comparison: the same numbers as the picture, and where it is."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

from ..planner.compare import StrategyResult
from .batch import Batch

__all__ = ["degree_mix", "print_comparison", "summarize"]


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


def print_comparison(results: list[StrategyResult], title: str) -> None:
    """A table of makespan, ratio to the bound, speedup over static CP, degrees, planning ms."""
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
        "plan (ms)",
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
            f"{r.planning_ms:.1f}",
        )
    console = Console()
    if not console.is_terminal:
        console = Console(width=150)
    console.print(table)


def summarize(results: list[StrategyResult], batch: Batch, path: Path) -> None:
    """The comparison table, then the path of the picture that was written."""
    lens = batch.seqlens
    print_comparison(
        results, f"{batch.label}: {lens.size} sequences, max {int(lens.max()):,} tokens"
    )
    print(f"plan picture: {path}", flush=True)
