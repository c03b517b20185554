"""Vision-aware planning: what counting the encoder and decode buys, predicted under presets.

For each cell of planner_quality's video grid (msrvtt / internvid / openvid × N ∈ {16, 32, 64}
× tokens per replica ∈ {8K, 16K, 32K} × H200 / Ascend 910C × Qwen3-VL-8B / -2B, global batch
512), video metadata are drawn from the distribution's published shape (clip seconds, the share
of 360p and 720p sources; 30 fps sources; 16-127 caption tokens), turned into length-index
columns, and the model's vision-token rule gives each sample its tokens and its units
(tubelets). Then, side by side under the same cost model with the encoder preset:

- blind: `plan_global_batch` without vision work (today's plan), scored with vision cost by
  the simulator (`score_plan(..., vision=...)`), edge duplicates included;
- aware: `plan_global_batch(..., vision=work)`;
- the baselines planned with vision work: static (Megatron-LM), static-balanced, pow2,
  megatron-core's hybrid CP.

ratio = blind / aware (> 1: counting vision helps). Everything is predicted, not measured.

    python bench/vision_planning.py [--seeds 1] [--no-megatron] [--quick] [-o out.json]
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

from fcp_data.planner import Cluster, CostModel, VisionWork, plan_global_batch, score_plan
from fcp_data.vision import get_rule, vision_work_from_media

VIDEO = ("msrvtt", "internvid", "openvid")
DEVICES = (("h200", 8), ("ascend-910c", 16))
MODELS = {"large": "qwen3-vl-8b", "small": "qwen3-vl-2b"}
RULE_OF = {"qwen3-vl-8b": "qwen3-vl", "qwen3-vl-2b": "qwen3-vl"}
SOURCE_FPS = 30.0
SIZES = {360: (640, 360), 720: (1280, 720)}
TARGET = {"profile": "internvid", "n": 64, "cap": 16384, "device": "ascend-910c"}
TARGET_MODEL = "qwen3-vl-2b"


def _seconds(profile: str, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Clip seconds and the share of 720p sources (generators.py's shapes for these sets)."""
    if profile == "msrvtt":
        return np.clip(rng.lognormal(np.log(14), 0.33, n), 5, 35), rng.random(n) < 0.5
    if profile == "internvid":
        short = np.clip(rng.lognormal(np.log(4.5), 0.5, n), 1, 10)
        long = 10 + rng.lognormal(3.23, 1.0, n)
        return np.where(rng.random(n) < 0.85, short, long), rng.random(n) < 0.85
    if profile == "openvid":
        return rng.lognormal(np.log(6), 0.6, n), np.ones(n, bool)
    raise ValueError(f"no video metadata shape for {profile!r}; choose from {VIDEO}")


def draw_batch(profile: str, rule_name: str, n: int, seed: int) -> tuple[np.ndarray, VisionWork]:
    """Lengths and vision work of `n` video samples, through the rule as the index builds them."""
    rng = np.random.default_rng(seed)
    sec, hd = _seconds(profile, rng, n)
    caption = rng.integers(16, 128, n)
    num_frames = np.maximum(2, np.round(sec * SOURCE_FPS)).astype(np.int64)
    width = np.where(hd, SIZES[720][0], SIZES[360][0])
    height = np.where(hd, SIZES[720][1], SIZES[360][1])
    rule = get_rule(rule_name)
    fps = np.full(n, SOURCE_FPS)
    tokens = np.array(
        [
            rule.video(num_frames=int(f), fps=SOURCE_FPS, height=int(h), width=int(w)).total
            for f, w, h in zip(num_frames, width, height)
        ]
    )
    work = vision_work_from_media(
        modality=np.ones(n, np.int8),
        num_frames=num_frames,
        fps=fps,
        width=width,
        height=height,
        rule=rule,
    )
    return tokens + caption, work


def run_cell(
    lens: np.ndarray, work: VisionWork, cluster: Cluster, cost: CostModel, strategies: list[str]
) -> dict:
    row: dict = {}
    t0 = time.perf_counter()
    blind = plan_global_batch(lens, cluster, cost, on_too_long="drop")
    row["blind_ms"] = (time.perf_counter() - t0) * 1e3
    row["blind_text_only"] = blind.predicted_time
    row["blind"] = score_plan(blind, lens, cluster, cost, vision=work).makespan
    for strategy in strategies:
        t0 = time.perf_counter()
        try:
            plan = plan_global_batch(
                lens, cluster, cost, vision=work, strategy=strategy, on_too_long="drop"
            )
        except ValueError as exc:
            row[strategy] = None
            row[f"{strategy}_error"] = str(exc).split("\n")[0][:120]
            continue
        row[f"{strategy}_ms"] = (time.perf_counter() - t0) * 1e3
        row[strategy] = plan.predicted_time
        if strategy == "fcp":
            simulated = score_plan(plan, lens, cluster, cost, vision=work)
            row["aware"] = plan.predicted_time
            row["aware_simulated"] = simulated.makespan
            row["lower_bound"] = simulated.lower_bound
            row["winner"] = plan.winner.split("(")[0]
            row["dropped"] = len(plan.dropped)
    return row


