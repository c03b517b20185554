"""What the command line shows is true: a saved plan is viewed under what it was made with,
planning times are warm, every sequence is accounted for in the picture, an unavailable device
is one line, and the demo says when a ring fit or a measured difference cannot be trusted."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pytest

from fcp.cli import main
from fcp.profiling import Fit, FitRow
from fcp_data.planner import CostModel, Plan
from fcp_data.profiles import shipped_profile

SMALL = ["--distribution", "github", "--batch", "32", "--replicas", "8",
         "--tokens-per-replica", "4096", "--cost", "cpu-small"]  # fmt: skip


def _one_error_line(capsys: pytest.CaptureFixture[str], command: str) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"fcp {command}: error: "), err
    return err[0]


@pytest.fixture()
def drawn(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """`fcp view` without matplotlib: records what would be drawn, with which cluster/cost."""
    import fcp_data.viewer.compare as compare

    calls: list[dict] = []

    def fake_draw(results, batch, cluster, cost, path, *, force=False):
        calls.append({"results": results, "batch": batch, "cluster": cluster, "cost": cost})
        return Path(path)

    monkeypatch.setattr(compare, "draw", fake_draw)
    return calls


# ---- 1. a saved plan keeps its cost model and cluster ------------------------------------------
def test_a_saved_plan_is_viewed_with_the_cost_model_and_cluster_it_was_made_with(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], drawn: list[dict]
) -> None:
    saved = tmp_path / "plan.json"
    assert main(["plan", *SMALL, "-o", str(saved)]) == 0
    capsys.readouterr()
    doc = json.loads(saved.read_text())
    cpu_small = CostModel.load(shipped_profile("cpu-small"))
    assert doc["cluster"]["num_replicas"] == 8 and doc["cluster"]["tokens_per_replica"] == 4096
    assert doc["cost_model"]["name"] == cpu_small.name
    plan = Plan.from_json(saved.read_bytes())  # the plain reader still reads the new file
    # the view's defaults are Qwen3-8B on 64 H200; the saved plan's are used instead
    assert main(["view", "--plan", str(saved), "-o", str(tmp_path / "v.png")]) == 0
    (call,) = drawn
    assert call["cost"] == cpu_small
    assert (call["cluster"].num_replicas, call["cluster"].tokens_per_replica) == (8, 4096)
    first = call["results"][0]
    assert first.strategy == "saved (fcp)"
    assert first.makespan == pytest.approx(plan.predicted_time, rel=1e-9)
    # the baselines beside it are the ones `fcp simulate` gives under the same flags
    assert main(["simulate", *SMALL, "--strategies", "static", "--json"]) == 0
    out = capsys.readouterr().out
    static = json.loads(out[out.index("[") :])[0]["makespan"]
    by = {r.strategy: r.makespan for r in call["results"]}
    assert by["static"] == pytest.approx(static, rel=1e-9)


def test_flags_that_contradict_a_saved_plan_are_refused_and_agreeing_ones_accepted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], drawn: list[dict]
) -> None:
    saved = tmp_path / "plan.json"
    assert main(["plan", *SMALL, "-o", str(saved)]) == 0
    capsys.readouterr()
    png = ["-o", str(tmp_path / "v.png")]
    assert main(["view", "--plan", str(saved), "--replicas", "16", *png]) == 2
    line = _one_error_line(capsys, "view")
    assert "--replicas 16 (saved: 8)" in line and "cpu-small" in line
    assert main(["view", "--plan", str(saved), "--model", "qwen3-8b", *png]) == 2
    assert "--model qwen3-8b" in _one_error_line(capsys, "view")
    assert main(["view", "--plan", str(saved), "--tokens-per-replica", "8192", *png]) == 2
    assert "--tokens-per-replica 8192 (saved: 4096)" in _one_error_line(capsys, "view")
    assert not drawn
    same = ["--replicas", "8", "--tokens-per-replica", "4096", "--cost", "cpu-small"]
    assert main(["view", "--plan", str(saved), *same, *png]) == 0
    assert "drawn and priced with the cost model and cluster it was made with" in (
        capsys.readouterr().out
    )


def test_a_bare_plan_json_says_which_cost_model_and_cluster_price_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], drawn: list[dict]
) -> None:
    saved = tmp_path / "plan.json"
    assert main(["plan", *SMALL, "-o", str(saved)]) == 0
    capsys.readouterr()
    bare = tmp_path / "bare.json"
    bare.write_bytes(Plan.from_json(saved.read_bytes()).to_json())  # what older fcp wrote
    argv = ["view", "--plan", str(bare), "--tokens-per-replica", "4096", "--cost", "cpu-small"]
    assert main([*argv, "-o", str(tmp_path / "v.png")]) == 0
    out = capsys.readouterr().out
    assert "records no cost model or cluster" in out and "8 replicas" in out
    assert drawn[0]["cluster"].num_replicas == 8  # the plan's replica count, no flag needed


# ---- 3. planning times are warm ----------------------------------------------------------------
@pytest.fixture()
def cold_first_plan(monkeypatch: pytest.MonkeyPatch) -> float:
    """Every strategy's first plan in the process costs 0.4 s more (numba, megatron imports)."""
    import fcp.commands.plan as plan_cmd
    import fcp_data.planner.compare as planner_compare
    import fcp_data.viewer.compare as viewer_compare
    from fcp_data.planner import plan_global_batch

    seen: set[str] = set()
    cold = 0.4

    def planned(*args, **kw):
        strategy = kw.get("strategy", "fcp")
        if strategy not in seen:
            seen.add(strategy)
            time.sleep(cold)
        return plan_global_batch(*args, **kw)

    for module in (plan_cmd, planner_compare, viewer_compare):
        monkeypatch.setattr(module, "plan_global_batch", planned)
    return cold


