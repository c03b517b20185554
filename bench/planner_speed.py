"""Planning time (warm, median, all candidates included), the shape of the paper's Tables 1-2,
noise robustness like Tables 4-5 and the degree mix like Table 6.

    python bench/planner_speed.py [--repeat 15] [--quick] [-o out.json]

Timings are wall-clock medians after one warm-up call (numba kernels compiled and cached), on
whatever this machine is doing: compare rows of one run, not runs of different days.
"""

from __future__ import annotations

import time
import warnings
from collections import Counter
from collections.abc import Callable

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
from fcp_data.planner.bounds import lower_bound
from fcp_data.planner.cost.problem import Problem


def timed(fn: Callable[[], object], repeat: int) -> tuple[float, object]:
    out = fn()
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        samples.append(time.perf_counter() - t0)
    return float(np.median(samples)) * 1e3, out


def speed_table(console: Console, repeat: int, quick: bool) -> list[dict]:
    cost = CostModel.from_model("qwen3-8b", "h200")
    rows = []
    cases = [
        ("github", 512, 64, 16384),
        ("extreme", 512, 64, 16384),
        ("internvid", 512, 64, 16384),
        ("github", 128, 64, 16384),
        ("github", 256, 64, 16384),
        ("github", 512, 16, 16384),
        ("github", 512, 32, 16384),
        ("github", 8192, 1024, 16384),
        ("internvid", 8192, 1024, 16384),
    ]
    if quick:
        cases = [("github", 128, 16, 16384)]
    table = Table(title="planning time, warm median (ms), all fcp candidates")
    for c in (
        "profile",
        "sequences",
        "replicas",
        "fcp ms",
        "static-balanced ms",
        "megatron-dynamic ms",
        "mdyn-tuned ms",
        "megatron-hybrid ms",
        "winner",
    ):
        table.add_column(c, justify="right")
    for profile, k, n, cap in cases:
        lens = generate_lengths(profile, k, seed=0)
        cl = Cluster(n, replicas_per_node=8, tokens_per_replica=cap)
        rep = repeat if k <= 512 else max(3, repeat // 5)
        ms, plan = timed(
            lambda lens=lens, cl=cl: plan_global_batch(lens, cl, cost, on_too_long="drop"), rep
        )
        sb, _ = timed(
            lambda lens=lens, cl=cl: plan_global_batch(
                lens, cl, cost, strategy="static-balanced", on_too_long="drop"
            ),
            rep,
        )
        md, _ = timed(
            lambda lens=lens, cl=cl: plan_global_batch(
                lens, cl, cost, strategy="megatron-dynamic", on_too_long="drop"
            ),
            rep,
        )
        mdt, _ = timed(
            lambda lens=lens, cl=cl: plan_global_batch(
                lens, cl, cost, strategy="megatron-dynamic-tuned", on_too_long="drop"
            ),
            rep,
        )
        mh = float("nan")
        if k <= 512 and not quick:  # quick: no megatron-core (a 4 s import)
            mh, _ = timed(
                lambda lens=lens, cl=cl: plan_global_batch(
                    lens, cl, cost, strategy="megatron-hybrid", on_too_long="drop"
                ),
                3,
            )
        rows.append(
            {
                "profile": profile,
                "sequences": k,
                "replicas": n,
                "fcp_ms": ms,
                "static_balanced_ms": sb,
                "megatron_dynamic_ms": md,
                "megatron_dynamic_tuned_ms": mdt,
                "megatron_hybrid_ms": mh,
                "winner": plan.winner,
            }
        )
        table.add_row(
            profile,
            str(k),
            str(n),
            f"{ms:.2f}",
            f"{sb:.2f}",
            f"{md:.2f}",
            f"{mdt:.2f}",
            f"{mh:.1f}",
            plan.winner,
        )
    console.print(table)
    return rows


def breakdown(console: Console, repeat: int) -> dict:
    """Time of each candidate family on 512 sequences / 64 replicas (github)."""
    from fcp_data.planner import api
    from fcp_data.planner.strategies import families

    cost = CostModel.from_model("qwen3-8b", "h200")
    lens = generate_lengths("github", 512, seed=0)
    cl = Cluster(64, replicas_per_node=8, tokens_per_replica=16384)
    out = {}
    prob_ms, prob = timed(lambda: Problem.build(lens, cl, cost), repeat)
    out["problem"] = prob_ms
    lb_ms, lb = timed(lambda: lower_bound(prob), repeat)
    out["lower_bound"] = lb_ms
    units = prob.order
    keep = np.ones(units.size, dtype=bool)
    best = min(c.makespan for c in families.core_family(prob, lb, units) if c is not None)
    parts = {
        "paper": lambda: families.paper_schedule(prob, units),
        "lanes": lambda: families.lane_candidates(prob, lb, units),
        "prologue+lanes": lambda: families.prologue_lanes(prob, lb, units),
        "moldable": lambda: families.moldable_schedule(prob, units),
        "static-balanced": lambda: families.static_balanced(prob, units),
        "static": lambda: families.static_megatron(prob, units),
        "core family (fcp's own candidates)": lambda: families.core_family(prob, lb, units),
        "pow2 candidates": lambda: api._pow2_candidates(prob, None, keep, 0),
        "megatron-dynamic grid (unpruned)": lambda: families.megatron_dynamic_tuned(prob, units),
        "megatron-dynamic grid (pruned)": lambda: families.megatron_dynamic_tuned(
            prob, units, prune_above=best
        ),
    }
    for name, fn in parts.items():
        out[name], _ = timed(fn, repeat)
    console.print(
        "candidate breakdown (ms, github 512 on 64):", {k: round(v, 2) for k, v in out.items()}
    )
    return out


def noise(console: Console, seeds: int, quick: bool) -> list[dict]:
    """Plan with perturbed coefficients, score with the true ones (paper Tables 4-5)."""
    cost = CostModel.from_model("qwen3-vl-2b", "ascend-910c")
    rows = []
    table = Table(
        title="cost-model noise: plans made with perturbed coefficients, scored with true ones"
    )
    for c in ("replicas", "noise", "time/step vs exact", "degree match"):
        table.add_column(c, justify="right")
    for n in (32,) if quick else (32, 64):
        cl = Cluster(n, replicas_per_node=16, tokens_per_replica=16384)
        lens = generate_lengths("internvid", 64 if quick else 512, seed=1)
        exact = plan_global_batch(lens, cl, cost)
        base_deg = _degree_of(exact, lens.size)
        for level in (0.0, 0.1) if quick else (0.0, 0.05, 0.1, 0.2, 0.3, 0.5):
            extra, match = [], []
            for s in range(seeds):
                noisy_cost = cost.perturbed(np.random.default_rng(100 + s), level)
                plan = plan_global_batch(lens, cl, noisy_cost)
                extra.append(score_plan(plan, lens, cl, cost).makespan / exact.predicted_time - 1)
                match.append(float(np.mean(_degree_of(plan, lens.size) == base_deg)))
            rows.append(
                {
                    "replicas": n,
                    "noise": level,
                    "extra_time": float(np.mean(extra)),
                    "degree_match": float(np.mean(match)),
                }
            )
            table.add_row(str(n), f"{level:.0%}", f"{np.mean(extra):+.2%}", f"{np.mean(match):.1%}")
    console.print(table)
    return rows


def _degree_of(plan: Plan, k: int) -> np.ndarray:
    deg = np.zeros(k, np.int64)
    for g in plan.groups:
        deg[list(g.sequence_ids)] = g.degree
    return deg


def degree_mix(console: Console, quick: bool) -> dict:
    """Table 6: the degrees each strategy uses on video batches."""
    out = {}
    for profile, n in (("openvid", 32),) if quick else (("openvid", 32), ("msrvtt", 32)):
        cost = CostModel.from_model("qwen3-vl-8b", "ascend-910c")
        cl = Cluster(n, replicas_per_node=16, tokens_per_replica=8192)
        lens = generate_lengths(profile, 512, seed=0)
        row = {}
        for strategy in ("static", "pow2", "fcp"):
            plan = plan_global_batch(lens, cl, cost, strategy=strategy)
            mix = Counter(g.degree for g in plan.waves[0].groups)
            row[strategy] = {
                "first_wave": dict(sorted(mix.items(), reverse=True)),
                "makespan": plan.predicted_time,
            }
        out[profile] = row
        console.print(
            f"{profile} on {n}: "
            + "; ".join(
                f"{s}: "
                + ", ".join(f"⟨{d}⟩×{c}" for d, c in r["first_wave"].items())
                + f" ({r['makespan']:.2f} s)"
                for s, r in row.items()
            )
        )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = make_parser(__doc__)
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--noise-seeds", type=int, default=5)
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore", category=UserWarning)
    con = console()
    repeat, seeds = (1, 1) if args.quick else (args.repeat, args.noise_seeds)
    result = {
        "speed": speed_table(con, repeat, args.quick),
        "breakdown": breakdown(con, repeat),
        "noise": noise(con, seeds, args.quick),
        "degree_mix": degree_mix(con, args.quick),
    }
    write_json(out_path(args, "planner_speed"), result, quick=args.quick)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