def run_grid(args: argparse.Namespace) -> list[dict]:
    rows = []
    profiles = ("internvid",) if args.quick else VIDEO
    sizes = (16,) if args.quick else (16, 32, 64)
    caps = (16384,) if args.quick else (8192, 16384, 32768)
    devices = DEVICES[:1] if args.quick else DEVICES
    batch = 64 if args.quick else 512
    strategies = ["fcp", "static-balanced", "static", "pow2"]
    if not (args.no_megatron or args.quick):  # quick: no megatron-core (a 4 s import)
        strategies.append("megatron-hybrid")
    for profile, n, cap, (device, rpn), size, seed in itertools.product(
        profiles, sizes, caps, devices, ("large", "small"), range(args.seeds)
    ):
        model = MODELS[size]
        cost = CostModel.from_model(model, device)
        cluster = Cluster(n, replicas_per_node=rpn, tokens_per_replica=cap)
        lens, work = draw_batch(profile, RULE_OF[model], batch, seed)
        row = {"profile": profile, "n": n, "cap": cap, "device": device, "model": model}
        row |= {"seed": seed, **run_cell(lens, work, cluster, cost, strategies)}
        row["ratio"] = row["blind"] / row["aware"]
        rows.append(row)
    return rows


def summarise(rows: list[dict], console: Console) -> dict:
    table = Table(title=f"vision-aware vs vision-blind plans, {len(rows)} cells (predicted)")
    columns = ("profile", "model", "cells", "blind/aware mean", "min", "max", "vs static-bal")
    columns += ("vs static", "vs pow2", "vs mcore-hybrid", "aware ms p50", "blind ms p50")
    for c in columns:
        table.add_column(c, justify="right")
    for profile, model in dict.fromkeys((r["profile"], r["model"]) for r in rows):
        sel = [r for r in rows if r["profile"] == profile and r["model"] == model]
        ratio = np.array([r["ratio"] for r in sel])

        def vs(key: str, sel: list[dict] = sel) -> str:
            v = [r[key] / r["aware"] for r in sel if r.get(key)]
            return f"{np.mean(v):.3f}" if v else "-"

        table.add_row(
            profile,
            model,
            str(len(sel)),
            f"{ratio.mean():.3f}",
            f"{ratio.min():.3f}",
            f"{ratio.max():.3f}",
            vs("static-balanced"),
            vs("static"),
            vs("pow2"),
            vs("megatron-hybrid"),
            f"{np.median([r['fcp_ms'] for r in sel]):.0f}",
            f"{np.median([r['blind_ms'] for r in sel]):.0f}",
        )
    console.print(table)
    ratio = np.array([r["ratio"] for r in rows])
    target = [r for r in rows if all(r[k] == v for k, v in TARGET.items())]
    target = [r for r in target if r["model"] == TARGET_MODEL]
    summary = {
        "cells": len(rows),
        "blind_over_aware_mean": float(ratio.mean()),
        "blind_over_aware_min": float(ratio.min()),
        "blind_over_aware_max": float(ratio.max()),
        "aware_never_worse": bool(np.all(ratio >= 1 - 1e-12)),
        "simulator_agrees": bool(
            all(abs(r["aware_simulated"] - r["aware"]) <= 1e-9 * r["aware"] for r in rows)
        ),
        "target": {
            **TARGET,
            "model": TARGET_MODEL,
            "blind_over_aware": [r["ratio"] for r in target],
            "blind_s": [r["blind"] for r in target],
            "aware_s": [r["aware"] for r in target],
        },
        "winners": {w: sum(r["winner"] == w for r in rows) for w in {r["winner"] for r in rows}},
    }
    console.print(summary)
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = make_parser(__doc__)
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--no-megatron", action="store_true", help="skip megatron-core's scheduler")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore", category=UserWarning)
    rows = run_grid(args)
    summary = summarise(rows, console())
    payload = {"summary": summary, "rows": rows}
    write_json(out_path(args, "vision_planning"), payload, quick=args.quick)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
