"""fcp vs static CP vs megatron-core's hybrid CP when a replica is a TP x PP model copy.

Two clusters of 64 H200 (8 per node), each replica's tokens derived by the memory model
(`fcp_data.planner.cost.memory`) instead of guessed, and the analytic cost of a replica of TP x PP
devices (`CostModel.from_model(..., tensor_parallel=)`):

- llama3-70b: TP = 8 with sequence parallel, ZeRO-1 over 8 replicas (1 replica per node,
  every ring hop crosses nodes, sequences padded to 2d x 8);
- qwen3-8b: TP = 1, ZeRO-1 over 64 replicas (8 per node);
- llama3-70b as above without sequence parallel (2.6x fewer tokens per replica), for contrast:
  8 x 8,174 tokens cannot hold a 128K sequence, which every strategy then drops ("dropped",
  summed over seeds), so its times are of a smaller batch.

For each, the quality bench's text length distributions (global batch 512) and 3 seeds:
predicted step time of fcp, of static CP at its best degree (Megatron-LM's fixed CP, the best
degree dividing N under the same cost model) and of megatron-core's `BalancedCPScheduler`
(`megatron-hybrid`), all scored by the same simulator; ratios side by side.

    python bench/parallel_layouts.py [--seeds 3] [--batch 512] [--quick] [-o out.json]
"""

from __future__ import annotations

import argparse
import time
import warnings
from dataclasses import dataclass

import numpy as np
from _common import console, make_parser, out_path, write_json
from rich.console import Console
from rich.table import Table

from fcp_data.planner import (
    DEVICES,
    Cluster,
    CostModel,
    ParallelLayout,
    derive_tokens_per_replica,
    generate_lengths,
    plan_global_batch,
)

TEXT = ("github", "c4", "wikipedia", "extreme")
STRATEGIES = ("fcp", "static", "megatron-hybrid")
GPUS = 64
DEVICE = "h200"


@dataclass(frozen=True)
class Setup:
    name: str
    model: str
    layout: ParallelLayout


SETUPS = (
    Setup(
        name="llama3-70b TP8 SP",
        model="llama3-70b",
        layout=ParallelLayout(tensor_parallel=8, sequence_parallel=True, zero_stage=1),
    ),
    Setup(name="qwen3-8b TP1", model="qwen3-8b", layout=ParallelLayout(zero_stage=1)),
    # (a) without sequence parallel: the same cluster holds 8,174 tokens per replica, not 21,568
    Setup(
        name="llama3-70b TP8 no-SP",
        model="llama3-70b",
        layout=ParallelLayout(tensor_parallel=8, zero_stage=1),
    ),
)


def build(setup: Setup) -> tuple[Cluster, CostModel, dict]:
    dev = DEVICES[DEVICE]
    lay = setup.layout
    n = GPUS // lay.devices
    budget = derive_tokens_per_replica(setup.model, lay, dev.memory_bytes, n)
    cluster = Cluster.from_budget(budget, devices_per_node=dev.replicas_per_node)
    cost = CostModel.from_model(
        setup.model,
        DEVICE,
        tensor_parallel=lay.tensor_parallel,
        pipeline_parallel=lay.pipeline_parallel,
    )
    info = {
        "setup": setup.name,
        "replicas": n,
        "replicas_per_node": cluster.replicas_per_node,
        "pad_unit": cluster.pad_unit,
        "tokens_per_replica": budget.tokens_per_replica,
        "model_state_gb": budget.model_state_bytes / 1e9,
        "activation_mb_per_token": budget.activation_bytes_per_token / 1e6,
        "summary": budget.summary(),
    }
    return cluster, cost, info


def run(args: argparse.Namespace, console: Console) -> tuple[list[dict], list[dict]]:
    rows, setups = [], []
    for setup in SETUPS[:1] if args.quick else SETUPS:
        cluster, cost, info = build(setup)
        setups.append(info)
        console.print(info["summary"])
        for dist in TEXT[:1] if args.quick else TEXT:
            for seed in range(1 if args.quick else args.seeds):
                lens = generate_lengths(dist, args.batch, seed=seed)
                row = {"setup": setup.name, "distribution": dist, "seed": seed}
                # quick: no megatron-core (a 4 s import)
                for strategy in STRATEGIES[:2] if args.quick else STRATEGIES:
                    t0 = time.perf_counter()
                    try:
                        plan = plan_global_batch(
                            lens, cluster, cost, strategy=strategy, on_too_long="drop"
                        )
                    except Exception as exc:  # megatron's scheduler may fail on a batch
                        row[strategy] = None
                        row[f"{strategy}_error"] = f"{type(exc).__name__}: {exc}"[:160]
                        continue
                    row[strategy] = plan.predicted_time
                    row[f"{strategy}_ms"] = (time.perf_counter() - t0) * 1e3
                    if strategy == "fcp":
                        row["lower_bound"] = plan.lower_bound
                        row["dropped"] = len(plan.dropped)
                        row["degrees"] = sorted(set(plan.degrees), reverse=True)
                    if strategy == "static":
                        row["static_degree"] = plan.degrees[0] if plan.degrees else None
                rows.append(row)
    return rows, setups


