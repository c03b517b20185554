"""Options shared by the planning subcommands (`plan`, `simulate`, `view`).

One meaning per flag across the command line:
  --model      the model being trained: a planner preset (qwen3-8b, ...) for the analytic cost
  --hardware   the accelerator preset the analytic cost assumes (h200, a100-80gb, ...)
  --device     (only `fcp profile`) the torch device to time on: cpu, cuda, cuda:1, npu
  --cost       a measured cost profile: a shipped name (cpu-small) or a JSON path
  --strategy   the one planner to use; --strategies: several, side by side
  --tp/--pp/--sequence-parallel/--zero/--recompute  the replica's layout: compute and ring links
               of the analytic cost, the pad unit, replicas per node, and the derived
               --tokens-per-replica (docs/memory.md)
  -o/--output  the file or directory a command writes
Lengths come from exactly one source: --plan (view only), --index, --shards, --lengths or a
synthetic --distribution (github when none is given).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from fcp_data.errors import ConfigError
from fcp_data.planner import (
    DEVICES,
    DISTRIBUTIONS,
    IDLE_POLICIES,
    MODELS,
    Cluster,
    CostModel,
    generate_lengths,
)
from fcp_data.planner.cost.memory import (
    DEFAULT_RESERVE,
    RECOMPUTE,
    ZERO_STAGES,
    MemoryBudget,
    ParallelLayout,
    derive_tokens_per_replica,
    replicas_per_node,
)
from fcp_data.viewer.saved import MAX_REPLICAS  # a saved plan file is held to it too

from ._args import MAX_BATCH, MAX_TOKENS_PER_REPLICA, float_in, int_in

__all__ = [
    "add_problem_args",
    "batch_from_args",
    "cluster_and_budget_from_args",
    "cluster_from_args",
    "cost_from_args",
    "cost_identity",
    "layout_from_args",
    "lengths_from_args",
    "print_budget",
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
        type=int_in(1, MAX_BATCH, why="sequences; larger batches exhaust the planner's memory"),
        default=512,
        help="sequences per global batch (--distribution, --index, --shards; default 512, at "
        f"most {MAX_BATCH:,})",
    )
    b.add_argument(
        "--batch-index",
        type=int_in(0),
        default=0,
        help="which global batch of epoch 0 to take from --index/--shards (default 0)",
    )
    b.add_argument(
        "--seed",
        type=int_in(0, 2**63 - 1),
        default=0,
        help="seed of lengths / sampler (default 0)",
    )
    cl = p.add_argument_group("cluster and cost")
    cl.add_argument(
        "--replicas",
        type=int_in(1, MAX_REPLICAS, why="planning more replicas takes minutes and GBs"),
        default=64,
        help=f"N, model replicas in the DP×CP domain (64; at most {MAX_REPLICAS:,})",
    )
    cl.add_argument(
        "--replicas-per-node",
        type=int_in(1, MAX_REPLICAS),
        help="replicas per node (default: the hardware's)",
    )
    cl.add_argument(
        "--tokens-per-replica",
        type=int_in(0, MAX_TOKENS_PER_REPLICA),
        default=None,
        help="tokens one replica holds; default (or 0): derived from --hardware memory, --model "
        "and the layout flags below (docs/memory.md); required with a --cost profile of "
        "another model or device (cpu-small)",
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
    cl.add_argument(
        "--head-parallel",
        action="store_true",
        help="also price the head-parallel hybrid u x r (all-to-all over u members, ring over "
        "the rest) for every u the --model's heads allow per TP rank, chosen per CP group; "
        "train with fcp_exec.cp_attention",
    )
    lay = p.add_argument_group("replica layout (docs/memory.md)")
    lay.add_argument(
        "--tp",
        type=int_in(1, 1024),
        default=1,
        help="tensor-parallel devices per replica (default 1)",
    )
    lay.add_argument(
        "--pp",
        type=int_in(1, 1024),
        default=1,
        help="pipeline-parallel stages per replica (default 1)",
    )
    lay.add_argument(
        "--sequence-parallel",
        action="store_true",
        help="megatron sequence parallel: activations split over TP, sequences padded to 2d x TP",
    )
    lay.add_argument(
        "--zero",
        type=int,
        choices=ZERO_STAGES,
        default=1,
        help="ZeRO stage over the N replicas: 0 none, 1 optimizer states (megatron's "
        "distributed optimizer, the default), 2 and gradients, 3 and weights (FSDP)",
    )
    lay.add_argument(
        "--recompute",
        choices=RECOMPUTE,
        default="selective",
        help="activation recompute (default selective; full keeps only each layer's input)",
    )
    lay.add_argument(
        "--devices-per-node",
        type=int_in(1, 1024),
        help="devices per node (default: the hardware's); replicas per node = this // (TP x PP)",
    )
    lay.add_argument(
        "--idle",
        choices=IDLE_POLICIES,
        default="placeholder",
        help="a replica without a group in a wave: placeholder (default: runs 2 loss-free "
        "tokens, priced), empty (skips; plain loops only), fill (placeholder, and the planner "
        "tries to give idle slots work)",
    )
    lay.add_argument(
        "--sync-waves",
        action="store_true",
        help="score every wave as ending with a barrier (FSDP / ZeRO-3: per-layer all-gathers)",
    )
    lay.add_argument(
        "--memory-reserve",
        type=float_in(0.0, 1e15, why="a fraction < 1 or bytes"),
        default=DEFAULT_RESERVE,
        help="device memory kept back: a fraction < 1 (default 0.1) or bytes (8e9)",
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
    from fcp_data.viewer import batch as vb

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
    """--cost (shipped name or path) if given, else the analytic --model on --hardware, for a
    replica of --tp x --pp devices (a profile is taken as measured on one replica)."""
    if args.cost is not None:
        from fcp_data.profiles import resolve_cost

        cost = CostModel.load(resolve_cost(args.cost))
        if getattr(args, "head_parallel", False) and not cost.head_parallel:
            from dataclasses import replace

            from fcp_data.planner.cost.estimate import head_parallel_terms
            from fcp_data.planner.cost.presets import model_spec

            # a profile measures one replica, not its heads: those come from --model
            cost = replace(
                cost,
                **head_parallel_terms(
                    model_spec(args.model),
                    tensor_parallel=_layout_int(args, "tp"),
                    pipeline_parallel=_layout_int(args, "pp"),
                ),
            )
        return cost
    for flag, value, table in (
        ("--model", args.model, MODELS),
        ("--hardware", args.hardware, DEVICES),
    ):
        if str(value).lower() not in table:
            raise ConfigError(
                f"{flag} {value!r} is not a preset; known: {', '.join(sorted(table))}"
            )
    return CostModel.from_model(
        args.model,
        args.hardware,
        tensor_parallel=_layout_int(args, "tp"),
        pipeline_parallel=_layout_int(args, "pp"),
        head_parallel=bool(getattr(args, "head_parallel", False)),
    )


def _layout_int(args: argparse.Namespace, name: str) -> int:
    value = getattr(args, name, 1)
    if value < 1:
        raise ConfigError(f"--{name} {value} must be >= 1 (devices per replica)")
    return value


def layout_from_args(args: argparse.Namespace) -> ParallelLayout:
    """The replica layout of --tp, --pp, --sequence-parallel, --zero and --recompute."""
    tp, pp = _layout_int(args, "tp"), _layout_int(args, "pp")
    if args.sequence_parallel and tp == 1:
        raise ConfigError("--sequence-parallel needs --tp > 1 (it splits activations over TP)")
    return ParallelLayout(
        tensor_parallel=tp,
        pipeline_parallel=pp,
        sequence_parallel=bool(args.sequence_parallel),
        zero_stage=args.zero,
        recompute=args.recompute,
    )


def _node_args(args: argparse.Namespace, layout: ParallelLayout) -> dict[str, int | None]:
    """--replicas-per-node and --devices-per-node (else the hardware preset's devices per node)
    as `Cluster` takes them: the Cluster applies the one rule (`cluster._replicas_per_node`)."""
    dpn, rpn = args.devices_per_node, args.replicas_per_node
    if dpn is not None and dpn < 1:
        raise ConfigError(f"--devices-per-node {dpn} must be >= 1")
    if rpn is None and dpn is None:
        dev = DEVICES.get(str(args.hardware).lower())
        if dev is not None:
            dpn = dev.replicas_per_node  # the preset's devices per node (8 for an H200 node)
        elif layout.devices > 1:
            raise ConfigError(
                f"--hardware {args.hardware!r} is not a preset, so its devices per node are "
                f"unknown, and a replica spans TP x PP = {layout.devices} devices: give "
                "--devices-per-node (or --replicas-per-node)"
            )
    if dpn is not None:  # the flags' errors name the flags (the Cluster would name its fields)
        derived = replicas_per_node(dpn, layout.tensor_parallel, layout.pipeline_parallel)
        if rpn is not None and derived != rpn:
            raise ConfigError(
                f"--replicas-per-node {rpn} contradicts --devices-per-node {dpn} at "
                f"TP x PP = {layout.devices} ({derived} per node); give one of them"
            )
    return {"replicas_per_node": rpn, "devices_per_node": dpn}


def cluster_and_budget_from_args(
    args: argparse.Namespace,
) -> tuple[Cluster, MemoryBudget | None]:
    """The cluster of the flags and, when --tokens-per-replica is not given (or 0), the memory
    budget it was derived from (`memory.derive_tokens_per_replica`); None when given."""
    layout = layout_from_args(args)
    nodes = _node_args(args, layout)
    if args.tokens_per_replica:
        return (
            Cluster(
                args.replicas,
                **nodes,  # type: ignore[arg-type]
                tokens_per_replica=args.tokens_per_replica,
                tensor_parallel=layout.tensor_parallel,
                pipeline_parallel=layout.pipeline_parallel,
                sequence_parallel=layout.sequence_parallel,
                idle=args.idle,
                sync_waves=args.sync_waves,
            ),
            None,
        )
    for flag, value, table in (
        ("--model", args.model, MODELS),
        ("--hardware", args.hardware, DEVICES),
    ):
        if str(value).lower() not in table:
            raise ConfigError(
                f"{flag} {value!r} is not a preset; known: {', '.join(sorted(table))} (the "
                "memory model derives --tokens-per-replica from both; or give it)"
            )
    _check_memory_model_matches_cost(args)
    dev = DEVICES[str(args.hardware).lower()]
    budget = derive_tokens_per_replica(
        args.model, layout, dev.memory_bytes, args.replicas, reserve=args.memory_reserve
    )
    cluster = Cluster.from_budget(
        budget,
        **nodes,
        idle=args.idle,
        sync_waves=args.sync_waves,  # type: ignore[arg-type]
    )
    return cluster, budget


def cost_identity(name: str) -> tuple[str, str] | None:
    """(model, device) a cost model's name starts with: "cpu-small@cpu (measured, 1 thread)"
    -> ("cpu-small", "cpu"), "qwen3-8b@h200 TP=1 PP=1 (analytic)" -> ("qwen3-8b", "h200");
    None for a name without "MODEL@DEVICE" (a hand-made CostModel)."""
    head = name.split(maxsplit=1)[0] if name.strip() else ""
    model, at, device = head.partition("@")
    return (model.lower(), device.lower()) if at and model and device else None


def _check_memory_model_matches_cost(args: argparse.Namespace) -> None:
    """ConfigError unless the memory model that would derive --tokens-per-replica (--model on
    --hardware) is the model and device the --cost profile was measured for.

    The derivation needs a model's parameters and activations and a device's memory; a profile
    measures neither. Deriving anyway gave `fcp plan --cost cpu-small` 11,756 tokens from
    Qwen3-8B on a 141 GB H200 and printed it beside "cpu-small@cpu": a capacity from another
    machine. A profile of a preset model on a preset device ("qwen3-8b@h200 ...") matches
    --model qwen3-8b --hardware h200 and derives as the analytic cost does."""
    if args.cost is None:
        return
    from fcp_data.profiles import resolve_cost

    cost = CostModel.load(resolve_cost(args.cost))
    mine = (str(args.model).lower(), str(args.hardware).lower())
    theirs = cost_identity(cost.name)
    if theirs == mine:
        return
    measured = f"{theirs[0]} on {theirs[1]}" if theirs else f"{cost.name!r}"
    raise ConfigError(
        f"--tokens-per-replica is required with --cost {args.cost}: the profile prices "
        f"{measured}, while the memory model would derive the capacity from --model "
        f"{args.model} on --hardware {args.hardware} (another model and device); give "
        "--tokens-per-replica N (tokens one replica holds, e.g. 4096 for cpu-small on a CPU), "
        "or the profile's own --model and --hardware when they are presets"
    )


def cluster_from_args(args: argparse.Namespace) -> Cluster:
    """Replicas, replicas per node, layout and per-replica tokens from the cluster flags."""
    return cluster_and_budget_from_args(args)[0]


def print_budget(budget: MemoryBudget | None, *, to_stderr: bool = False) -> None:
    """The derivation of tokens_per_replica in two lines (stderr when stdout carries JSON)."""
    if budget is not None:
        print(budget.summary(), file=sys.stderr if to_stderr else sys.stdout)
