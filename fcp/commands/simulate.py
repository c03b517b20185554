"""`fcp simulate`: strategies side by side on one global batch (predicted times, same model).

Planning times (the table's "plan (ms, warm)", the JSON's "planning_ms") are warm: each
strategy plans a tiny batch first, untimed (`fcp_data.viewer.compare.warm_up`), so numba's
compilation and megatron-core's import, paid once per process, are not counted.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from fcp_data.planner import STRATEGIES
from fcp_data.planner.compare import DEFAULT_STRATEGIES
from fcp_data.viewer.compare import compare_warm
from fcp_data.viewer.summary import print_comparison

from ._common import (
    add_problem_args,
    batch_from_args,
    cluster_and_budget_from_args,
    cost_from_args,
    print_budget,
)
from ._output import write_atomic

__all__ = ["register", "run"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "simulate",
        help="compare fcp with static CP, pow2, megatron-core hybrid CP and Megatron-LM dev's "
        "dynamic CP on one batch",
        description="Plan the same global batch with several strategies and score every plan "
        "with the same cost model: makespan, ratio to the lower bound, speedup over static CP, "
        "utilisation, degree mix and (warm) planning time.",
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
    p.add_argument("-o", "--output", type=Path, help="also write the results JSON here")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    batch = batch_from_args(args)
    lens = batch.seqlens
    causal = False if args.full_attention else batch.causal
    (cluster, budget), cost = cluster_and_budget_from_args(args), cost_from_args(args)
    print_budget(budget, to_stderr=args.json)
    results = compare_warm(lens, cluster, cost, args.strategies, causal=causal)
    rows = [
        {
            "strategy": r.strategy,
            "makespan": r.makespan,
            "ratio": r.ratio,
            "utilization": r.utilization,
            "planning_ms": r.planning_ms,  # warm
            "sequences": len(r.plan.sequence_ids()) if r.plan else None,
            "dropped": len(r.plan.dropped) if r.plan else None,
            "waves": r.plan.num_waves if r.plan else None,
            "degrees": r.plan.degrees if r.plan else None,
            "error": r.error,
        }
        for r in results
    ]
    if args.output:
        write_atomic(args.output, (json.dumps(rows, indent=1, default=float) + "\n").encode())
    if args.json:
        json.dump(rows, sys.stdout, indent=1, default=float)
        sys.stdout.write("\n")
        return 0
    title = (
        f"{len(lens)} sequences (max {int(np.max(lens))}, mean {float(np.mean(lens)):.0f} "
        f"tokens) on {cluster.num_replicas} replicas, {cost.name}"
    )
    print_comparison(results, title, len(lens))
    return 0
