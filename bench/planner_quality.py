"""Planner quality over a grid of data, cluster sizes and devices; one cost model scores all.

Grid: 8 length profiles (GitHub, C4, Wikipedia, the extreme batch, ByteScale's longmix,
MSR-VTT, InternVid, OpenVid) × N ∈ {16, 32, 64, 128} × tokens per replica ∈ {8K, 16K, 32K} ×
devices (H200, 8 per node; Ascend 910C, 16 per node) × a large and a small model (Qwen3-8B /
Qwen3-1.7B for text, Qwen3-VL-8B / -2B for video), global batch 512: 384 cells. For each cell:
fcp's predicted makespan over the lower bound (the combined bound of `bounds.lower_bound`, and
the simple one max(W/N, longest alone) for reference), and ratios against static-balanced,
static (Megatron-LM), pow2, megatron-core's hybrid CP and Megatron-LM dev's dynamic CP (at its
default knob and tuned per batch). Then tiny batches against the exhaustive optimum.

    python bench/planner_quality.py [--seeds 1] [--no-megatron] [--quick] [-o out.json]
"""

from __future__ import annotations

import argparse
import itertools
import time
import warnings

import numpy as np
from _common import console, make_parser, out_path, write_json
from rich.console import Console
from rich.table import Table

from fcp_data.planner import Cluster, CostModel, generate_lengths, plan_global_batch
from fcp_data.planner.cost.problem import Problem
from fcp_data.planner.oracle import exhaustive_optimum

TEXT = ("github", "c4", "wikipedia", "extreme", "longmix")
VIDEO = ("msrvtt", "internvid", "openvid")
DEVICES = (("h200", 8), ("ascend-910c", 16))


def simple_bound(lens: np.ndarray, cluster: Cluster, cost: CostModel) -> float:
    """The lower bound: max(total work / N, the most expensive sequence's best time)."""
    prob = Problem.build(lens, cluster, cost)
    top = int(np.argmax(prob.work))
    best = min(
        cost.time_from_aggregates(
            prob.att[top],
            prob.lin[top],
            prob.comm[top],
            d,
            inter_node=d > cluster.replicas_per_node,
        )
        for d in range(max(1, int(prob.dmin[top])), cluster.num_replicas + 1)
    )
    return max(float(prob.work.sum()) / cluster.num_replicas, best)


def run_grid(args: argparse.Namespace) -> list[dict]:
    rows = []
    profiles = ("github", "internvid") if args.quick else TEXT + VIDEO
    sizes = (16,) if args.quick else (16, 32, 64, 128)
    caps = (8192,) if args.quick else (8192, 16384, 32768)
    devices = DEVICES[:1] if args.quick else DEVICES
    strategies = [
        "fcp",
        "static-balanced",
        "static",
        "pow2",
        "megatron-dynamic",
        "megatron-dynamic-tuned",
    ]
    if not (args.no_megatron or args.quick):  # quick: no megatron-core (a 4 s import)
        strategies.append("megatron-hybrid")
    for profile, n, cap, (device, rpn), size, seed in itertools.product(
        profiles, sizes, caps, devices, ("large", "small"), range(args.seeds)
    ):
        video = profile in VIDEO
        model = {
            ("large", False): "qwen3-8b",
            ("small", False): "qwen3-1.7b",
            ("large", True): "qwen3-vl-8b",
            ("small", True): "qwen3-vl-2b",
        }[(size, video)]
        cost = CostModel.from_model(model, device)
        cluster = Cluster(n, replicas_per_node=rpn, tokens_per_replica=cap)
        lens = generate_lengths(profile, 512, seed=seed)
        row = {
            "profile": profile,
            "n": n,
            "cap": cap,
            "device": device,
            "model": model,
            "seed": seed,
            "dropped": 0,
        }
        for strategy in strategies:
            t0 = time.perf_counter()
            try:
                plan = plan_global_batch(lens, cluster, cost, strategy=strategy, on_too_long="drop")
            except (ValueError, AssertionError) as exc:
                row[strategy] = None
                row[f"{strategy}_error"] = str(exc).split("\n")[0][:120]
                continue
            row[strategy] = plan.predicted_time
            row[f"{strategy}_ms"] = (time.perf_counter() - t0) * 1e3
            if strategy == "megatron-dynamic-tuned":
                row["tuned_knob"] = plan.winner
            if strategy == "fcp":
                row["lower_bound"] = plan.lower_bound
                row["winner"] = plan.winner.split("(")[0]
                row["dropped"] = len(plan.dropped)
                row["degrees"] = sorted(set(plan.degrees), reverse=True)
        keep = np.ones(lens.size, bool)
        if row["dropped"]:
            prob = Problem.build(lens, cluster, cost)
            keep = prob.dmin > 0
        row["simple_bound"] = simple_bound(lens[keep], cluster, cost)
        rows.append(row)
    return rows


