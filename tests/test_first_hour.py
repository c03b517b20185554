"""The first hour, round 2 (issue 27, part A): what a new user meets is true and says why.

1. The demo's verdict is a median of paired ratios with an interval, "noise" when the interval
   holds 1.0 (tested on given numbers: the verdict on real timings is never asserted); a
   degenerate ring fit, a per-step latency fitted as 0 included, is measured again and then
   replaced by the shipped profile, and the output says which cost model was used.
2. The shipped cpu-small profile carries a measured ring, loads by name from Python, makes the
   README's own picture mixed, and a one-degree plan says why.
3. --tokens-per-replica is derived only by a memory model of the cost model's model and device.
4. One degree notation; make-shards and profile never write over what is there; the examples
   count only what trained, name what they dropped and refuse another process count on
   --resume in one line.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import numpy as np
import pytest

from fcp.cli import main
from fcp.profiling import fit_ring, ring_fit_problems
from fcp_data.errors import ConfigError
from fcp_data.planner import (
    Cluster,
    CostModel,
    Plan,
    format_degrees,
    plan_global_batch,
    why_one_degree,
)
from fcp_data.profiles import shipped_profile

REPO = Path(__file__).resolve().parents[1]


def _one_error_line(capsys: pytest.CaptureFixture[str], command: str) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"fcp {command}: error: "), err
    return err[0]


# ---- 1. a verdict that holds ----------------------------------------------------------------
def test_median_interval_uses_binomial_order_statistics() -> None:
    from fcp.commands.demo import median_interval

    x = [1.9, 1.1, 1.5, 1.3, 1.7, 1.2, 1.6, 1.4, 1.8]  # 9 values: [x(2), x(8)] covers 96.1%
    low, high, cov = median_interval(x)
    assert (low, high) == (1.2, 1.8) and cov == pytest.approx(1 - 2 * 10 / 512)
    low, high, cov = median_interval([1.3, 1.1, 1.2, 1.4])  # too few for 95%: the whole range
    assert (low, high) == (1.1, 1.4) and cov == pytest.approx(0.875)
    with pytest.raises(ConfigError, match="no measured pairs"):
        median_interval([])


def test_paired_ratios_see_through_machine_drift_that_totals_call_noise() -> None:
    """fcp 20% faster in every pair while the machine slows down 3x between pairs: the totals
    of two runs overlap (the old verdict: noise), the paired ratios do not."""
    from fcp.commands.demo import paired_comparison, paired_ratio

    load = [1.0, 3.0, 1.5, 2.5, 1.2, 2.8, 1.1, 2.9, 1.4]
    fcp = [0.20 * x for x in load]
    static = [0.24 * x * (1.01 if i % 2 else 0.99) for i, x in enumerate(load)]
    rounds = [{"strategy_s": fcp[i : i + 3], "baseline_s": static[i : i + 3]} for i in (0, 3, 6)]
    # the rule this replaces: a difference of median totals within their spread is noise
    totals = [(sum(r["strategy_s"]), sum(r["baseline_s"])) for r in rounds]
    f_tot, s_tot = sorted(t[0] for t in totals), sorted(t[1] for t in totals)
    assert s_tot[1] - f_tot[1] <= max(f_tot[2] - f_tot[0], s_tot[2] - s_tot[0])
    pr = paired_ratio(fcp, static)
    assert pr.verdict == "fcp faster" and pr.low > 1.0 and pr.median == pytest.approx(1.188)
    text = "\n".join(paired_comparison(rounds, predicted=1.15, same_plan_steps=0))
    assert "9 paired steps (3 batches x 3 rounds" in text and "96% interval" in text
    assert "fcp faster" in text and "measured and predicted point the same way" in text
    # noise: the interval holds 1.0, whatever the median says
    coin = paired_ratio([1.0] * 9, [0.9, 1.1, 0.95, 1.2, 1.05, 0.97, 1.15, 0.92, 1.08])
    assert coin.low < 1.0 < coin.high and coin.verdict == "noise"
    rounds = [{"strategy_s": [1.0] * 9, "baseline_s": [0.9, 1.1, 0.95, 1.2, 1.05, 0.97, 1.15,
                                                       0.92, 1.08]}]  # fmt: skip
    text = "\n".join(paired_comparison(rounds, predicted=1.0, same_plan_steps=9))
    assert "the interval holds 1.0: noise" in text and "agree: no difference" in text
    assert "planned the same groups in 9 of 9" in text
    slower = paired_ratio([1.0] * 9, [0.8] * 9)
    assert slower.verdict == "static CP faster"
    text = "\n".join(
        paired_comparison([{"strategy_s": [1.0] * 9, "baseline_s": [0.8] * 9}], 1.2, 0)
    )
    assert "point different ways" in text
    with pytest.raises(ConfigError, match="positive seconds"):
        paired_ratio([1.0, 0.0], [1.0, 1.0])


def _rows(cost: CostModel, spb: float, beta2: float) -> list[dict]:
    """What two processes time when the ring exposes alpha3·s/2·spb + beta2 at d = 2."""
    rows = []
    for s in (128, 256, 512, 1024, 2048, 3072):
        t1 = cost.alpha1 * s * s + cost.alpha2 * s + cost.beta1
        t2 = cost.alpha2 * s / 2 + cost.beta1 + cost.alpha3 * s / 2 * spb + beta2
        rows.append({"seqlen": s, "d1_s": t1, "d2_s": t2})
    return rows


def test_a_ring_latency_fitted_as_zero_is_measured_again_then_the_shipped_profile_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse

    import fcp.profiling.ring as ring
    from fcp.commands import demo

    base = CostModel.load("cpu-small")
    calls: list[int] = []

    def no_latency(shape):  # exposed time in proportion to the bytes: beta2 fits as 0
        calls.append(1)
        return _rows(base, 1 / 5e7, 0.0)

    monkeypatch.setattr(ring, "measure_ring", no_latency)
    path, how = demo._local_cost(argparse.Namespace(cost=None), tmp_path)
    assert len(calls) == 2, "a degenerate fit is measured once more"
    assert path == shipped_profile("cpu-small") and not (tmp_path / "cost-ring.json").exists()
    assert how.startswith("cost model used: the shipped cpu-small profile")
    assert "β2) was fitted as 0" in how and "never used" in how
    assert capsys.readouterr().err.count("fcp demo: warning: the ring fit is degenerate") == 2
    # a sound fit is used, and the line says so
    monkeypatch.setattr(ring, "measure_ring", lambda shape: _rows(base, 1 / 5e7, 4e-3))
    path, how = demo._local_cost(argparse.Namespace(cost=None), tmp_path)
    assert path == tmp_path / "cost-ring.json"
    assert how.startswith("cost model used: cpu-small with the ring timed here")
    assert CostModel.load(path).beta2 == pytest.approx(4e-3, rel=1e-6)


# ---- 2. flexible CP visible on a CPU --------------------------------------------------------
def test_the_shipped_cpu_profile_carries_a_sound_measured_ring() -> None:
    path = shipped_profile("cpu-small")
    raw = json.loads(path.read_text())
    cost = CostModel.load(path)
    prof = raw["profile"]
    assert "ring measured" in cost.name and prof["ring_rows"], "a ring-priced profile"
    spb = prof["p2p_fit"]["coef"]["seconds_per_byte"]
    idle = dataclasses.replace(cost, intra_node_bandwidth=1 / spb if spb > 0 else 1e12)
    refit = fit_ring(prof["ring_rows"], cost)  # the same rows give the same price
    assert refit.coef == pytest.approx(prof["ring_fit"], rel=1e-6)
    assert cost.intra_node_bandwidth == pytest.approx(1 / refit.coef["seconds_per_byte"])
    assert cost.beta2 == pytest.approx(refit.coef["beta2"]) and cost.beta2 > 0
    assert ring_fit_problems(refit, idle) == [], "the fallback itself must not be degenerate"


def test_a_shipped_profile_loads_by_name_from_python() -> None:
    assert CostModel.load("cpu-small") == CostModel.load(shipped_profile("cpu-small"))
    with pytest.raises(ConfigError, match=r"CostModel.load no-such: .*shipped: cpu-small"):
        CostModel.load("no-such")


@pytest.fixture(scope="module")
def readme_index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The README's index: `fcp make-shards -o out/shards --text 64` + `fcp index`."""
    from fcp_data.readers import build_index, make_shards

    root = tmp_path_factory.mktemp("readme")
    build_index([str(p) for p in make_shards(root / "shards", text=64)], root / "index")
    return root / "index"


