"""Plan viewer: FCP beside static CP and megatron-core's hybrid CP on one global batch.

    python examples/plan_viewer.py --distribution github --batch 512 -o out/plan.png
    python examples/plan_viewer.py --index out/demo/index --replicas 8 --tokens-per-replica 4096
    python examples/plan_viewer.py --shards 'shards/text-{000000..000003}.tar' --replicas 8
    python examples/plan_viewer.py --plan plan.json        # a plan saved by `fcp plan -o`

Lengths come from a length index (one global batch drawn by the loader's own sampler, so the
picture is the batch training would see), shards (scanned in memory), a saved plan (its
sequence lengths; the saved plan is drawn first) or a synthetic profile. Every strategy is
scored by the planner's simulator under one cost model, so the bars are comparable.

The picture: per strategy, replicas (rows) x predicted time; one bar per CP group spanning its
replicas, coloured by degree and labelled "⟨degree⟩ ×sequences" where it fits; the dashed line
is the lower bound (no plan can finish before it), titles carry makespan, ratio to the bound
and utilisation. The right panel counts CP groups per degree (the paper's Table 6 view): static
CP uses one degree for everything, FCP a spread that follows the length distribution.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fcp_data.commands._common import (
    add_problem_args,
    cluster_from_args,
    cost_from_args,
    lengths_from_args,
)
from fcp_data.planner import Cluster, CostModel, Plan, score_plan
from fcp_data.planner.compare import StrategyResult, compare_strategies

__all__ = [
    "VIEW_STRATEGIES",
    "Bar",
    "Batch",
    "draw",
    "load_batch",
    "main",
    "summarize",
    "timeline",
    "view",
]

VIEW_STRATEGIES = ("fcp", "static", "megatron-hybrid")


@dataclass(kw_only=True, slots=True, frozen=True)
class Batch:
    """One global batch to plan: lengths, attention kinds, where it came from, a saved plan."""

    seqlens: np.ndarray
    causal: np.ndarray
    label: str
    saved: Plan | None = None


@dataclass(kw_only=True, slots=True, frozen=True)
class Bar:
    """One CP group on the timeline (the simulator's start time and predicted duration)."""

    wave: int
    replicas: tuple[int, ...]
    degree: int
    num_sequences: int
    tokens: int
    start: float
    duration: float


def load_batch(args: argparse.Namespace) -> Batch:
    """The batch named by --plan, --index, --shards or --distribution (in that order)."""
    if args.plan is not None:
        plan = Plan.from_json(Path(args.plan).read_bytes())
        n = max(plan.sequence_ids(), default=-1) + 1
        lens, causal = np.zeros(n, np.int64), np.ones(n, bool)
        for g in plan.groups:
            lens[list(g.sequence_ids)] = g.seqlens
            causal[list(g.sequence_ids)] = g.causal
        if plan.dropped:
            raise ValueError(
                f"{args.plan}: the plan dropped sequences {list(plan.dropped)[:5]} whose lengths "
                "it does not record; re-plan with on_too_long='raise' to view it"
            )
        return Batch(seqlens=lens, causal=causal, label=f"plan {args.plan}", saved=plan)
    if args.index is not None or args.shards:
        from fcp_data.loader.sampler import GlobalBatchSampler

        if args.index is not None:
            from fcp_data.readers import LengthIndex

            src = LengthIndex.open(args.index)
            label = f"index {args.index}"
        else:
            from fcp_data.loader.source import open_source

            src = open_source(list(args.shards))
            label = f"{len(args.shards)} shard spec(s)"
        sampler = GlobalBatchSampler(
            num_samples=len(src.seqlens),
            global_batch_size=min(args.batch, len(src.seqlens)),
            seed=args.seed,
        )
        ids = np.sort(sampler.batch(0, args.batch_index))
        return Batch(
            seqlens=np.asarray(src.seqlens[ids], np.int64),
            causal=np.asarray(src.causal[ids]),
            label=f"{label}, global batch {args.batch_index}",
        )
    lens = lengths_from_args(args)
    label = f"lengths {args.lengths}" if args.lengths else f"synthetic {args.distribution}"
    return Batch(seqlens=lens, causal=np.ones(lens.size, bool), label=label)


def timeline(
    plan: Plan, seqlens: np.ndarray, cluster: Cluster, cost: CostModel, causal: np.ndarray
) -> tuple[list[Bar], list[float]]:
    """Bars and barrier times under the simulator's execution model (see planner.simulate):
    a group starts when all its members are free; a barrier wave synchronises everyone."""
    speed = cluster.speeds()
    free = np.zeros(cluster.num_replicas)
    bars: list[Bar] = []
    barriers: list[float] = []
    for w, wave in enumerate(plan.waves):
        for g in wave.groups:
            ids, reps = list(g.sequence_ids), list(g.replicas)
            t = cost.group_time(
                seqlens[ids], g.degree, causal=causal[ids],
                inter_node=cluster.spans_nodes(reps), speed=float(speed[reps].min()),
            )  # fmt: skip
            start = float(free[reps].max())
            free[reps] = start + t
            bars.append(Bar(wave=w, replicas=tuple(reps), degree=g.degree,
                            num_sequences=len(ids), tokens=g.num_tokens, start=start,
                            duration=t))  # fmt: skip
        if wave.barrier:
            free[:] = free.max()
            barriers.append(float(free.max()))
    return bars, barriers


def _runs(replicas: Sequence[int]) -> list[tuple[int, int]]:
    """Contiguous (first, count) runs of sorted replica indices: one rectangle each."""
    out: list[tuple[int, int]] = []
    for r in sorted(replicas):
        if out and out[-1][0] + out[-1][1] == r:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((r, 1))
    return out


def _gantt(ax: Any, res: StrategyResult, bars: list[Bar], barriers: list[float], n: int,
           xmax: float, color: Callable[[int], Any]) -> None:  # fmt: skip
    for b in bars:
        c = color(b.degree)
        for first, count in _runs(b.replicas):
            ax.add_patch(_rect((b.start, first - 0.5), b.duration, count, c))
        first, count = max(_runs(b.replicas), key=lambda fc: fc[1])
        # text needs ~7 pt of height and ~6% of the axis width (axes are ~170 pt tall)
        if b.duration >= 0.06 * xmax and count * 170 / n >= 7:
            txt = f"d={b.degree} · {b.num_sequences} seq"
            if count * 170 / n < 16 or b.duration < 0.12 * xmax:
                txt = f"d={b.degree}"
            lum = 0.299 * c[0] + 0.587 * c[1] + 0.114 * c[2]
            ax.text(b.start + b.duration / 2, first + (count - 1) / 2, txt, ha="center",
                    va="center", fontsize=7, color="black" if lum > 0.5 else "white",
                    clip_on=True)  # fmt: skip
    for t in barriers[:-1]:
        ax.axvline(t, color="0.6", lw=0.4, zorder=0)
    ax.axvline(res.lower_bound, color="crimson", ls="--", lw=1.2, label="lower bound")
    ax.axvline(res.makespan, color="black", ls=":", lw=1.0, label="makespan")
    assert res.plan is not None
    ax.set_title(
        f"{res.strategy}: makespan {res.makespan:.3g} s = {res.ratio:.2f}× lower bound "
        f"{res.lower_bound:.3g} s · utilisation {res.utilization:.0%} · "
        f"{len(res.plan.groups)} CP groups, {res.plan.num_waves} wave"
        f"{'s' if res.plan.num_waves > 1 else ''}",
        loc="left",
        fontsize=10,
    )
    ax.set_xlim(0, xmax)
    ax.set_ylim(n - 0.5, -0.5)
    ax.set_ylabel("replica")


def _degree_table(ax: Any, ok: list[StrategyResult], color: Callable[[int], Any]) -> None:
    """Groups and share of tokens per degree, one column per strategy (the paper's Table 6)."""
    degrees = sorted({d for r in ok if r.plan is not None for d in r.plan.degrees})
    for j, res in enumerate(ok):
        assert res.plan is not None
        groups = Counter(res.plan.degrees)
        tokens: Counter[int] = Counter()
        for g in res.plan.groups:
            tokens[g.degree] += g.num_tokens
        total = max(1, sum(tokens.values()))
        for i, d in enumerate(degrees):
            if not groups.get(d):
                ax.text(j, i, "·", ha="center", va="center", color="0.6")
                continue
            c = color(d)
            ax.add_patch(_rect((j - 0.47, i - 0.45), 0.94, 0.9, c))
            lum = 0.299 * c[0] + 0.587 * c[1] + 0.114 * c[2]
            ax.text(
                j,
                i,
                f"{groups[d]}\n{tokens[d] / total:.0%} tok",
                ha="center",
                va="center",
                fontsize=8,
                color="black" if lum > 0.5 else "white",
            )
    ax.set_xlim(-0.5, len(ok) - 0.5)
    ax.set_ylim(len(degrees) - 0.5, -0.5)
    ax.set_xticks(range(len(ok)), [r.strategy.replace("-", "-\n", 1) for r in ok], fontsize=8)
    ax.set_yticks(range(len(degrees)), [str(d) for d in degrees])
    ax.set_ylabel("CP degree")
    ax.set_title("CP groups per degree\n(and share of tokens)", fontsize=10)
    ax.tick_params(length=0)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def _rect(xy: tuple[float, float], w: float, h: float, c: Any) -> Any:
    from matplotlib.patches import Rectangle

    return Rectangle(xy, w, h, facecolor=c, edgecolor="white", linewidth=0.6)


def draw(
    results: list[StrategyResult], batch: Batch, cluster: Cluster, cost: CostModel,
    path: str | Path, *, title: str = "",
) -> Path:  # fmt: skip
    """Write the comparison PNG (Agg backend, no display needed); returns its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm

    ok = [r for r in results if r.plan is not None]
    if not ok:
        raise ValueError(
            f"no strategy produced a plan: {[r.error for r in results]}; raise "
            "--tokens-per-replica or --replicas so the longest sequence fits"
        )
    n = cluster.num_replicas
    maxdeg = max(max(r.plan.degrees) for r in ok if r.plan is not None)
    norm = LogNorm(vmin=1, vmax=max(2, maxdeg))
    cmap = plt.get_cmap("viridis")

    def color(d: int) -> tuple[float, float, float, float]:
        return cmap(0.05 + 0.9 * norm(d))

    xmax = 1.04 * max(r.makespan for r in ok)
    height = 3.2 * len(ok) + 0.9
    fig = plt.figure(figsize=(17, height), dpi=110)
    grid = fig.add_gridspec(len(ok), 2, width_ratios=(4.2, 1), hspace=0.42, wspace=0.1,
                            top=1 - 0.75 / height, bottom=0.5 / height)  # fmt: skip
    axes = [fig.add_subplot(grid[i, 0]) for i in range(len(ok))]
    for ax, res in zip(axes, ok):
        assert res.plan is not None
        bars, barriers = timeline(res.plan, batch.seqlens, cluster, cost, batch.causal)
        _gantt(ax, res, bars, barriers, n, xmax, color)
    axes[-1].set_xlabel("predicted time (s)")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower left", ncol=2, fontsize=9, frameon=False,
               bbox_to_anchor=(0.05, 0.0))  # fmt: skip
    _degree_table(fig.add_subplot(grid[:, 1]), ok, color)
    lens = batch.seqlens
    fig.suptitle(
        title or f"{batch.label}: {lens.size} sequences (max {int(lens.max()):,}, mean "
        f"{float(lens.mean()):,.0f} tokens) on {n} replicas · {cost.name}",
        fontsize=12, x=0.05, y=1 - 0.15 / height, ha="left",
    )  # fmt: skip
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, bbox_inches="tight")
    plt.close(fig)
    return out


def view(
    batch: Batch, cluster: Cluster, cost: CostModel, path: str | Path,
    strategies: Sequence[str] = VIEW_STRATEGIES,
) -> tuple[Path, list[StrategyResult]]:  # fmt: skip
    """Plan `batch` with every strategy (the saved plan first, if any), draw, return both."""
    results = compare_strategies(batch.seqlens, cluster, cost, strategies, causal=batch.causal)
    if batch.saved is not None:
        if batch.saved.num_replicas != cluster.num_replicas:
            raise ValueError(
                f"the saved plan is for {batch.saved.num_replicas} replicas but --replicas is "
                f"{cluster.num_replicas}; pass --replicas {batch.saved.num_replicas}"
            )
        sc = score_plan(batch.saved, batch.seqlens, cluster, cost, causal=batch.causal)
        saved = StrategyResult(
            strategy=f"saved ({batch.saved.strategy})", plan=batch.saved, makespan=sc.makespan,
            lower_bound=sc.lower_bound, utilization=sc.utilization, planning_ms=math.nan,
        )  # fmt: skip
        results = [saved, *results]
    return draw(results, batch, cluster, cost, path), results


def summarize(results: list[StrategyResult], batch: Batch, path: Path) -> None:
    """The terminal summary: the same numbers as the picture, and where the picture is."""
    from fcp_data.commands.simulate import print_comparison

    lens = batch.seqlens
    print_comparison(
        results, f"{batch.label}: {lens.size} sequences, max {int(lens.max()):,} tokens"
    )
    print(f"plan picture: {path}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="plan_viewer", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    add_problem_args(p)
    src = p.add_argument_group("other sources (override --lengths / --distribution)")
    src.add_argument("--index", type=Path, help="length index directory (`fcp index`)")
    src.add_argument("--shards", nargs="+", help="shard specs, scanned in memory")
    src.add_argument(
        "--batch-index",
        type=int,
        default=0,
        help="which global batch of epoch 0 to draw from --index/--shards",
    )
    src.add_argument("--plan", type=Path, help="a Plan JSON (`fcp plan -o`); drawn first")
    p.add_argument(
        "-o",
        "--output",
        type=Path,
        default=Path("out/plan.png"),
        help="PNG to write (default out/plan.png)",
    )
    p.add_argument(
        "--strategies",
        nargs="+",
        default=list(VIEW_STRATEGIES),
        help=f"strategies to draw (default {' '.join(VIEW_STRATEGIES)})",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    batch = load_batch(args)
    if batch.saved is not None and args.replicas != batch.saved.num_replicas:
        args.replicas = batch.saved.num_replicas
    cluster, cost = cluster_from_args(args), cost_from_args(args)
    path, results = view(batch, cluster, cost, args.output, args.strategies)
    summarize(results, batch, path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
