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
CP groups per degree and their share of tokens. A plan saved by `fcp plan -o` (or `fcp demo`)
records the cost model and cluster it was made with: --plan draws and prices it, and plans the
other strategies, with those, and refuses cluster or cost flags that contradict them. The PNG
is never silently overwritten: when the -o file exists the picture goes to plan-1.png,
plan-2.png, ... (--force overwrites), and the path written is printed.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from fcp_data.errors import ConfigError
from fcp_data.planner import STRATEGIES, Cluster, CostModel, why_one_degree
from fcp_data.viewer.compare import VIEW_STRATEGIES as DEFAULT_STRATEGIES

from ._common import add_problem_args, batch_from_args, cluster_from_args, cost_from_args

__all__ = ["CONTEXT_FLAGS", "describe_cluster", "register", "run"]

# The flags that decide the cluster and the cost model. Their parser defaults are replaced by
# None so that `run` can tell a flag the user gave from a default: a saved plan that records
# its cost model and cluster is drawn with those, and a given flag must agree with them.
CONTEXT_FLAGS = (
    "replicas",
    "replicas_per_node",
    "tokens_per_replica",
    "model",
    "hardware",
    "cost",
    "full_attention",
    "head_parallel",
    "tp",
    "pp",
    "sequence_parallel",
    "zero",
    "recompute",
    "devices_per_node",
    "idle",
    "sync_waves",
    "memory_reserve",
)
# flags whose value is a field of the saved Cluster (read-only: no module-level mutable state)
_CLUSTER_FIELDS = MappingProxyType(
    {
        "replicas": "num_replicas",
        "replicas_per_node": "replicas_per_node",
        "tokens_per_replica": "tokens_per_replica",
        "tp": "tensor_parallel",
        "pp": "pipeline_parallel",
        "sequence_parallel": "sequence_parallel",
        "idle": "idle",
        "sync_waves": "sync_waves",
    }
)
# flags that only derive --tokens-per-replica, which a saved cluster already fixes
_DERIVING = ("zero", "recompute", "devices_per_node", "memory_reserve")


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
    defaults = {d: p.get_default(d) for d in CONTEXT_FLAGS}
    p.set_defaults(func=run, flag_defaults=defaults, **dict.fromkeys(CONTEXT_FLAGS))


def describe_cluster(cluster: Cluster) -> str:
    """ "8 replicas (8 per node), 4,096 tokens each" plus the layout when it is not the default."""
    cap = (
        f"{cluster.tokens_per_replica:,} tokens each"
        if cluster.tokens_per_replica is not None
        else f"{cluster.memory_bytes:.3g} bytes each"
    )
    extra = [
        f"TP {cluster.tensor_parallel}" if cluster.tensor_parallel > 1 else "",
        f"PP {cluster.pipeline_parallel}" if cluster.pipeline_parallel > 1 else "",
        "sequence parallel" if cluster.sequence_parallel else "",
        f"idle={cluster.idle}" if cluster.idle != "placeholder" else "",
        "sync waves" if cluster.sync_waves else "",
        "mixed speeds" if cluster.speed is not None else "",
    ]
    more = ", ".join(e for e in extra if e)
    return f"{cluster.num_replicas} replicas ({cluster.replicas_per_node} per node), {cap}" + (
        f", {more}" if more else ""
    )


def _flag(dest: str, value: Any) -> str:
    name = "--" + dest.replace("_", "-")
    return name if isinstance(value, bool) else f"{name} {value}"


def _contradictions(
    given: dict[str, Any], args: argparse.Namespace, cost: CostModel, cluster: Cluster, batch: Any
) -> list[str]:
    """The given flags that disagree with the saved cost model and cluster, each with why."""
    out: list[str] = []
    for dest, value in given.items():
        field = _CLUSTER_FIELDS.get(dest)
        if field is not None:
            saved = getattr(cluster, field)
            if value != saved:
                out.append(f"{_flag(dest, value)} (saved: {saved})")
        elif dest in _DERIVING:
            out.append(
                f"{_flag(dest, value)} (it derives --tokens-per-replica, which the saved "
                f"cluster fixes at {cluster.tokens_per_replica})"
            )
        elif dest == "full_attention" and bool(np.any(batch.causal)):
            out.append("--full-attention (the saved plan's sequences are causal)")
    if given.keys() & {"cost", "model", "hardware", "head_parallel"}:
        mine = cost_from_args(args)
        if mine != cost:
            flags = " ".join(
                _flag(d, given[d])
                for d in ("cost", "model", "hardware", "head_parallel")
                if d in given
            )
            out.append(f"{flags} (cost model {mine.name!r}; saved: {cost.name!r})")
    return out


def run(args: argparse.Namespace) -> int:
    from fcp_data.viewer import summarize, view

    given = {d: getattr(args, d) for d in CONTEXT_FLAGS if getattr(args, d) is not None}
    for dest, value in args.flag_defaults.items():
        if getattr(args, dest) is None:
            setattr(args, dest, value)
    batch = batch_from_args(args)
    if batch.saved is not None and batch.saved_cost is not None:
        cost, cluster = batch.saved_cost, batch.saved_cluster
        assert cluster is not None
        clash = _contradictions(given, args, cost, cluster, batch)
        if clash:
            raise ConfigError(
                f"--plan {args.plan} was made with the cost model {cost.name!r} on "
                f"{describe_cluster(cluster)}, and is drawn with them; {'; '.join(clash)} "
                "contradict that: leave those flags out to view the plan as it was made, or "
                "make a new plan with them (`fcp plan ... -o FILE`)"
            )
        print(
            f"{args.plan}: drawn and priced with the cost model and cluster it was made with: "
            f"{cost.name}; {describe_cluster(cluster)}",
            flush=True,
        )
    else:
        if batch.saved is not None and "replicas" not in given:
            args.replicas = batch.saved.num_replicas  # the saved plan decides the cluster size
        if args.full_attention:
            batch = dataclasses.replace(batch, causal=np.zeros(batch.seqlens.size, bool))
        cluster, cost = cluster_from_args(args), cost_from_args(args)
        if batch.saved is not None:
            print(
                f"note: {args.plan} records no cost model or cluster (a bare Plan JSON, or one "
                f"saved by an older fcp), so its times are those of {cost.name} on "
                f"{describe_cluster(cluster)}, from the flags"
                f"{'' if given else ' (their defaults)'}, not necessarily what it was made "
                "with; `fcp plan -o FILE` saves both with the plan",
                flush=True,
            )
    path, results = view(batch, cluster, cost, args.output, args.strategies, force=args.force)
    summarize(results, batch, path)
    for res in results:  # fcp's plan (or the saved one) in one degree: the cost model's why
        if res.plan is not None and (res.strategy == "fcp" or res.strategy.startswith("saved")):
            why = why_one_degree(res.plan, cluster, cost)
            if why is not None:
                print(f"{res.strategy}: one degree for every group: {why}", flush=True)
    return 0
