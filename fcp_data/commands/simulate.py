"""`fcp simulate`: strategies side by side on one global batch (predicted times, same model)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter

import numpy as np

from ..planner import STRATEGIES
from ..planner.compare import DEFAULT_STRATEGIES, StrategyResult, compare_strategies
from ._common import add_problem_args, cluster_from_args, cost_from_args, lengths_from_args

__all__ = ["print_comparison", "register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "simulate",
        help="compare fcp with static CP, pow2 and megatron-core hybrid CP on one batch",
        description="Plan the same global batch with several strategies and score every plan "
        "with the same cost model: makespan, ratio to the lower bound, speedup over static CP, "
        "utilisation, degree mix and planning time.",
    )
    add_problem_args(p)
    p.add_argument(
        "--strategies",
        nargs="+",
        choices=STRATEGIES,
        default=list(DEFAULT_STRATEGIES),
        help="strategies to compare (default: %(default)s)",
    )
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(func=run)


def degree_mix(res: StrategyResult) -> str:
    if res.plan is None:
        return "-"
    c = Counter(res.plan.degrees)
    return ", ".join(f"⟨{d}⟩×{n}" for d, n in sorted(c.items(), reverse=True)[:6]) + (
        " …" if len(c) > 6 else ""
    )


def print_comparison(results: list[StrategyResult], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    static = next((r.makespan for r in results if r.strategy == "static" and r.plan), math.nan)
    table = Table(title=title)
    for col in (
        "strategy",
        "makespan (s)",
        "× lower bound",
        "speedup vs static",
        "utilization",
        "waves",
        "degrees",
        "plan (ms)",
    ):
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


def run(args: argparse.Namespace) -> int:
    lens = lengths_from_args(args)
    cluster, cost = cluster_from_args(args), cost_from_args(args)
    results = compare_strategies(
        lens, cluster, cost, args.strategies, causal=not args.full_attention
    )
    if args.json:
        rows = [
            {
                "strategy": r.strategy,
                "makespan": r.makespan,
                "ratio": r.ratio,
                "utilization": r.utilization,
                "planning_ms": r.planning_ms,
                "waves": r.plan.num_waves if r.plan else None,
                "degrees": r.plan.degrees if r.plan else None,
                "error": r.error,
            }
            for r in results
        ]
        json.dump(rows, sys.stdout, indent=1, default=float)
        sys.stdout.write("\n")
        return 0
    title = (
        f"{len(lens)} sequences (max {int(np.max(lens))}, mean {float(np.mean(lens)):.0f} "
        f"tokens) on {cluster.num_replicas} replicas, {cost.name}"
    )
    print_comparison(results, title)
    return 0
