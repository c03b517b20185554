"""Options shared by the planning subcommands: where lengths, the cluster and the cost come from."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from ..planner import DEVICES, DISTRIBUTIONS, MODELS, Cluster, CostModel, generate_lengths

__all__ = ["add_problem_args", "cluster_from_args", "cost_from_args", "lengths_from_args"]


def add_problem_args(p: argparse.ArgumentParser) -> None:
    src = p.add_argument_group("lengths (one of)")
    src.add_argument(
        "--lengths",
        type=Path,
        help="file of token counts: .npy, .json list, or text (one per line)",
    )
    src.add_argument(
        "--distribution",
        choices=sorted(DISTRIBUTIONS),
        default="github",
        help="synthetic length distribution (default: github)",
    )
    src.add_argument(
        "--batch",
        type=int,
        default=512,
        help="sequences per global batch for --distribution (default 512)",
    )
    src.add_argument("--seed", type=int, default=0, help="seed of the length generator (default 0)")
    cl = p.add_argument_group("cluster and cost")
    cl.add_argument(
        "--replicas",
        type=int,
        default=64,
        help="N, model replicas in the DP×CP domain (default 64)",
    )
    cl.add_argument(
        "--replicas-per-node", type=int, help="replicas per node (default: the device's)"
    )
    cl.add_argument(
        "--tokens-per-replica",
        type=int,
        default=16384,
        help="tokens one replica holds (default 16384); 0: derive it from --device memory",
    )
    cl.add_argument(
        "--model",
        default="qwen3-8b",
        help=f"model preset (default qwen3-8b; known: {', '.join(sorted(MODELS))})",
    )
    cl.add_argument(
        "--device",
        default="h200",
        help=f"device preset (default h200; known: {', '.join(sorted(DEVICES))})",
    )
    cl.add_argument(
        "--cost",
        type=Path,
        help="cost-model JSON (from `fcp profile` or CostModel.save); overrides --model/--device",
    )
    cl.add_argument(
        "--full-attention", action="store_true", help="plan every sequence as bidirectional (eta)"
    )


def lengths_from_args(args: argparse.Namespace) -> np.ndarray:
    if args.lengths is None:
        return generate_lengths(args.distribution, args.batch, seed=args.seed)
    path: Path = args.lengths
    if not path.exists():
        raise FileNotFoundError(f"--lengths {path} does not exist")
    if path.suffix == ".npy":
        return np.load(path)
    text = path.read_text()
    if path.suffix == ".json":
        return np.asarray(json.loads(text))
    vals = [ln.strip() for ln in text.splitlines() if ln.strip()]
    try:
        return np.asarray([int(v) for v in vals])
    except ValueError as exc:
        raise ValueError(
            f"--lengths {path}: every line must be one integer token count ({exc})"
        ) from exc


def cost_from_args(args: argparse.Namespace) -> CostModel:
    if args.cost is not None:
        return CostModel.load(args.cost)
    return CostModel.from_model(args.model, args.device)


def cluster_from_args(args: argparse.Namespace) -> Cluster:
    rpn = args.replicas_per_node
    if rpn is None:
        dev = DEVICES.get(str(args.device).lower())
        rpn = dev.replicas_per_node if dev is not None else args.replicas
    if args.tokens_per_replica:
        return Cluster(
            args.replicas, replicas_per_node=rpn, tokens_per_replica=args.tokens_per_replica
        )
    dev = DEVICES.get(str(args.device).lower())
    if dev is None:
        raise ValueError(f"--tokens-per-replica 0 needs a known --device; got {args.device!r}")
    return Cluster(args.replicas, replicas_per_node=rpn, memory_bytes=dev.memory_bytes)
