"""`fcp plan`: plan one global batch and print it (a table, or the Plan as JSON).

The JSON (`--json`, `-o FILE`) is the Plan with the cost model and cluster it was made with
beside its fields (`fcp_data.viewer.saved`): `Plan.from_json` reads it as before, and
`fcp view --plan FILE` prices and compares that plan under them, not under the flags'
defaults. The planning time printed is warm: the strategy first plans a tiny batch, untimed,
so that numba's compilation and megatron-core's import (paid once per process, ~15 s and
~6 s) are not reported as the cost of planning a batch.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from fcp_data.planner import STRATEGIES, format_degrees, plan_global_batch, why_one_degree
from fcp_data.viewer.compare import warm_up
from fcp_data.viewer.saved import plan_document

from ._args import int_in
from ._common import (
    add_problem_args,
    batch_from_args,
    cluster_and_budget_from_args,
    cost_from_args,
    print_budget,
)
from ._output import write_atomic

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan",
        help="plan one global batch (waves, CP groups, degrees, sequences)",
        description="Plan one global batch (from a length index, shards, a lengths file or a "
        "synthetic distribution) for a cluster and cost model; print the waves and CP groups, "
        "or the Plan as JSON.",
    )
    add_problem_args(p)
    p.add_argument(
        "--strategy", choices=STRATEGIES, default="fcp", help="the planner to use (default fcp)"
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print the Plan as JSON, with its cost model and cluster (Plan.from_json reads it)",
    )
    p.add_argument(
        "-o",
        "--output",
        type=Path,
        help="also write the Plan JSON here, with the cost model and cluster it was made with "
        "(`fcp view --plan` draws and prices it with those)",
    )
    p.add_argument(
        "--max-rows", type=int_in(0), default=40, help="groups shown in the table (default 40)"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    batch = batch_from_args(args)
    lens = batch.seqlens
    causal = False if args.full_attention else batch.causal
    (cluster, budget), cost = cluster_and_budget_from_args(args), cost_from_args(args)
    print_budget(budget, to_stderr=args.json)
    warm_up([args.strategy], lens, cluster, cost, causal=causal)
    t0 = time.perf_counter()
    plan = plan_global_batch(lens, cluster, cost, strategy=args.strategy, causal=causal)
    ms = (time.perf_counter() - t0) * 1e3
    doc = plan_document(plan, cost, cluster)
    if args.output:
        write_atomic(args.output, doc)
        print(f"wrote {args.output}", file=sys.stderr if args.json else sys.stdout)
    if args.json:
        sys.stdout.write(doc.decode())
        return 0
    from rich.console import Console
    from rich.table import Table

    con = Console()
    con.print(
        f"[bold]{args.strategy}[/] plan of {len(lens)} sequences on "
        f"{cluster.num_replicas} replicas: "
        f"{plan.num_waves} waves, predicted {plan.predicted_time:.3f} s, lower bound "
        f"{plan.lower_bound:.3f} s (×{plan.ratio_to_bound:.3f}), winner {plan.winner}, "
        f"planned in {ms:.1f} ms (warm), digest {plan.digest}"
    )
    con.print(f"degrees: {format_degrees(plan.degrees)}")
    why = why_one_degree(plan, cluster, cost)
    if why is not None:
        con.print(f"one degree for every group: {why}", soft_wrap=True)
    table = Table("wave", "replicas", "degree", "sequences", "tokens", "time (s)")
    rows = [(w, g) for w, wave in enumerate(plan.waves) for g in wave.groups]
    for w, g in rows[: args.max_rows]:
        reps = f"{g.replicas[0]}-{g.replicas[-1]}" if g.degree > 1 else str(g.replicas[0])
        table.add_row(
            str(w),
            reps,
            str(g.degree),
            str(len(g.sequence_ids)),
            str(g.num_tokens),
            f"{g.predicted_time:.3f}",
        )
    con.print(table)
    if len(rows) > args.max_rows:
        con.print(f"… {len(rows) - args.max_rows} more groups (--max-rows, or --json for all)")
    if plan.dropped:
        con.print(f"[yellow]dropped {len(plan.dropped)} sequences too long for the cluster[/]")
    return 0
