"""`fcp demo`: the bundled default job.

Plans a long-tailed GitHub-like global batch (512 sequences, up to 128K tokens) for Qwen3-8B on
64 H200 replicas (8 per node, 16K tokens each) with fcp and the baselines, and prints the
comparison. Everything is simulated from the cost model; nothing is trained.
"""

from __future__ import annotations

import argparse

from ..planner import Cluster, CostModel, generate_lengths
from ..planner.compare import DEFAULT_STRATEGIES, compare_strategies
from .simulate import print_comparison

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="plan a bundled long-tailed batch with fcp and the baselines",
        description=__doc__,
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic batch (default 0)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cost = CostModel.from_model("qwen3-8b", "h200")
    cluster = Cluster(64, replicas_per_node=8, tokens_per_replica=16384)
    for profile in ("github", "extreme"):
        lens = generate_lengths(profile, 512, seed=args.seed)
        results = compare_strategies(lens, cluster, cost, DEFAULT_STRATEGIES)
        print_comparison(
            results,
            f"{profile}: 512 sequences (max {int(lens.max())} tokens), "
            "Qwen3-8B on 64 H200 replicas, 16K tokens each",
        )
    return 0
