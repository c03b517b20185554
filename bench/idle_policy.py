"""What idle replicas cost, and what the idle policies buy back (Cluster.idle, sync_waves).

A replica with no CP group in a wave still runs a placeholder micro-batch there when the
framework needs every rank in every micro-batch (FSDP, megatron DDP with overlapped reduction,
pipeline parallel): 2 x pad-unit tokens at degree 1, about beta1 (1.79 ms for Qwen3-8B on one
H200). Under FSDP / ZeRO-3 each layer's all-gather spans every rank, so waves also end together
(`sync_waves`). Over the quality grid's length profiles (global batch 512) x N in {16, 32, 64} x
{8K, 16K, 32K} tokens per replica, Qwen3-8B on H200 (8 per node), 3 seeds, this plans every
batch under each policy and reports, per (profile, N):

- idle: the share of (replica, wave) slots with no group, in the plan kept under "placeholder";
- today@ph / today: the plan made without idle pricing ("empty"), scored with the placeholders
  the loader emits: how optimistic the unpriced prediction was;
- ph / today: planning with placeholders priced (every candidate scored so) over "empty";
- fill / ph: the "fill" policy (idle slots given real work where no slower) over "placeholder";
- the same three with a barrier after every wave (sync), and sync / no sync under "placeholder";
- planning ms (median) under "placeholder" and "fill".

    python bench/idle_policy.py [-o out.json] [--seeds 3] [--quick]
"""

from __future__ import annotations

import itertools
import time

import numpy as np
from _common import console, make_parser, out_path, write_json
from rich.console import Console
from rich.table import Table

from fcp_data.planner import (
    Cluster,
    CostModel,
    Plan,
    generate_lengths,
    plan_global_batch,
    score_plan,
)

PROFILES = ("github", "c4", "wikipedia", "extreme", "msrvtt", "internvid", "openvid")
SIZES = (16, 32, 64)
CAPS = (8192, 16384, 32768)


def _plan(
    lens: np.ndarray, n: int, cap: int, cost: CostModel, idle: str, sync: bool
) -> tuple[Plan, Cluster, float]:
    cluster = Cluster(n, replicas_per_node=8, tokens_per_replica=cap, idle=idle, sync_waves=sync)
    t0 = time.perf_counter()
    plan = plan_global_batch(lens, cluster, cost, on_too_long="drop")
    ms = (time.perf_counter() - t0) * 1e3
    return plan, cluster, ms


def cell(profile: str, n: int, cap: int, seed: int, cost: CostModel) -> dict:
    lens = generate_lengths(profile, 512, seed=seed)
    row: dict = {"profile": profile, "n": n, "cap": cap, "seed": seed}
    for sync in (False, True):
        tag = "_sync" if sync else ""
        today, _, _ = _plan(lens, n, cap, cost, "empty", sync)
        held, cl_ph, ms_ph = _plan(lens, n, cap, cost, "placeholder", sync)
        filled, cl_fill, ms_fill = _plan(lens, n, cap, cost, "fill", sync)
        sc_today = score_plan(today, lens, cl_ph, cost)
        sc_held = score_plan(held, lens, cl_ph, cost)
        sc_fill = score_plan(filled, lens, cl_fill, cost)
        row |= {
            f"today{tag}": today.predicted_time,
            f"today_priced{tag}": sc_today.makespan,
            f"placeholder{tag}": held.predicted_time,
            f"fill{tag}": filled.predicted_time,
            f"idle{tag}": sc_held.idle_slots / (n * held.num_waves),
            f"idle_today{tag}": sc_today.idle_slots / (n * today.num_waves),
            f"idle_fill{tag}": sc_fill.idle_slots / (n * filled.num_waves),
            f"waves{tag}": held.num_waves,
            f"winner{tag}": held.winner,
            f"winner_fill{tag}": filled.winner,
            f"ms_placeholder{tag}": ms_ph,
            f"ms_fill{tag}": ms_fill,
            f"lower_bound{tag}": held.lower_bound,
        }
    return row


def _stat(rows: list[dict], num: str, den: str) -> tuple[float, float, float]:
    r = np.array([x[num] / x[den] for x in rows if x[den] > 0])
    return float(r.mean()), float(r.min()), float(r.max())


RATIOS = {
    "today@ph / today": ("today_priced", "today"),
    "ph / today": ("placeholder", "today"),
    "fill / ph": ("fill", "placeholder"),
    "sync: today@ph / today": ("today_priced_sync", "today_sync"),
    "sync: fill / ph": ("fill_sync", "placeholder_sync"),
    "sync / no sync (ph)": ("placeholder_sync", "placeholder"),
}


def summarise(rows: list[dict], console: Console) -> dict:
    table = Table(title=f"idle policies, {len(rows)} batches (predicted, Qwen3-8B on H200)")
    for c in ("profile", "N", "idle", "idle sync", *RATIOS, "ms ph", "ms fill"):
        table.add_column(c, justify="right")
    groups = {}
    for r in rows:
        groups.setdefault((r["profile"], r["n"]), []).append(r)
    for (profile, n), sel in groups.items():
        cells = []
        for num, den in RATIOS.values():
            mean, lo, hi = _stat(sel, num, den)
            cells.append(f"{mean:.4f} ({lo:.3f}-{hi:.3f})" if hi - lo > 5e-4 else f"{mean:.4f}")
        table.add_row(
            profile,
            str(n),
            f"{np.mean([r['idle'] for r in sel]):.0%}",
            f"{np.mean([r['idle_sync'] for r in sel]):.0%}",
            *cells,
            f"{np.median([r['ms_placeholder'] for r in sel]):.1f}",
            f"{np.median([r['ms_fill'] for r in sel]):.1f}",
        )
    console.print(table)
    summary: dict = {"batches": len(rows)}
    for name, (num, den) in RATIOS.items():
        mean, lo, hi = _stat(rows, num, den)
        summary[name] = {"mean": mean, "min": lo, "max": hi}
    summary["idle_mean"] = float(np.mean([r["idle"] for r in rows]))
    summary["idle_sync_mean"] = float(np.mean([r["idle_sync"] for r in rows]))
    summary["idle_fill_sync_mean"] = float(np.mean([r["idle_fill_sync"] for r in rows]))
    summary["fill_won"] = sum(r["winner_fill"].endswith("+fill") for r in rows)
    summary["fill_won_sync"] = sum(r["winner_fill_sync"].endswith("+fill") for r in rows)
    for key in ("ms_placeholder", "ms_fill", "ms_placeholder_sync", "ms_fill_sync"):
        summary[f"{key}_p50"] = float(np.median([r[key] for r in rows]))
        summary[f"{key}_max"] = float(np.max([r[key] for r in rows]))
    console.print(summary)
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = make_parser(__doc__)
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args(argv)
    con = console()
    cost = CostModel.from_model("qwen3-8b", "h200")
    profiles = ("github",) if args.quick else PROFILES
    sizes = (16,) if args.quick else SIZES
    caps = (16384,) if args.quick else CAPS
    seeds = 1 if args.quick else args.seeds
    plan_global_batch([1000, 2000], Cluster(2, tokens_per_replica=4096, idle="fill"), cost)  # jit
    t0 = time.perf_counter()
    rows = [
        cell(p, n, cap, seed, cost)
        for p, n, cap, seed in itertools.product(profiles, sizes, caps, range(seeds))
    ]
    summary = summarise(rows, con)
    con.print(f"{len(rows)} batches x 6 plans in {time.perf_counter() - t0:.0f} s")
    write_json(out_path(args, "idle_policy"), {"summary": summary, "rows": rows}, quick=args.quick)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