def test_the_readme_picture_mixes_degrees_under_the_shipped_profile(
    readme_index: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--batch", "32", "--replicas", "8", "--cost", "cpu-small",
            "--tokens-per-replica", "4096"]  # fmt: skip
    readme = (REPO / "README.md").read_text()
    assert f"fcp plan --index out/index {' '.join(argv)} -o out/plan.json" in readme
    assert main(["plan", "--index", str(readme_index), *argv, "--json"]) == 0
    mix = set(Plan.from_json(capsys.readouterr().out).degrees)
    assert len(mix) > 1, f"one degree on the README's batch: {mix}"


def test_a_one_degree_plan_says_why() -> None:
    cost = CostModel.load("cpu-small")
    cluster = Cluster(8, tokens_per_replica=4096)
    short = np.full(32, 300)  # every one fits one replica
    for bandwidth, beta2, reason in (
        (5e7, 6e-3, "the ring costs more than it saves"),  # CPU gloo's exposed ring
        (4e9, 3e-4, "the batch is balanced without rings"),  # an idle link: rings are cheap
    ):
        priced = dataclasses.replace(cost, intra_node_bandwidth=bandwidth, beta2=beta2)
        plan = plan_global_batch(short, cluster, priced)
        assert set(plan.degrees) == {1}
        why = why_one_degree(plan, cluster, priced)
        assert why is not None and "every sequence fits one replica" in why
        assert reason in why and "longest 300 of 4,096" in why, why
    free = dataclasses.replace(cost, intra_node_bandwidth=1e13, beta2=0.0)  # a free ring
    small = Cluster(8, tokens_per_replica=1024)
    wide = plan_global_batch(np.full(2, 8000), small, free)  # each needs all 8 replicas
    assert set(wide.degrees) == {8}
    why = why_one_degree(wide, small, free)
    assert why is not None and "needs d >= 8" in why and "hides behind" in why, why
    exposed = dataclasses.replace(cost, intra_node_bandwidth=5e7, beta2=6e-3)
    lens = np.array([300] * 28 + [3000, 5200, 7900, 11000])
    mixed = plan_global_batch(lens, cluster, exposed)
    assert len(set(mixed.degrees)) > 1 and why_one_degree(mixed, cluster, exposed) is None


