"""The plan viewer: a real PNG from a synthetic profile and from a saved plan JSON."""

from __future__ import annotations

from collections import defaultdict
from itertools import pairwise

import numpy as np
import pytest
from e2e_helpers import load_example

from fcp_data.cli import main as fcp_main
from fcp_data.planner import Cluster, CostModel, generate_lengths, plan_global_batch, score_plan

viewer = load_example("plan_viewer")


def _image_stats(path) -> tuple[int, int]:
    import matplotlib.image as mpimg

    img = mpimg.imread(path)
    colors = np.unique((img[..., :3] * 255).astype(np.uint8).reshape(-1, 3), axis=0)
    return img.shape[0] * img.shape[1], len(colors)


def test_timeline_matches_the_simulator_and_never_overlaps() -> None:
    lens = generate_lengths("extreme", 128, seed=3)
    cluster = Cluster(16, replicas_per_node=8, tokens_per_replica=16384)
    cost = CostModel.from_model("qwen3-8b", "h200")
    causal = np.ones(lens.size, bool)
    for strategy in ("fcp", "static"):
        plan = plan_global_batch(lens, cluster, cost, strategy=strategy)
        bars, _ = viewer.timeline(plan, lens, cluster, cost, causal)
        assert len(bars) == len(plan.groups) > 1
        end = max(b.start + b.duration for b in bars)
        assert end == pytest.approx(score_plan(plan, lens, cluster, cost).makespan, rel=1e-12)
        busy = defaultdict(list)
        for b in bars:
            for r in b.replicas:
                busy[r].append((b.start, b.start + b.duration))
        for spans in busy.values():
            spans.sort()
            assert all(a[1] <= b[0] + 1e-12 for a, b in pairwise(spans))


def test_viewer_draws_synthetic_profile_with_all_three_strategies(tmp_path, capsys) -> None:
    out = tmp_path / "plan.png"
    argv = ["--distribution", "extreme", "--batch", "96", "--replicas", "16", "-o", str(out)]
    assert viewer.main(argv) == 0
    pixels, colors = _image_stats(out)
    assert out.stat().st_size > 30_000 and pixels > 1_000_000
    assert colors > 50, "a blank or single-colour picture"
    text = capsys.readouterr().out
    for strategy in viewer.VIEW_STRATEGIES:
        assert strategy in text
    assert f"plan picture: {out}" in text


def test_viewer_draws_a_saved_plan_first(tmp_path, capsys) -> None:
    plan_json = tmp_path / "plan.json"
    assert fcp_main(["plan", "--distribution", "c4", "--batch", "48", "--replicas", "8",
                     "-o", str(plan_json)]) == 0  # fmt: skip
    capsys.readouterr()
    out = tmp_path / "saved.png"
    assert viewer.main(["--plan", str(plan_json), "--strategies", "fcp", "static",
                        "-o", str(out)]) == 0  # fmt: skip
    assert out.stat().st_size > 20_000 and _image_stats(out)[1] > 20
    assert "saved (fcp)" in capsys.readouterr().out


def test_viewer_rejects_a_plan_for_another_cluster(tmp_path) -> None:
    lens = generate_lengths("c4", 16, seed=0)
    cost = CostModel.from_model("qwen3-8b", "h200")
    plan = plan_global_batch(lens, Cluster(4, tokens_per_replica=16384), cost)
    batch = viewer.Batch(seqlens=lens, causal=np.ones(lens.size, bool), label="x", saved=plan)
    with pytest.raises(ValueError, match="--replicas 4"):
        viewer.view(batch, Cluster(8, tokens_per_replica=16384), cost, tmp_path / "x.png")
