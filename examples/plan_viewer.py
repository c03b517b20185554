"""Plan viewer over the public API: fcp beside static CP and megatron-core's hybrid CP.

    python examples/plan_viewer.py                                  # github lengths, 64 H200
    python examples/plan_viewer.py --index out/demo/index --replicas 8 --tokens-per-replica 4096

The same picture as `fcp view` (which has every option: --plan, --shards, --lengths, --cost,
...); this script shows the few calls behind it. The PNG is never overwritten: a second run
writes plan-1.png beside plan.png, and the path written is printed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fcp_data.planner import Cluster, CostModel, generate_lengths
from fcp_data.profiles import resolve_cost
from fcp_data.viewer import batch_from_index, batch_from_lengths, summarize, view


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--index", type=Path, help="a length index (`fcp index`); default: synthetic")
    p.add_argument("--distribution", default="github", help="synthetic lengths (default github)")
    p.add_argument("--batch", type=int, default=512, help="sequences per global batch")
    p.add_argument("--replicas", type=int, default=64)
    p.add_argument("--tokens-per-replica", type=int, default=16384)
    p.add_argument("--cost", help="a cost profile: shipped name (cpu-small) or JSON path")
    p.add_argument("-o", "--output", type=Path, default=Path("out/plan.png"))
    args = p.parse_args(argv)

    if args.index is not None:
        batch = batch_from_index(args.index, batch_size=args.batch)
    else:
        lens = generate_lengths(args.distribution, args.batch, seed=0)
        batch = batch_from_lengths(lens, f"synthetic {args.distribution}")
    if args.cost:
        cost = CostModel.load(resolve_cost(args.cost))
    else:
        cost = CostModel.from_model("qwen3-8b", "h200")
    cluster = Cluster(
        args.replicas, replicas_per_node=8, tokens_per_replica=args.tokens_per_replica
    )
    path, results = view(batch, cluster, cost, args.output)
    summarize(results, batch, path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