def test_simulate_and_plan_report_warm_planning_time(
    capsys: pytest.CaptureFixture[str], cold_first_plan: float
) -> None:
    argv = ["simulate", *SMALL, "--strategies", "fcp", "static"]
    assert main([*argv, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert all(r["planning_ms"] < cold_first_plan * 1e3 for r in rows), rows
    assert main(argv) == 0
    assert "plan (ms, warm)" in capsys.readouterr().out
    assert main(["plan", *SMALL, "--strategy", "pow2"]) == 0
    out = capsys.readouterr().out
    ms = float(out.split("planned in ")[1].split(" ms (warm)")[0])
    assert ms < cold_first_plan * 1e3, out


# ---- 5. an unavailable device is one line, exit 2 ----------------------------------------------
@pytest.fixture()
def no_profiling(monkeypatch: pytest.MonkeyPatch) -> None:
    import fcp.profiling.measure as measure

    def never(*_a, **_k):
        raise AssertionError("profiling started on an unusable device")

    monkeypatch.setattr(measure, "run_profile", never)


@pytest.mark.usefixtures("no_profiling")
def test_profile_on_a_device_this_machine_lacks_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch

    out = ["-o", str(tmp_path / "p.json"), "--no-p2p"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["profile", "--device", "cuda", *out]) == 2
    assert "--device cuda:" in _one_error_line(capsys, "profile")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert main(["profile", "--device", "cuda:7", *out]) == 2
    assert "1 cuda device(s), cuda:0..cuda:0" in _one_error_line(capsys, "profile")
    assert main(["profile", "--device", "tpu9", *out]) == 2
    assert "is not a torch device" in _one_error_line(capsys, "profile")
    import importlib.util

    if importlib.util.find_spec("torch_npu") is None:
        assert main(["profile", "--device", "npu", *out]) == 2
        assert "torch_npu" in _one_error_line(capsys, "profile")
    assert not (tmp_path / "p.json").exists()


# ---- 2. the demo distrusts a degenerate ring fit and noise-level differences --------------------
def test_a_ring_fit_that_prices_the_ring_as_free_is_measured_again_then_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import fcp.profiling.ring as ring
    from fcp.commands import demo

    base = CostModel.load(shipped_profile("cpu-small"))
    calls: list[int] = []

    def flat_rows(shape):
        calls.append(1)  # the same exposed time at every length: no bandwidth term
        rows = []
        for s in (512, 1024, 2048, 3072):
            t1 = base.alpha1 * s * s + base.alpha2 * s + base.beta1
            rows.append({"seqlen": s, "d1_s": t1, "d2_s": base.alpha2 * s / 2 + base.beta1 + 0.02})
        return rows

    monkeypatch.setattr(ring, "measure_ring", flat_rows)
    path, how = demo._local_cost(argparse.Namespace(cost=None), tmp_path)
    assert len(calls) == 2, "a degenerate fit is measured once more"
    assert path == shipped_profile("cpu-small") and not (tmp_path / "cost-ring.json").exists()
    assert "bandwidth term was fitted as 0" in how and "the shipped cpu-small profile" in how
    assert "1000000 MB/s" not in how
    assert capsys.readouterr().err.count("fcp demo: warning: the ring fit is degenerate") == 2


def test_ring_fit_problems_name_zero_and_absurd_terms() -> None:
    import dataclasses

    from fcp.commands.demo import ring_fit_problems

    # priced at an idle loopback ping-pong (4 GB/s), what a ring fit is compared with
    shipped = CostModel.load(shipped_profile("cpu-small"))
    base = dataclasses.replace(shipped, intra_node_bandwidth=4e9, inter_node_bandwidth=4e9)
    rows = (FitRow(x=512, measured=0.01, predicted=0.01),)
    ok = Fit(coef={"seconds_per_byte": 1 / 7e7, "beta2": 2e-3}, rows=rows)
    assert ring_fit_problems(ok, base) == []
    free = Fit(coef={"seconds_per_byte": 0.0, "beta2": 2e-3}, rows=rows)
    assert "fitted as 0" in ring_fit_problems(free, base)[0]
    fast = Fit(coef={"seconds_per_byte": 0.1 / base.intra_node_bandwidth, "beta2": 2e-3},
               rows=rows)  # fmt: skip
    assert "faster than the idle ping-pong" in ring_fit_problems(fast, base)[0]
    flat = Fit(coef={"seconds_per_byte": 1 / 7e7, "beta2": 0.0}, rows=rows)
    assert ring_fit_problems(flat, base) == ["its per-step latency (β2) was fitted as 0"]


def test_a_measured_difference_whose_paired_interval_holds_one_is_called_noise() -> None:
    """The paired verdict on given numbers (tests/test_first_hour.py has the statistics)."""
    from fcp.commands.demo import paired_comparison

    noisy = [{"strategy_s": [0.2, 0.27], "baseline_s": [0.3, 0.16]},
             {"strategy_s": [0.3, 0.46], "baseline_s": [0.2, 0.55]}]  # fmt: skip
    text = "\n".join(paired_comparison(noisy, predicted=1.0, same_plan_steps=2))
    assert "4 paired steps" in text and "the interval holds 1.0: noise" in text
    assert "planned the same groups in 2 of 2 step(s)" in text
    clear = [{"strategy_s": [0.2, 0.2], "baseline_s": [0.5, 0.5]},
             {"strategy_s": [0.21, 0.2], "baseline_s": [0.5, 0.52]}]  # fmt: skip
    text = "\n".join(paired_comparison(clear, predicted=2.0, same_plan_steps=0))
    assert "fcp faster" in text and "2.50x" in text and "88% interval" in text
    one = "\n".join(paired_comparison(clear[:1], predicted=2.0, same_plan_steps=0))
    assert "2 pair(s): too few for a verdict" in one and "fcp faster" not in one


# ---- 4. no sequence is left out of the picture silently -------------------------------------
def test_the_picture_and_table_say_how_many_sequences_each_plan_leaves_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import matplotlib.figure

    titles: list[str] = []
    savefig = matplotlib.figure.Figure.savefig

    def spy(self, *args, **kw):
        titles.append(self._suptitle.get_text())
        titles.extend(ax.get_title(loc="left") for ax in self.axes)
        return savefig(self, *args, **kw)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", spy)
    lens = tmp_path / "lens.txt"  # two sequences longer than 8 replicas x 4096 tokens hold
    lens.write_text("\n".join(str(x) for x in [300] * 30 + [100_000, 90_000]))
    argv = ["view", "--lengths", str(lens), "--replicas", "8", "--tokens-per-replica", "4096",
            "--cost", "cpu-small", "--strategies", "fcp", "static", "-o",
            str(tmp_path / "p.png")]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "fcp: placed 30 of 32 sequences: 2 too long for the cluster, left out" in out
    assert "32 sequences" in titles[0] and "2 of 2 plans leave sequences out" in titles[0]
    panels = [t for t in titles[1:] if t]
    assert len(panels) == 2 and all("placed 30 of 32 sequences" in t for t in panels), titles
    assert not any("placed" in t for t in _titles_of_a_full_batch(tmp_path, titles))


def _titles_of_a_full_batch(tmp_path: Path, titles: list[str]) -> list[str]:
    """Titles of a picture whose plans place every sequence (the spy appends to `titles`)."""
    before = len(titles)
    argv = ["view", "--distribution", "c4", "--batch", "16", "--replicas", "4",
            "--tokens-per-replica", "4096", "--cost", "cpu-small", "--strategies", "fcp",
            "-o", str(tmp_path / "q.png")]  # fmt: skip
    assert main(argv) == 0
    return titles[before:]


# ---- 6. progress off a terminal says how far along and how long is left ------------------------
def test_profile_progress_lines_off_a_terminal_count_points_and_time_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import fcp.profiling.measure as measure

    class Stop(Exception):
        pass

    def two_points(config, *, on_step=None):
        on_step("attention s=256")
        on_step("linear s=256")
        raise Stop

    monkeypatch.setattr(measure, "run_profile", two_points)
    with pytest.raises(Stop):
        main(
            [
                "profile",
                "--lengths",
                "256",
                "512",
                "1024",
                "--no-p2p",
                "-o",
                str(tmp_path / "p.json"),
            ]
        )
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("profiling cpu-small: ")
    assert "[1/" in lines[1] and "s left)" in lines[1], lines