def test_plan_and_view_print_why_a_batch_is_one_degree(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import fcp_data.viewer.compare as compare

    lens = tmp_path / "lens.txt"
    lens.write_text("\n".join(["300"] * 32))
    argv = ["--lengths", str(lens), "--replicas", "8", "--tokens-per-replica", "4096",
            "--cost", "cpu-small"]  # fmt: skip
    assert main(["plan", *argv]) == 0
    out = capsys.readouterr().out
    assert "degrees: ⟨1⟩×" in out and "one degree for every group: every sequence fits" in out
    monkeypatch.setattr(compare, "draw", lambda results, batch, cluster, cost, path, **_: path)
    assert main(["view", *argv, "--strategies", "fcp", "-o", str(tmp_path / "p.png")]) == 0
    assert "fcp: one degree for every group: every sequence fits" in capsys.readouterr().out


# ---- 3. a capacity from this model and device only -----------------------------------------
def test_tokens_per_replica_is_derived_only_by_a_matching_memory_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    small = ["--distribution", "c4", "--batch", "16", "--replicas", "4"]
    for cmd in ("plan", "simulate", "view"):
        assert main([cmd, *small, "--cost", "cpu-small", "-o", str(tmp_path / "x")]) == 2
        line = _one_error_line(capsys, cmd)
        assert "--tokens-per-replica is required with --cost cpu-small" in line
        assert "cpu-small on cpu" in line and "qwen3-8b on --hardware h200" in line
    assert not (tmp_path / "x").exists()
    # a profile of the memory model's own model and device derives as the analytic cost does
    mine = tmp_path / "qwen.json"
    CostModel.from_model("qwen3-8b", "h200").save(mine)
    assert main(["plan", *small, "--cost", str(mine), "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["num_replicas"] == 4 and "tokens" in captured.err


# ---- 4. numbers that agree -------------------------------------------------------------------
def test_one_degree_notation_in_the_cli_the_demo_and_the_examples() -> None:
    from fcp.demo.vlm import _step_line

    assert format_degrees([2, 1, 2, 1, 1]) == "⟨2⟩×2, ⟨1⟩×3" and format_degrees([]) == "none"
    m = SimpleNamespace(degrees=(2, 2, 2), num_waves=1, predicted_time=0.1)
    line = _step_line(1, 0.5, m, np.array([[1, 2]]), 0.2)
    assert "⟨2⟩×3" in line and "<2>" not in line
    for example in ("train_megatron.py", "train_fsdp.py"):
        source = (REPO / "examples" / example).read_text()
        assert "format_degrees(r['degrees'])" in source and "degrees {r['degrees']}" not in source


def test_make_shards_refuses_a_used_folder_unless_overwrite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "shards"
    base = ["make-shards", "-o", str(out), "--samples-per-shard", "2"]
    assert main([*base, "--text", "8"]) == 0
    capsys.readouterr()
    assert len(list(out.glob("*.tar"))) == 4
    assert main([*base, "--text", "4"]) == 2
    line = _one_error_line(capsys, "make-shards")
    assert "is not empty" in line and "--overwrite" in line
    assert len(list(out.glob("*.tar"))) == 4, "a refusal leaves the folder as it was"
    assert main([*base, "--text", "4", "--overwrite"]) == 0
    assert "replaced 4 old shards" in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == ["text-000000.tar", "text-000001.tar"]


def test_profile_never_overwrites_without_overwrite(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import fcp.profiling.measure as measure
    from fcp.profiling import ComputePoint, Profile, fit_compute

    cost = CostModel.load("cpu-small")
    s = [512, 1024, 2048]
    t = [cost.alpha1 * n * n + cost.alpha2 * n for n in s]
    planted = Profile(cost=cost, compute=fit_compute(s, t),
                      points=tuple(ComputePoint(seqlen=n, attention_s=x / 2, linear_s=x / 2)
                                   for n, x in zip(s, t)))  # fmt: skip
    timed: list[int] = []

    def run_profile(config, on_step=None):
        timed.append(1)
        return planted

    monkeypatch.setattr(measure, "run_profile", run_profile)
    out = tmp_path / "p.json"
    out.write_text("mine")
    assert main(["profile", "--no-p2p", "-o", str(out)]) == 2
    assert "exists; pass --overwrite" in _one_error_line(capsys, "profile")
    assert out.read_text() == "mine" and not timed, "refused before anything was timed"
    assert main(["profile", "--no-p2p", "-o", str(out), "--overwrite"]) == 0
    assert CostModel.load(out).alpha1 == cost.alpha1 and timed == [1]


def _example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", REPO / "examples" / name)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_step_lines_count_only_trained_tokens_and_name_what_was_dropped() -> None:
    """`MicroBatch.trained_tokens` summed over every replica counts each planned sequence once
    (a degree-d group's members hold the same sequences; placeholders and dropped samples
    train nothing); `BatchMetrics.dropped_note` is what the examples' step lines print."""
    from fcp_data.inmemory import InMemoryBatch, shard_batch
    from fcp_data.loader.types import BatchMetrics

    lens = [15, 53, 162, 21, 90, 25, 44, 250, 900]  # 900: too long for 4 x 200 tokens
    rng = np.random.default_rng(0)
    batch = InMemoryBatch([rng.integers(1, 500, size=n) for n in lens])
    cluster = Cluster(4, tokens_per_replica=200)
    cost = CostModel.load(shipped_profile("cpu-small"))  # prices the ring: mixed degrees
    shards = [shard_batch(batch, cluster, cost, replica=r, on_too_long="drop") for r in range(4)]
    mbs = [mb for s in shards for mb in s.micro_batches]
    assert shards[0].plan.dropped == (8,) and max(shards[0].plan.degrees) >= 2  # not vacuous
    assert any(mb.is_placeholder for mb in mbs)
    assert sum(mb.trained_tokens for mb in mbs) == sum(lens[:8])
    for mb in mbs:  # member 0 of each group carries its sequences' tokens, the others 0
        rp = mb.rank_plan
        want = sum(rp.seqlens) if rp.index_in_group == 0 and not mb.is_placeholder else 0
        assert mb.trained_tokens == want

    def metrics(skipped: tuple[tuple[str, str], ...]) -> BatchMetrics:
        return BatchMetrics(epoch=0, batch_index=0, num_sequences=8, num_tokens=660,
                            num_waves=2, degrees=(1, 2), predicted_time=1.0, lower_bound=1.0,
                            winner="fcp", planning_s=0.0, load_s=0.0, digest="d",
                            skipped=skipped)  # fmt: skip

    skipped = tuple((f"k{i}.py", "too long for the cluster (9000 tokens)") for i in range(6))
    note = metrics(skipped).dropped_note()
    assert note == "dropped 6 (too long for the cluster): k0.py, k1.py, k2.py, k3.py +2 more"
    assert metrics(()).dropped_note() == "dropped 0"
    for name in ("train_megatron.py", "train_fsdp.py"):  # the examples print these, no copy
        text = (REPO / "examples" / name).read_text()
        assert ".trained_tokens" in text and ".dropped_note()" in text
        assert "def trained_tokens" not in text and "def dropped_note" not in text


def _run_example(name: str, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run(
        [sys.executable, str(REPO / "examples" / name), *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_resume_on_another_process_count_is_one_line_naming_both(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    for rank in range(2):  # what 2 processes of train_megatron.py --checkpoint leave
        (ckpt / f"rank-{rank:05d}.pt").write_bytes(b"")
    (ckpt / "loader.json").write_text(json.dumps({"world_size": 2, "steps": 2, "loader": {}}))
    for name in ("train_megatron.py", "train_fsdp.py"):
        out = _run_example(name, tmp_path, "--replicas", "4", "--resume", "ckpt")
        err = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(err) == 1, out.stderr[-2000:]
        assert err[0].startswith(f"{name}: error: --resume ckpt was saved by 2 processes, this "
                                 "run starts 4"), err  # fmt: skip
