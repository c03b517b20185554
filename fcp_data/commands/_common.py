"""Options shared by the planning subcommands (`plan`, `simulate`, `view`).

One meaning per flag across the command line:
  --model      the model being trained: a planner preset (qwen3-8b, ...) for the analytic cost
  --hardware   the accelerator preset the analytic cost assumes (h200, a100-80gb, ...)
  --device     (only `fcp profile`) the torch device to time on: cpu, cuda, cuda:1, npu
  --cost       a measured cost profile: a shipped name (cpu-small) or a JSON path
  --strategy   the one planner to use; --strategies: several, side by side
  -o/--output  the file or directory a command writes
Lengths come from exactly one source: --plan (view only), --index, --shards, --lengths or a
synthetic --distribution (github when none is given).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from ..errors import ConfigError
from ..planner import DEVICES, DISTRIBUTIONS, MODELS, Cluster, CostModel, generate_lengths

__all__ = [
    "add_problem_args",
    "batch_from_args",
    "cluster_from_args",
    "cost_from_args",
    "lengths_from_args",
]


def add_problem_args(p: argparse.ArgumentParser, *, saved_plan: bool = False) -> None:
    """Length sources, batch drawing, cluster and cost flags (`saved_plan`: add --plan)."""
    src = p.add_argument_group("lengths (one source)").add_mutually_exclusive_group()
    if saved_plan:
        src.add_argument("--plan", type=Path, help="a Plan JSON (`fcp plan -o`); drawn first")
    src.add_argument("--index", type=Path, help="length index directory (`fcp index -o DIR`)")
    src.add_argument("--shards", nargs="+", metavar="SPEC", help="shard specs, scanned in memory")
    src.add_argument(
        "--lengths", type=Path, help="file of token counts: .npy, .json list, or one per line"
    )
    src.add_argument(
        "--distribution",
        choices=sorted(DISTRIBUTIONS),
        help="synthetic length distribution (the default source: github)",
    )
    b = p.add_argument_group("the global batch")
    b.add_argument(
        "--batch",
        type=int,
        default=512,
        help="sequences per global batch (--distribution, --index, --shards; default 512)",
    )
    b.add_argument(
        "--batch-index",
        type=int,
        default=0,
        help="which global batch of epoch 0 to take from --index/--shards (default 0)",
    )
    b.add_argument("--seed", type=int, default=0, help="seed of lengths / sampler (default 0)")
    cl = p.add_argument_group("cluster and cost")
    cl.add_argument(
        "--replicas", type=int, default=64, help="N, model replicas in the DP×CP domain (64)"
    )
    cl.add_argument(
        "--replicas-per-node", type=int, help="replicas per node (default: the hardware's)"
    )
    cl.add_argument(
        "--tokens-per-replica",
        type=int,
        default=16384,
        help="tokens one replica holds (default 16384); 0: derive it from --hardware memory",
    )
    cl.add_argument(
        "--model",
        default="qwen3-8b",
        help=f"model preset of the analytic cost (default qwen3-8b; {', '.join(sorted(MODELS))})",
    )
    cl.add_argument(
        "--hardware",
        default="h200",
        help=f"accelerator preset of the analytic cost (default h200; {', '.join(DEVICES)})",
    )
    cl.add_argument(
        "--cost",
        metavar="NAME|FILE",
        help="measured cost profile: a shipped name (cpu-small) or a JSON from `fcp profile`, "
        "relative to the working directory; overrides --model/--hardware",
    )
    cl.add_argument(
        "--full-attention", action="store_true", help="plan every sequence as bidirectional (eta)"
    )


def lengths_from_args(args: argparse.Namespace) -> np.ndarray:
    """Token counts from --lengths, else the synthetic --distribution (github by default)."""
    if args.lengths is None:
        return generate_lengths(args.distribution or "github", args.batch, seed=args.seed)
    path: Path = args.lengths
    if not path.is_file():
        raise ConfigError(f"--lengths {path}: no such file (relative to the working directory)")
    if path.suffix == ".npy":
        return np.load(path)
    text = path.read_text()
    if path.suffix == ".json":
        return np.asarray(json.loads(text))
    vals = [ln.strip() for ln in text.splitlines() if ln.strip()]
    try:
        return np.asarray([int(v) for v in vals])
    except ValueError as exc:
        raise ConfigError(
            f"--lengths {path}: every line must be one integer token count ({exc})"
        ) from exc


def batch_from_args(args: argparse.Namespace) -> object:
    """The global batch the source flags name, as a `fcp_data.viewer.Batch`."""
    from ..viewer import batch as vb

    if getattr(args, "plan", None) is not None:
        return vb.batch_from_plan(args.plan)
    kw = {"batch_size": args.batch, "seed": args.seed, "batch_index": args.batch_index}
    if args.index is not None:
        return vb.batch_from_index(args.index, **kw)
    if args.shards:
        return vb.batch_from_shards(args.shards, **kw)
    label = (
        f"lengths {args.lengths}" if args.lengths else f"synthetic {args.distribution or 'github'}"
    )
    return vb.batch_from_lengths(lengths_from_args(args), label)


def cost_from_args(args: argparse.Namespace) -> CostModel:
    """--cost (shipped name or path) if given, else the analytic --model on --hardware."""
    if args.cost is not None:
        from ..profiling.shipped import resolve_cost

        return CostModel.load(resolve_cost(args.cost))
    for flag, value, table in (
        ("--model", args.model, MODELS),
        ("--hardware", args.hardware, DEVICES),
    ):
        if str(value).lower() not in table:
            raise ConfigError(
                f"{flag} {value!r} is not a preset; known: {', '.join(sorted(table))}"
            )
    return CostModel.from_model(args.model, args.hardware)


def cluster_from_args(args: argparse.Namespace) -> Cluster:
    """Replicas, replicas per node and per-replica memory from the cluster flags."""
    dev = DEVICES.get(str(args.hardware).lower())
    rpn = args.replicas_per_node
    if rpn is None:
        rpn = dev.replicas_per_node if dev is not None else args.replicas
    if args.tokens_per_replica:
        return Cluster(
            args.replicas, replicas_per_node=rpn, tokens_per_replica=args.tokens_per_replica
        )
    if dev is None:
        raise ConfigError(
            f"--tokens-per-replica 0 needs a known --hardware; got {args.hardware!r} "
            f"(known: {', '.join(sorted(DEVICES))})"
        )
    return Cluster(args.replicas, replicas_per_node=rpn, memory_bytes=dev.memory_bytes)
