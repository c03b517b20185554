"""`fcp view` and fcp_data.viewer: real PNGs from a distribution, a saved plan and an index."""

from __future__ import annotations

import subprocess
import sys
from collections import defaultdict
from itertools import pairwise

import numpy as np
import pytest
from e2e_helpers import REPO, image_colors

from fcp.cli import main as fcp_main
from fcp_data.errors import ConfigError
from fcp_data.planner import Cluster, CostModel, generate_lengths, plan_global_batch, score_plan
from fcp_data.viewer import (
    VIEW_STRATEGIES,
    Bar,
    batch_from_lengths,
    degree_color,
    free_path,
    timeline,
    view,
    wave_spans,
)
from fcp_data.viewer.colors import PALETTE
from fcp_data.viewer.gantt import label_for


def _hex(d: int) -> tuple[int, int, int]:
    h = PALETTE[d].lstrip("#")
    return (int(h[0:2], 16), int(h[2:4], 16), int(h[4:6], 16))


def test_timeline_matches_the_simulator_and_never_overlaps() -> None:
    lens = generate_lengths("extreme", 128, seed=3)
    cluster = Cluster(16, replicas_per_node=8, tokens_per_replica=16384)
    cost = CostModel.from_model("qwen3-8b", "h200")
    causal = np.ones(lens.size, bool)
    for strategy in ("fcp", "static", "megatron-hybrid"):
        plan = plan_global_batch(lens, cluster, cost, strategy=strategy)
        bars, _ = timeline(plan, lens, cluster, cost, causal)
        assert len(bars) == len(plan.groups) > 1
        end = max(b.end for b in bars)
        assert end == pytest.approx(score_plan(plan, lens, cluster, cost).makespan, rel=1e-12)
        busy = defaultdict(list)
        for b in bars:
            for r in b.replicas:
                busy[r].append((b.start, b.end))
        for spans in busy.values():
            spans.sort()
            assert all(a[1] <= b[0] + 1e-12 for a, b in pairwise(spans))
        spans = wave_spans(plan, bars)
        assert [s.wave for s in spans] == sorted({b.wave for b in bars})
        assert max(s.end for s in spans) == pytest.approx(end)


def test_degree_colours_are_fixed_and_distinct() -> None:
    colours = [degree_color(d) for d in range(1, 17)]
    assert len(set(colours)) == 16
    assert degree_color(4) == degree_color(4) and degree_color(100) != degree_color(1000)
    with pytest.raises(ValueError, match="degree=0"):
        degree_color(0)


def test_labels_fit_or_are_left_out() -> None:
    bar = Bar(wave=0, replicas=(0,), degree=2, num_sequences=13, tokens=1, start=0, duration=1)
    assert label_for(bar, 200, 20) == "d=2 · 13 seq"
    assert label_for(bar, 20, 20) == "d=2"
    assert label_for(bar, 8, 20) == "2"
    assert label_for(bar, 3, 20) == "" and label_for(bar, 200, 5) == ""


def test_view_from_a_distribution_writes_a_png_and_never_overwrites(tmp_path, capsys) -> None:
    out = tmp_path / "plan.png"
    argv = ["view", "--distribution", "extreme", "--batch", "96", "--replicas", "16",
            "--tokens-per-replica", "16384", "-o", str(out)]  # fmt: skip
    assert fcp_main(argv) == 0
    pixels, colors = image_colors(out)
    assert out.stat().st_size > 30_000 and pixels > 1_000_000 and len(colors) > 50
    # d = 1 and d = 2 groups are drawn in their fixed colours (visible, not eaten by outlines)
    assert {_hex(1), _hex(2)} <= colors
    text = capsys.readouterr().out
    for strategy in VIEW_STRATEGIES:
        assert strategy in text
    assert f"plan picture: {out}" in text
    first = out.read_bytes()
    assert fcp_main(argv) == 0
    assert out.read_bytes() == first, "overwritten"
    assert f"plan picture: {tmp_path / 'plan-1.png'}" in capsys.readouterr().out
    assert (tmp_path / "plan-1.png").stat().st_size > 30_000
    assert fcp_main([*argv, "--force"]) == 0
    assert f"plan picture: {out}\n" in capsys.readouterr().out
    assert not (tmp_path / "plan-2.png").exists()
    assert free_path(out) == tmp_path / "plan-2.png" and free_path(out, force=True) == out


