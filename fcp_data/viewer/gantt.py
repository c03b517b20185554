"""One strategy's panel (replicas x predicted time) and the groups-per-degree table.

Legibility rules, in points of the rendered axes: a bar is at least 1.2 pt wide (a d = 1 group
of a short sequence on a long timeline would otherwise vanish) and loses its white outline
when it is under 4 pt in either direction (the outline would cover it). A label is the long
"d=4 · 12 seq" where it fits, the bare degree "4" where only that fits, and nothing otherwise;
a group on the head-parallel hybrid is hatched and labelled with its transport ("d=8 2×4":
all-to-all over 2, ring over 4);
the fit is measured as 0.62 x font size per character and font size + 1 pt of height.
Waves: a bracket per wave in one of two rows a fixed number of points above the axes
(labelled w0, w1, ... where there is room; the title is padded clear of both rows) and a
vertical line where each wave after the first starts (solid at a barrier, dotted otherwise).
The replica axis marks whole replica indices only. In the degree table a tile's area follows
its count of CP groups (the largest count fills its cell).
Every panel's title counts the sequences its plan places; a plan that leaves some out (too long
for the whole cluster) says so on a second line, and the title turns red, so no panel shows
fewer sequences than the picture's title names without saying how many and why.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

from ..optional import require
from ..planner.compare import StrategyResult
from .bars import Bar, WaveSpan
from .colors import degree_color, text_color
from .summary import left_out

__all__ = [
    "axes_points",
    "draw_degree_table",
    "draw_panel",
    "label_for",
    "replica_ticks",
    "tile_side",
]

FONT = 7.0
CHAR_W = 0.62  # average glyph width / font size of matplotlib's default sans at small sizes
MIN_BAR_PT = 1.2
MIN_TILE = 0.3  # the smallest degree-table tile, as a fraction of its cell's side
WAVE_ROWS_PT = (4.0, 13.0)  # heights above the axes of the two rows of wave brackets
# the title clears the upper row's labels: row + 1 pt + a line of FONT - 0.5 pt text + margin
TITLE_PAD = WAVE_ROWS_PT[1] + 1 + 1.3 * (FONT - 0.5) + 4


def axes_points(ax: Any) -> tuple[float, float]:
    """Width and height of an axes in points (its window extent at the figure's dpi)."""
    box = ax.get_window_extent()
    dpi = ax.figure.dpi
    return box.width * 72 / dpi, box.height * 72 / dpi


def replica_ticks(num_replicas: int, most: int = 8) -> list[int]:
    """Replica indices to mark on the y axis: whole numbers only (matplotlib's own locator
    puts -0.50, -0.25, ... on a 2-replica panel), every 1, 2, 5, 10, 20, 50, ... replicas,
    the smallest step that keeps the marks to `most` or fewer."""
    n = max(1, num_replicas)
    decade = 1
    while True:
        for step in (decade, 2 * decade, 5 * decade):
            if -(-n // step) <= most:
                return list(range(0, n, step))
        decade *= 10


def label_for(bar: Bar, width_pt: float, height_pt: float) -> str:
    """The longest label of `bar` that fits a box of this size ("" when none does)."""
    if height_pt < FONT + 1:
        return ""
    hybrid = f" {bar.transport}" if bar.ulysses > 1 else ""  # "d=8 2×4": all-to-all 2, ring 4
    for text in (
        f"d={bar.degree}{hybrid} · {bar.num_sequences} seq",
        f"d={bar.degree}{hybrid}",
        f"d={bar.degree}",
        str(bar.degree),
    ):
        if len(text) * CHAR_W * FONT + 2 <= width_pt:
            return text
    return ""


def _runs(replicas: Sequence[int]) -> list[tuple[int, int]]:
    """Contiguous (first, count) runs of sorted replica indices: one rectangle each."""
    out: list[tuple[int, int]] = []
    for r in sorted(replicas):
        if out and out[-1][0] + out[-1][1] == r:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((r, 1))
    return out


def _rect(xy: tuple[float, float], w: float, h: float, color: Any, outline: bool) -> Any:
    Rectangle = require("matplotlib.patches", "drawing the plan Gantt chart").Rectangle

    return Rectangle(
        xy,
        w,
        h,
        facecolor=color,
        edgecolor="white" if outline else "none",
        linewidth=0.6 if outline else 0.0,
    )


def _waves(ax: Any, spans: list[WaveSpan], pt_per_s: float) -> None:
    offset_copy = require("matplotlib.transforms", "drawing the plan Gantt chart").offset_copy
    base = ax.get_xaxis_transform()  # x in data, y in axes fraction
    label_end = [-1e9, -1e9]  # right edge (pt) of the last label in each of the two rows
    for i, sp in enumerate(spans):
        if i:
            ax.axvline(
                sp.start, color="0.35", lw=0.7, ls="-" if spans[i - 1].barrier else ":", zorder=3
            )
        row = i % 2  # alternate rows: spans of barrier-free waves overlap
        # rows sit a fixed number of points above the axes (not a fraction of its height), so
        # the room they take is the same on every panel and TITLE_PAD keeps the title clear
        trans = offset_copy(base, fig=ax.figure, y=WAVE_ROWS_PT[row], units="points")
        ax.plot(
            [sp.start, sp.end],
            [1, 1],
            color="0.3",
            lw=1.0,
            marker="|",
            markersize=4,
            transform=trans,
            clip_on=False,
        )
        text = f"w{sp.wave}"
        need = len(text) * CHAR_W * FONT + 4
        mid = (sp.start + sp.end) / 2 * pt_per_s
        if (sp.end - sp.start) * pt_per_s >= need and mid - need / 2 >= label_end[row]:
            label_end[row] = mid + need / 2
            ax.text(
                (sp.start + sp.end) / 2,
                1,
                text,
                transform=offset_copy(base, fig=ax.figure, y=WAVE_ROWS_PT[row] + 1, units="points"),
                ha="center",
                va="bottom",
                fontsize=FONT - 0.5,
                color="0.2",
                clip_on=False,
            )


def draw_panel(
    ax: Any,
    res: StrategyResult,
    bars: list[Bar],
    spans: list[WaveSpan],
    num_replicas: int,
    xmax: float,
    num_sequences: int | None = None,
) -> None:
    """Bars of one plan, its waves, the lower bound and the makespan, and its title: one line,
    and a second in red when the plan places fewer than the batch's `num_sequences`."""
    ax.set_xlim(0, xmax)
    ax.set_ylim(num_replicas - 0.5, -0.5)
    width_pt, height_pt = axes_points(ax)
    pt_per_s, pt_per_row = width_pt / xmax, height_pt / num_replicas
    min_w = MIN_BAR_PT / pt_per_s
    for b in bars:
        c = degree_color(b.degree)
        w = max(b.duration, min_w)
        runs = _runs(b.replicas)
        for first, count in runs:
            outline = w * pt_per_s >= 4 and count * pt_per_row >= 4
            patch = _rect((b.start, first - 0.5), w, count, c, outline)
            if b.ulysses > 1:  # head-parallel hybrid: hatched, whatever its degree colour
                patch.set_hatch("//")
            ax.add_patch(patch)
        first, count = max(runs, key=lambda fc: fc[1])
        text = label_for(b, b.duration * pt_per_s, count * pt_per_row)
        if text:
            ax.text(
                b.start + b.duration / 2,
                first + (count - 1) / 2,
                text,
                ha="center",
                va="center",
                fontsize=FONT,
                color=text_color(c),
                clip_on=True,
            )
    _waves(ax, spans, pt_per_s)
    ax.axvline(res.lower_bound, color="crimson", ls="--", lw=1.2, label="lower bound", zorder=4)
    ax.axvline(res.makespan, color="black", ls=":", lw=1.0, label="makespan", zorder=4)
    assert res.plan is not None
    waves = res.plan.num_waves
    placed = len(res.plan.sequence_ids())
    note = left_out(res, num_sequences) if num_sequences is not None else ""
    ax.set_title(
        f"{res.strategy}: makespan {res.makespan:.3g} s = {res.ratio:.2f}× lower bound "
        f"{res.lower_bound:.3g} s · utilisation {res.utilization:.0%} · "
        f"{len(res.plan.groups)} CP groups, {waves} wave{'s' if waves > 1 else ''}, "
        f"{placed} sequences" + (f"\n{note}; they are not drawn" if note else ""),
        loc="left",
        fontsize=10,
        pad=TITLE_PAD,
        color="crimson" if note else "black",
    )
    ax.set_yticks(replica_ticks(num_replicas))
    ax.set_ylabel("replica")


def tile_side(count: int, most: int) -> float:
    """A degree-table tile's side as a fraction of its cell: the tile's area follows its count
    of CP groups (the panel's largest count fills the cell), so a column of 40 d = 1 groups and
    one d = 8 group no longer look alike; never under MIN_TILE so the smallest stays visible."""
    return max(MIN_TILE, math.sqrt(count / max(1, most)))


def draw_degree_table(ax: Any, ok: list[StrategyResult]) -> None:
    """Groups and share of tokens per degree, one column per strategy (the paper's Table 6)."""
    degrees = sorted({d for r in ok if r.plan is not None for d in r.plan.degrees})
    most = max(c for r in ok if r.plan is not None for c in Counter(r.plan.degrees).values())
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
            c = degree_color(d)
            side = tile_side(groups[d], most)
            ax.add_patch(
                _rect((j - 0.47 * side, i - 0.45 * side), 0.94 * side, 0.9 * side, c, True)
            )
            # the two text lines fit on a large tile, in its contrast colour; under a small one
            # they go just below it in black, so a small tile stays a tile and not a text box
            inside = side >= 0.75
            ax.text(
                j,
                i if inside else i + 0.45 * side + 0.04,
                f"{groups[d]}\n{tokens[d] / total:.0%} tok",
                ha="center",
                va="center" if inside else "top",
                fontsize=8,
                color=text_color(c) if inside else "black",
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
