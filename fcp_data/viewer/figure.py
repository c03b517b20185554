"""The whole picture: one panel per strategy, the degree table, a legend; and where it goes.

Panels grow with the cluster so that one replica row stays >= 5 pt tall (a d = 1 group is one
row): 2.4 in for up to ~25 replicas, 0.07 in per replica above that. Files are never silently
overwritten: `free_path` picks `plan.png`, else `plan-1.png`, `plan-2.png`, ... unless the
caller forces the given name (`fcp view --force`). A picture is written whole or not at all
(`save_atomic`).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..optional import require
from ..planner import Cluster, CostModel
from ..planner.compare import StrategyResult
from .bars import timeline, wave_spans
from .batch import Batch
from .colors import degree_color
from .gantt import draw_degree_table, draw_panel

__all__ = ["build_figure", "draw", "free_path", "save_atomic"]


def free_path(path: str | Path, *, force: bool = False) -> Path:
    """`path` if it does not exist (or `force`), else the first free `stem-K.suffix`, K >= 1."""
    p = Path(path)
    if force or not p.exists():
        return p
    for k in range(1, 10_000):
        q = p.with_name(f"{p.stem}-{k}{p.suffix}")
        if not q.exists():
            return q
    raise ConfigError(f"{p} and 9,999 numbered variants exist; pass another -o or --force")


def _panel_height(num_replicas: int) -> float:
    return max(2.4, 0.07 * num_replicas + 0.6)


def draw(
    results: list[StrategyResult],
    batch: Batch,
    cluster: Cluster,
    cost: CostModel,
    path: str | Path,
    *,
    title: str = "",
    force: bool = False,
) -> Path:
    """Write the comparison PNG (Agg backend, no display needed); returns the path written,
    which is `path` or a numbered variant of it (see `free_path`)."""
    plt = require("matplotlib.pyplot", "drawing the plan comparison PNG")
    fig = build_figure(results, batch, cluster, cost, title=title)
    out = free_path(path, force=force)
    try:
        save_atomic(fig, out)
    finally:
        plt.close(fig)
    return out


def build_figure(
    results: list[StrategyResult],
    batch: Batch,
    cluster: Cluster,
    cost: CostModel,
    *,
    title: str = "",
) -> Any:
    """The comparison as an open matplotlib Figure (Agg backend), kept apart from `draw` so
    its layout can be measured before anything is written; the caller closes it."""
    matplotlib = require("matplotlib", "drawing the plan comparison PNG")
    matplotlib.use("Agg")
    plt = require("matplotlib.pyplot", "drawing the plan comparison PNG")
    Patch = require("matplotlib.patches", "drawing the plan comparison PNG").Patch

    ok = [r for r in results if r.plan is not None]
    if not ok:
        raise ConfigError(
            f"no strategy produced a plan: {[r.error for r in results]}; raise "
            "--tokens-per-replica or --replicas so the longest sequence fits"
        )
    n = cluster.num_replicas
    xmax = 1.04 * max(r.makespan for r in ok)
    panel = _panel_height(n)
    lens = batch.seqlens
    # plans that leave sequences out get a second title line: room for it above the first panel
    short = [r for r in ok if r.plan is not None and len(r.plan.sequence_ids()) < lens.size]
    head = 0.9 + (0.2 if short else 0.0)
    height = (panel + 0.8) * len(ok) + 1.2 + (head - 0.9)
    fig = plt.figure(figsize=(17, height), dpi=110)
    grid = fig.add_gridspec(
        len(ok),
        2,
        width_ratios=(4.2, 1),
        hspace=0.8 / (panel + 0.8) * 1.6,
        wspace=0.1,
        top=1 - head / height,
        bottom=0.75 / height,
    )
    axes = [fig.add_subplot(grid[i, 0]) for i in range(len(ok))]
    for ax, res in zip(axes, ok):
        assert res.plan is not None
        bars, _ = timeline(res.plan, batch.seqlens, cluster, cost, batch.causal)
        draw_panel(ax, res, bars, wave_spans(res.plan, bars), n, xmax, batch.seqlens.size)
    axes[-1].set_xlabel("predicted time (s)")
    handles, labels = axes[0].get_legend_handles_labels()
    degrees = sorted({d for r in ok if r.plan is not None for d in r.plan.degrees})
    handles += [Patch(facecolor=degree_color(d), label=f"d={d}") for d in degrees]
    labels += [f"d={d}" for d in degrees]
    fig.legend(
        handles,
        labels,
        loc="lower left",
        ncol=min(12, len(labels)),
        fontsize=9,
        frameon=False,
        bbox_to_anchor=(0.05, 0.0),
    )
    draw_degree_table(fig.add_subplot(grid[:, 1]), ok)
    fig.suptitle(
        title
        or f"{batch.label}: {lens.size} sequences (max {int(lens.max()):,}, mean "
        f"{float(lens.mean()):,.0f} tokens) on {n} replicas · {cost.name}"
        + (
            f" · {len(short)} of {len(ok)} plans leave sequences out (their titles say how many)"
            if short
            else ""
        ),
        fontsize=12,
        x=0.05,
        y=1 - 0.2 / height,
        ha="left",
    )
    return fig


def save_atomic(fig: Any, out: Path) -> None:
    """`fig` saved to `out` whole or not at all: drawn into a temporary sibling, renamed into
    place once complete (atomic on POSIX). A write that fails half-way (a full disk, a file
    size limit, a kill) used to leave a truncated picture at `out`, over an older complete one
    under --force; now `out` is untouched and the error says nothing was written."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fmt = out.suffix.lstrip(".").lower() or "png"
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            fig.savefig(f, format=fmt, bbox_inches="tight")
        os.replace(tmp, out)
    except OSError as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise ConfigError(f"cannot write the picture {out} ({exc}); nothing was written") from exc
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
