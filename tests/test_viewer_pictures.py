"""The plan picture's legibility, measured on real figures drawn with the Agg backend.

Wave labels never overlap a title (their rendered bounding boxes, from matplotlib's own
renderer), the degree table's tiles follow their counts of CP groups, and the replica axis
marks whole replica indices only (a 2-replica panel used to read -0.50 ... 1.50).
"""

from __future__ import annotations

import re
from itertools import pairwise
from typing import Any

import numpy as np
import pytest

from fcp_data.planner import Cluster, CostModel, generate_lengths
from fcp_data.viewer import batch_from_lengths, view

pytest.importorskip("matplotlib")

COST = CostModel.from_model("qwen3-8b", "h200")


def _figure(monkeypatch, tmp_path, replicas: int, batch: int, *, seed: int = 3, dist="extreme"):
    """Draw `fcp view`'s picture; its figure and renderer, taken where it would be written."""
    import fcp_data.viewer.figure as figure

    seen: list[Any] = []

    def keep(fig: Any, out: Any) -> None:
        fig.canvas.draw()  # lay out text so window extents are final
        seen.append((fig, fig.canvas.get_renderer()))  # closing the figure drops its canvas

    monkeypatch.setattr(figure, "save_atomic", keep)
    lens = generate_lengths(dist, batch, seed=seed)
    tokens = max(16384, int(lens.max()) // max(1, replicas) + 1)
    cluster = Cluster(replicas, replicas_per_node=8, tokens_per_replica=tokens)
    view(batch_from_lengths(lens, "pictures"), cluster, COST, tmp_path / "p.png")
    assert len(seen) == 1
    return seen[0]


def _panels(fig: Any) -> tuple[list[Any], Any]:
    """The Gantt panels (y label "replica") and the degree table."""
    gantt = [a for a in fig.axes if a.get_ylabel() == "replica"]
    table = [a for a in fig.axes if a.get_ylabel() == "CP degree"]
    assert gantt and len(table) == 1
    return gantt, table[0]


def _titles(ax: Any) -> list[Any]:
    """An axes' titles: centre, left and right (the panels title on the left), drawn ones only;
    they are the axes' Text children that are not its `ax.text` annotations."""
    Text = pytest.importorskip("matplotlib.text").Text
    return [
        c
        for c in ax.get_children()
        if isinstance(c, Text) and c.get_text() and all(c is not t for t in ax.texts)
    ]


@pytest.mark.parametrize(("replicas", "batch"), [(2, 16), (8, 64), (16, 96), (64, 256)])
def test_wave_labels_never_overlap_a_title(monkeypatch, tmp_path, replicas, batch) -> None:
    fig, renderer = _figure(monkeypatch, tmp_path, replicas, batch)
    gantt, _ = _panels(fig)
    # every axes title and the figure's own title (suptitle lives in fig.texts)
    titles = [t for a in fig.axes for t in _titles(a)] + list(fig.texts)
    assert len(titles) >= len(gantt) + 2, [t.get_text()[:20] for t in titles]
    labels = [t for a in gantt for t in a.texts if re.fullmatch(r"w\d+", t.get_text())]
    assert labels, "no wave label drawn: the check would prove nothing"
    for label in labels:
        box = label.get_window_extent(renderer)
        for title in titles:
            tbox = title.get_window_extent(renderer)
            assert not box.overlaps(tbox), (label.get_text(), title.get_text()[:40])
    # and room is left above every panel's labels: its title starts above the highest label
    for ax in gantt:
        mine = [t for t in ax.texts if re.fullmatch(r"w\d+", t.get_text())]
        (title,) = _titles(ax)
        if mine:
            top = max(t.get_window_extent(renderer).y1 for t in mine)
            assert top <= title.get_window_extent(renderer).y0, title.get_text()[:40]


def _tiles(table: Any) -> dict[int, list[float]]:
    """Area (in data units) of each degree-table tile, by the count of groups written by it."""
    areas: dict[int, list[float]] = {}
    for patch in table.patches:
        x, y = patch.get_x() + patch.get_width() / 2, patch.get_y() + patch.get_height() / 2
        text = next(  # in its cell: on the tile, or just below a small one
            t
            for t in table.texts
            if abs(t.get_position()[0] - x) < 1e-6 and round(t.get_position()[1]) == round(y)
        )
        count = int(text.get_text().split("\n")[0])
        areas.setdefault(count, []).append(patch.get_width() * patch.get_height())
    return areas


def test_degree_table_tiles_scale_with_their_counts(monkeypatch, tmp_path) -> None:
    fig, _ = _figure(monkeypatch, tmp_path, 16, 128)
    _, table = _panels(fig)
    areas = _tiles(table)
    assert len(areas) >= 2, f"one count only ({areas}): the check would prove nothing"
    for count, sizes in areas.items():
        assert max(sizes) - min(sizes) < 1e-9, f"tiles of {count} groups differ: {sizes}"
    counts = sorted(areas)
    sizes = [areas[c][0] for c in counts]
    assert len(set(sizes)) >= 2, dict(zip(counts, sizes))
    assert all(a <= b for a, b in pairwise(sizes)), dict(zip(counts, sizes))
    # area in proportion to the count: the panel's largest fills its cell (0.94 x 0.9), the
    # smallest keep a floor of MIN_TILE of its side so they stay visible
    from fcp_data.viewer.gantt import MIN_TILE

    for count, size in zip(counts, sizes):
        share = max(MIN_TILE**2, count / counts[-1])
        assert size == pytest.approx(0.94 * 0.9 * share), (count, counts[-1])


def test_tile_sizes_follow_counts() -> None:
    from fcp_data.viewer.gantt import MIN_TILE, tile_side

    assert tile_side(9, 9) == 1.0 and tile_side(4, 16) == pytest.approx(0.5)
    assert tile_side(1, 1000) == MIN_TILE  # the smallest tile stays visible
    assert tile_side(2, 8) < tile_side(4, 8) < tile_side(8, 8)


@pytest.mark.parametrize("replicas", [1, 2, 5])
def test_replica_axis_has_integer_ticks_only(monkeypatch, tmp_path, replicas) -> None:
    fig, _ = _figure(monkeypatch, tmp_path, replicas, 8 * replicas, dist="c4")
    gantt, _ = _panels(fig)
    for ax in gantt:
        low, high = sorted(ax.get_ylim())
        shown = [
            t.get_text()
            for t, v in zip(ax.get_yticklabels(), ax.get_yticks())
            if low - 1e-9 <= v <= high + 1e-9
        ]
        assert shown, ax.title.get_text()[:40]
        for text in shown:
            assert re.fullmatch(r"\d+", text), (replicas, shown)
        assert [int(t) for t in shown] == list(range(replicas)), shown


def test_replica_ticks_are_whole_and_few() -> None:
    from fcp_data.viewer.gantt import replica_ticks

    assert replica_ticks(1) == [0] and replica_ticks(2) == [0, 1]
    for n in (1, 2, 5, 8, 9, 17, 64, 100, 1000, 4096):
        ticks = replica_ticks(n)
        assert ticks[0] == 0 and ticks[-1] < n and len(ticks) <= 8
        assert len({b - a for a, b in pairwise(ticks)}) <= 1
    assert np.diff(replica_ticks(64)).tolist() == [10] * 6
