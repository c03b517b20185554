"""`fcp view`: draw fcp beside static CP and megatron-core's hybrid CP on one global batch.

    fcp view --distribution github --batch 512 -o out/plan.png          # Qwen3-8B, 64 H200
    fcp view --index out/demo/index --batch 32 --replicas 8 --tokens-per-replica 4096 \\
        --cost cpu-small                                               # your data, CPU profile
    fcp view --shards 'shards/text-{000000..000003}.tar' --replicas 8
    fcp plan --distribution extreme -o plan.json && fcp view --plan plan.json

Every strategy is scored by the planner's simulator under one cost model, so the bars are
comparable. Per strategy: replicas (rows) x predicted time, one bar per CP group coloured by
its degree (the same colour for a degree in every picture), labelled where the label fits;
waves bracketed above each panel; the dashed line is the lower bound. The right panel counts
CP groups per degree and their share of tokens. The PNG is never silently overwritten: when
the -o file exists the picture goes to plan-1.png, plan-2.png, ... (--force overwrites), and
the path written is printed.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..planner import STRATEGIES
from ..viewer.compare import VIEW_STRATEGIES as DEFAULT_STRATEGIES
from ._common import add_problem_args, batch_from_args, cluster_from_args, cost_from_args

__all__ = ["register", "run"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "view",
        help="draw the plans of fcp, static CP and megatron-core hybrid CP as a PNG",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_problem_args(p, saved_plan=True)
    p.add_argument(
        "--strategies",
        nargs="+",
        choices=STRATEGIES,
        default=list(DEFAULT_STRATEGIES),
        help=f"strategies to draw (default {' '.join(DEFAULT_STRATEGIES)})",
    )
    p.add_argument(
        "-o",
        "--output",
        type=Path,
        default=Path("out/plan.png"),
        help="PNG to write (default out/plan.png; an existing file gets a numbered sibling)",
    )
    p.add_argument("--force", action="store_true", help="overwrite the -o file if it exists")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..viewer import summarize, view

    batch = batch_from_args(args)
    if batch.saved is not None and args.replicas != batch.saved.num_replicas:
        args.replicas = batch.saved.num_replicas  # the saved plan decides the cluster size
    if args.full_attention:
        import numpy as np

        batch = type(batch)(
            seqlens=batch.seqlens,
            causal=np.zeros(batch.seqlens.size, bool),
            label=batch.label,
            saved=batch.saved,
        )
    cluster, cost = cluster_from_args(args), cost_from_args(args)
    path, results = view(batch, cluster, cost, args.output, args.strategies, force=args.force)
    summarize(results, batch, path)
    return 0