def test_view_draws_a_saved_plan_first(tmp_path, capsys) -> None:
    plan_json = tmp_path / "plan.json"
    assert fcp_main(["plan", "--distribution", "c4", "--batch", "48", "--replicas", "8",
                     "-o", str(plan_json)]) == 0  # fmt: skip
    capsys.readouterr()
    out = tmp_path / "saved.png"
    assert fcp_main(["view", "--plan", str(plan_json), "--strategies", "fcp", "static",
                     "-o", str(out)]) == 0  # fmt: skip
    assert out.stat().st_size > 20_000 and len(image_colors(out)[1]) > 20
    assert "saved (fcp)" in capsys.readouterr().out


def test_view_from_an_index_with_a_shipped_profile(tmp_path, capsys) -> None:
    from fcp_data.readers import build_index, make_shards

    paths = make_shards(tmp_path / "s", text=24, seed=2, samples_per_shard=12)
    build_index([str(p) for p in paths], tmp_path / "idx")
    out = tmp_path / "idx.png"
    assert fcp_main(["view", "--index", str(tmp_path / "idx"), "--batch", "16", "--replicas",
                     "4", "--tokens-per-replica", "8192", "--cost", "cpu-small",
                     "-o", str(out)]) == 0  # fmt: skip
    text = capsys.readouterr().out
    assert "global batch 0: 16 sequences" in text and out.stat().st_size > 20_000


def test_view_rejects_a_plan_for_another_cluster(tmp_path) -> None:
    lens = generate_lengths("c4", 16, seed=0)
    cost = CostModel.from_model("qwen3-8b", "h200")
    plan = plan_global_batch(lens, Cluster(4, tokens_per_replica=16384), cost)
    batch = batch_from_lengths(lens, "x")
    batch = type(batch)(seqlens=batch.seqlens, causal=batch.causal, label="x", saved=plan)
    with pytest.raises(ConfigError, match="--replicas 4"):
        view(batch, Cluster(8, tokens_per_replica=16384), cost, tmp_path / "x.png")


def test_the_example_script_runs_over_the_public_api(tmp_path) -> None:
    out = tmp_path / "ex.png"
    cmd = [sys.executable, str(REPO / "examples" / "plan_viewer.py"), "--batch", "64",
           "--replicas", "8", "-o", str(out)]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert f"plan picture: {out}" in res.stdout and out.stat().st_size > 20_000


def test_timeline_prices_placeholders_and_sync_waves_like_the_simulator() -> None:
    """A replica that sits a wave out spends a placeholder there, and under sync_waves every
    wave ends with a barrier: the bars start where `score_plan` starts their groups."""
    from fcp_data.planner.plan import CPGroup, Plan, Wave

    cost = CostModel.from_model("qwen3-8b", "h200")
    lens = np.array([4000, 100, 3000])
    causal = np.ones(3, bool)

    def group(reps: tuple[int, ...], ids: tuple[int, ...]) -> CPGroup:
        return CPGroup(replicas=reps, degree=len(reps), sequence_ids=ids,
                       seqlens=tuple(int(lens[i]) for i in ids), causal=(True,) * len(ids),
                       predicted_time=0.0)  # fmt: skip

    # replica 1 idles in wave 0 then runs a short group; replica 0 idles in wave 1
    plan = Plan(num_replicas=2, waves=(Wave(groups=(group((0,), (0,)),)),
                                       Wave(groups=(group((1,), (1,)),)),
                                       Wave(groups=(group((0, 1), (2,)),))),
                predicted_time=0.0, lower_bound=0.0, strategy="t", winner="t")  # fmt: skip
    for idle, sync in (("placeholder", False), ("empty", False), ("placeholder", True)):
        cluster = Cluster(2, tokens_per_replica=16384, idle=idle, sync_waves=sync)
        bars, barriers = timeline(plan, lens, cluster, cost, causal)
        score = score_plan(plan, lens, cluster, cost)
        p = cost.placeholder_seconds(cluster)[0]
        assert (p > 0) == (idle == "placeholder")
        assert len(barriers) == (3 if sync else 0)
        if not sync:  # replica 1: placeholder, then its group; the ring waits for both
            assert bars[1].start == pytest.approx(p)
        assert max(b.end for b in bars) == pytest.approx(score.makespan, rel=1e-12)