def _mean_ratio(sel: list[dict], other: str) -> float:
    v = [r[other] / r["fcp"] for r in sel if r.get(other) and r.get("fcp")]
    return float(np.mean(v)) if v else float("nan")


def summarise(rows: list[dict], setups: list[dict], console: Console) -> list[dict]:
    table = Table(title="predicted step time (s), mean of seeds; ratios = other / fcp")
    for c in (
        "setup",
        "distribution",
        "tokens/replica",
        "dropped",
        "fcp",
        "fcp/LB",
        "static (d)",
        "static/fcp",
        "mcore-hybrid",
        "mcore/fcp",
    ):
        table.add_column(c, justify="right")
    out = []
    caps = {s["setup"]: s["tokens_per_replica"] for s in setups}
    for setup in dict.fromkeys(r["setup"] for r in rows):
        for dist in dict.fromkeys(r["distribution"] for r in rows):
            sel = [r for r in rows if r["setup"] == setup and r["distribution"] == dist]
            if not sel:
                continue

            def mean(key: str, sel: list[dict] = sel) -> float:
                v = [r[key] for r in sel if r.get(key) is not None]
                return float(np.mean(v)) if v else float("nan")

            degs = sorted({r.get("static_degree") for r in sel if r.get("static_degree")})
            fails = sum(1 for r in sel if r.get("megatron-hybrid") is None)
            item = {
                "setup": setup,
                "distribution": dist,
                "tokens_per_replica": caps[setup],
                "fcp": mean("fcp"),
                "fcp_over_lb": float(np.mean([r["fcp"] / r["lower_bound"] for r in sel])),
                "static": mean("static"),
                "static_degrees": degs,
                "static_over_fcp": _mean_ratio(sel, "static"),
                "megatron_hybrid": mean("megatron-hybrid"),
                "megatron_hybrid_over_fcp": _mean_ratio(sel, "megatron-hybrid"),
                "megatron_hybrid_failures": fails,
                "dropped": int(sum(r.get("dropped", 0) for r in sel)),
            }
            out.append(item)
            mc = (
                f"{item['megatron_hybrid']:.3f}"
                if np.isfinite(item["megatron_hybrid"])
                else "failed"
            )
            if fails and np.isfinite(item["megatron_hybrid"]):
                mc += f" ({fails} failed)"
            table.add_row(
                setup,
                dist,
                str(caps[setup]),
                str(item["dropped"]),
                f"{item['fcp']:.3f}",
                f"{item['fcp_over_lb']:.3f}",
                f"{item['static']:.3f} ({','.join(map(str, degs))})",
                f"{item['static_over_fcp']:.2f}x",
                mc,
                f"{item['megatron_hybrid_over_fcp']:.2f}x",
            )
        sel = [r for r in rows if r["setup"] == setup]
        table.add_row(
            setup,
            "[bold]all[/]",
            "",
            str(int(sum(r.get("dropped", 0) for r in sel))),
            "",
            f"{np.mean([r['fcp'] / r['lower_bound'] for r in sel]):.3f}",
            "",
            f"[bold]{_mean_ratio(sel, 'static'):.2f}x[/]",
            "",
            f"[bold]{_mean_ratio(sel, 'megatron-hybrid'):.2f}x[/]",
            end_section=True,
        )
        out.append(
            {
                "setup": setup,
                "distribution": "all",
                "fcp_over_lb": float(np.mean([r["fcp"] / r["lower_bound"] for r in sel])),
                "static_over_fcp": _mean_ratio(sel, "static"),
                "megatron_hybrid_over_fcp": _mean_ratio(sel, "megatron-hybrid"),
            }
        )
    console.print(table)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = make_parser(__doc__)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=512, help="sequences per global batch")
    args = ap.parse_args(argv)
    if args.quick:
        args.batch = 64
    warnings.filterwarnings("ignore", category=UserWarning)
    con = console()
    t0 = time.perf_counter()
    rows, setups = run(args, con)
    summary = summarise(rows, setups, con)
    payload = {"setups": setups, "summary": summary, "rows": rows}
    write_json(out_path(args, "parallel_layouts"), payload, quick=args.quick)
    con.print(f"{len(rows)} rows in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