def summarise(rows: list[dict], console: Console) -> dict:
    def ratios(key: str, other: str) -> np.ndarray:
        out = [r[other] / r[key] for r in rows if r.get(other) and r.get(key)]
        return np.array(out) if out else np.array([np.nan])

    def geomean(key: str, other: str) -> float:
        return float(np.exp(np.nanmean(np.log(ratios(key, other)))))

    lb = np.array([r["fcp"] / r["lower_bound"] for r in rows])
    slb = np.array([r["fcp"] / r["simple_bound"] for r in rows])
    table = Table(
        title=f"planner quality, {len(rows)} cells (predicted makespans, same cost model)"
    )
    for c in (
        "profile",
        "cells",
        "fcp/LB mean",
        "fcp/LB worst",
        "fcp/simpleLB mean",
        "vs static-bal min",
        "vs static mean",
        "vs pow2 min",
        "vs mcore-hybrid mean",
        "vs mdyn geo",
        "vs mdyn-tuned geo",
        "vs mdyn-tuned min",
        "fcp ms p50",
    ):
        table.add_column(c, justify="right")
    for profile in dict.fromkeys(r["profile"] for r in rows):
        sel = [r for r in rows if r["profile"] == profile]
        sub_lb = np.array([r["fcp"] / r["lower_bound"] for r in sel])
        sub_s = np.array([r["fcp"] / r["simple_bound"] for r in sel])

        def rat(other: str, sel: list[dict] = sel) -> np.ndarray:
            v = [r[other] / r["fcp"] for r in sel if r.get(other)]
            return np.array(v) if v else np.array([np.nan])

        def geo(other: str) -> float:
            return float(np.exp(np.nanmean(np.log(rat(other)))))

        table.add_row(
            profile,
            str(len(sel)),
            f"{sub_lb.mean():.3f}",
            f"{sub_lb.max():.3f}",
            f"{sub_s.mean():.3f}",
            f"{rat('static-balanced').min():.3f}",
            f"{rat('static').mean():.2f}x",
            f"{rat('pow2').min():.3f}",
            f"{np.nanmean(rat('megatron-hybrid')):.2f}x",
            f"{geo('megatron-dynamic'):.2f}x",
            f"{geo('megatron-dynamic-tuned'):.3f}x",
            f"{rat('megatron-dynamic-tuned').min():.3f}",
            f"{np.median([r['fcp_ms'] for r in sel]):.1f}",
        )
    console.print(table)
    summary = {
        "cells": len(rows),
        "fcp_over_lb_mean": float(lb.mean()),
        "fcp_over_lb_worst": float(lb.max()),
        "fcp_over_simple_lb_mean": float(slb.mean()),
        "fcp_over_simple_lb_worst": float(slb.max()),
        "vs_static_balanced_min": float(ratios("fcp", "static-balanced").min()),
        "vs_static_mean": float(np.nanmean(ratios("fcp", "static"))),
        "vs_static_min": float(np.nanmin(ratios("fcp", "static"))),
        "vs_static_max": float(np.nanmax(ratios("fcp", "static"))),
        "vs_pow2_mean": float(np.nanmean(ratios("fcp", "pow2"))),
        "vs_pow2_min": float(np.nanmin(ratios("fcp", "pow2"))),
        "vs_megatron_hybrid_mean": float(np.nanmean(ratios("fcp", "megatron-hybrid"))),
        "megatron_hybrid_failures": sum(1 for r in rows if r.get("megatron-hybrid_error")),
        "vs_megatron_dynamic_geomean": geomean("fcp", "megatron-dynamic"),
        "vs_megatron_dynamic_min": float(np.nanmin(ratios("fcp", "megatron-dynamic"))),
        "vs_megatron_dynamic_tuned_geomean": geomean("fcp", "megatron-dynamic-tuned"),
        "vs_megatron_dynamic_tuned_min": float(np.nanmin(ratios("fcp", "megatron-dynamic-tuned"))),
        "vs_megatron_dynamic_tuned_max": float(np.nanmax(ratios("fcp", "megatron-dynamic-tuned"))),
        "vs_pow2_geomean": geomean("fcp", "pow2"),
        "cells_over_1_08": sorted(
            (
                {k: r[k] for k in ("profile", "n", "cap", "device", "model", "seed", "winner")}
                | {"ratio": r["fcp"] / r["lower_bound"]}
                for r in rows
                if r["fcp"] / r["lower_bound"] > 1.08
            ),
            key=lambda c: -c["ratio"],
        ),
        "fcp_ms_p50_by_n": {
            int(n): float(np.median([r["fcp_ms"] for r in rows if r["n"] == n]))
            for n in sorted({r["n"] for r in rows})
        },
        "winners": {w: sum(r["winner"] == w for r in rows) for w in {r["winner"] for r in rows}},
    }
    console.print(summary)
    return summary


def tiny_oracle(console: Console, trials: int) -> dict:
    rng = np.random.default_rng(0)
    cost = CostModel.from_model("qwen3-8b", "h200")
    ratios = []
    for _ in range(trials):
        k, n = int(rng.integers(2, 5)), int(rng.integers(2, 5))
        cluster = Cluster(n, replicas_per_node=int(rng.integers(1, n + 1)), tokens_per_replica=4096)
        lens = np.minimum(rng.lognormal(7.5, 1.0, k).astype(int) + 1, 4096 * n)
        opt = exhaustive_optimum(lens, cluster, cost)
        ratios.append(plan_global_batch(lens, cluster, cost).predicted_time / opt)
    r = np.array(ratios)
    out = {
        "trials": trials,
        "mean": float(r.mean()),
        "worst": float(r.max()),
        "optimal_share": float(np.mean(r < 1 + 1e-9)),
    }
    console.print("fcp vs exhaustive optimum on tiny batches:", out)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = make_parser(__doc__)
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--no-megatron", action="store_true", help="skip megatron-core's scheduler")
    ap.add_argument("--oracle-trials", type=int, default=60)
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore", category=UserWarning)
    con = console()
    rows = run_grid(args)
    summary = summarise(rows, con)
    oracle = tiny_oracle(con, 3 if args.quick else args.oracle_trials)
    payload = {"summary": summary, "oracle": oracle, "rows": rows}
    write_json(out_path(args, "planner_quality"), payload, quick=args.quick)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
