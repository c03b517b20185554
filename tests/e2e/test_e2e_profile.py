"""The profiler: exact fits on synthetic timings, real 2-process P2P, `fcp profile` CLI."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from fcp.cli import main as fcp_main
from fcp.profiling import (
    Fit,
    FitRow,
    fit_compute,
    fit_p2p,
    fit_warnings,
    measure_p2p,
)
from fcp.profiling.fit import nonneg_relative_lstsq
from fcp_data.errors import ConfigError
from fcp_data.planner import CostModel
from fcp_data.profiles import resolve_cost, shipped_profile


def test_compute_fit_recovers_known_coefficients_exactly() -> None:
    a1, a2, b1 = 3.1e-8, 4.7e-5, 2.3e-3
    s = np.array([256, 512, 1024, 2048, 4096, 8192])
    fit = fit_compute(s, a1 * s**2 + a2 * s + b1)
    assert fit.coef["alpha1"] == pytest.approx(a1, rel=1e-9)
    assert fit.coef["alpha2"] == pytest.approx(a2, rel=1e-9)
    assert fit.coef["beta1"] == pytest.approx(b1, rel=1e-7)
    assert len(fit.rows) == s.size and fit.max_abs_error < 1e-9


def test_fit_minimises_relative_error_and_never_goes_negative() -> None:
    s = np.array([256, 512, 1024, 2048, 4096])
    # superlinear at the short end would need beta1 < 0: the fit drops the column instead
    t = 1e-8 * s**2 + 1e-5 * s - 1e-3 + 2e-3 * (s == 256)
    fit = fit_compute(s, np.maximum(t, 1e-4))
    assert all(v >= 0 for v in fit.coef.values())
    # relative weighting: the short sequences are not sacrificed to the longest one
    noisy = (2e-8 * s**2 + 5e-5 * s) * np.array([1.05, 0.95, 1.05, 0.95, 1.05])
    rel = fit_compute(s, noisy)
    assert rel.max_abs_error < 0.08
    assert [r.x for r in rel.rows] == s.tolist()
    with pytest.raises(ValueError, match="positive"):
        nonneg_relative_lstsq(np.ones((3, 2)), np.array([1.0, 0.0, 2.0]))


def test_p2p_fit_recovers_latency_and_bandwidth() -> None:
    n = np.array([4096, 65536, 1 << 20, 16 << 20])
    fit = fit_p2p(n, 80e-6 + n / 2.5e9)
    assert fit.coef["latency"] == pytest.approx(80e-6, rel=1e-9)
    assert 1 / fit.coef["seconds_per_byte"] == pytest.approx(2.5e9, rel=1e-9)


def test_p2p_measurement_on_two_real_processes() -> None:
    points = measure_p2p((4096, 1 << 20), repeats=2, timeout_s=90)
    assert [p.nbytes for p in points] == [4096, 1 << 20]
    assert all(math.isfinite(p.seconds) and p.seconds > 0 for p in points)  # no time bound


def test_fcp_profile_quick_writes_a_profile_cost_model_reads(tmp_path, capsys) -> None:
    out = tmp_path / "p.json"
    argv = ["profile", "--quick", "--lengths", "128", "256", "512", "--repeats", "1", "-o",
            str(out)]  # fmt: skip
    assert fcp_main(argv) == 0
    text = capsys.readouterr().out
    assert "compute fit" in text and "P2P fit" in text and str(out) in text
    cost = CostModel.load(out)
    assert cost.alpha1 > 0 or cost.alpha2 > 0
    assert cost.intra_node_bandwidth > 0 and cost.alpha3 == 3 * 2 * 2 * 2 * 32 * 4
    raw = json.loads(out.read_text())["profile"]
    assert [r["x"] for r in raw["compute_fit"]["rows"]] == [128, 256, 512]
    assert len(raw["p2p_fit"]["rows"]) == 3
    assert fcp_main(["plan", "--cost", str(out), "--replicas", "4", "--batch", "16",
                     "--tokens-per-replica", "4096", "--distribution", "c4"]) == 0  # fmt: skip


def test_shipped_cpu_profile_loads_and_its_errors_recompute_from_its_points() -> None:
    path = shipped_profile("cpu-small")
    cost = CostModel.load(path)
    prof = json.loads(path.read_text())["profile"]
    pts = prof["points"]
    refit = fit_compute([p["seqlen"] for p in pts],
                        [p["attention_s"] + p["linear_s"] for p in pts])  # fmt: skip
    assert refit.coef["alpha1"] == pytest.approx(cost.alpha1, rel=1e-6)
    assert refit.coef["alpha2"] == pytest.approx(cost.alpha2, rel=1e-6)
    assert refit.max_abs_error == pytest.approx(prof["compute_fit"]["max_abs_error"], rel=1e-6)
    assert len(pts) >= 5 and prof["p2p_fit"] is not None
    with pytest.raises(ConfigError, match=r"shipped: .*cpu-small"):
        shipped_profile("no-such-profile")
    assert resolve_cost("cpu-small") == path


def test_fit_warnings_name_each_kind_of_degenerate_fit() -> None:
    s = np.array([256, 512, 1024, 2048])
    clean = fit_compute(s, 2e-8 * s**2 + 5e-5 * s + 1e-3)
    assert fit_warnings(clean, "compute fit") == []
    linear = fit_compute(s, 5e-5 * s)  # no quadratic, no constant: both fitted as exactly 0
    (zero,) = fit_warnings(linear, "compute fit")
    assert "alpha1, beta1 fitted as 0" in zero
    exact = fit_compute(s[:3], [0.01, 0.03, 0.05])
    assert any("3 point(s) for 3 coefficients" in w for w in fit_warnings(exact, "c"))
    rows = (FitRow(x=1, measured=6, predicted=6), FitRow(x=2, measured=1, predicted=1))
    few = Fit(coef={"a": 1.0, "b": 2.0, "c": 3.0}, rows=rows)
    assert any("2 point(s) for 3 coefficients" in w for w in fit_warnings(few, "c"))
    off = fit_compute(s, (2e-8 * s**2 + 5e-5 * s) * np.array([1.0, 1.6, 1.0, 0.7]))
    (bad,) = [w for w in fit_warnings(off, "compute fit") if "off by more than 25%" in w]
    assert "512 (" in bad


def _planted_profile():
    from fcp.profiling import ComputePoint, Profile
    from fcp_data.planner import CostModel

    s = [256, 512, 1024]
    times = [0.010, 0.030, 0.040]  # not a quadratic: the fit misses the middle point
    points = tuple(ComputePoint(seqlen=n, attention_s=t / 2, linear_s=t / 2)
                   for n, t in zip(s, times))  # fmt: skip
    fit = fit_compute(s, times)
    cost = CostModel(alpha1=max(fit.coef["alpha1"], 1e-12), alpha2=fit.coef["alpha2"],
                     name="planted")  # fmt: skip
    return Profile(cost=cost, compute=fit, points=points)


def test_fcp_profile_warns_on_a_planted_degenerate_fit_and_logs_progress(
    tmp_path, capsys, monkeypatch
) -> None:
    import fcp.profiling.measure as measure

    def fake_run_profile(config, *, on_step=None):
        for s in config.seqlens:
            on_step(f"attention s={s}")
        return _planted_profile()

    monkeypatch.setattr(measure, "run_profile", fake_run_profile)
    out = tmp_path / "p.json"
    argv = ["profile", "--lengths", "256", "512", "1024", "--no-p2p", "-o", str(out)]
    assert fcp_main(argv) == 0
    captured = capsys.readouterr()
    # stdout is not a terminal here: one progress line per measured point
    for i, s in enumerate((256, 512, 1024), 1):
        assert f"[{i}/9] attention s={s} (" in captured.out
    warnings = [ln for ln in captured.err.splitlines() if ln.startswith("fcp profile: warning:")]
    assert any("3 point(s) for 3 coefficients" in w for w in warnings), captured.err
    assert any("off by more than 25%: 512 (-27%)" in w for w in warnings), captured.err
    assert str(out) in captured.out


def test_all_to_all_measurement_on_three_real_processes() -> None:
    from fcp.profiling.a2a import measure_a2a

    points = measure_a2a((3 * 4096, 3 << 18), world=3, repeats=2, timeout_s=90)
    # buffers are split evenly over the members: a multiple of 3 floats
    assert [p.nbytes for p in points] == [3 * 4096, 3 << 18]
    assert all(math.isfinite(p.seconds) and p.seconds > 0 and p.world == 3 for p in points)


def test_fcp_profile_head_parallel_prices_the_shapes_transports(tmp_path, capsys) -> None:
    from fcp.profiling import shape_from_name
    from fcp_data.planner.cost.transports import a2a_bytes_per_token, head_parallel_degrees

    out = tmp_path / "p.json"
    argv = ["profile", "--quick", "--lengths", "128", "256", "512", "--repeats", "1",
            "--no-p2p", "--head-parallel", "-o", str(out)]  # fmt: skip
    assert fcp_main(argv) == 0
    assert "all-to-all fit" in capsys.readouterr().out
    shape = shape_from_name("cpu-small")
    cost = CostModel.load(out)
    assert cost.head_parallel == head_parallel_degrees(shape.heads, shape.kv_heads) != ()
    assert cost.a2a_bytes[0] == a2a_bytes_per_token(
        heads=shape.heads, kv_heads=shape.kv_heads, head_dim=shape.head_dim,
        ulysses=cost.head_parallel[0], activation_bytes=4, layers=shape.layers,
    )  # fmt: skip
    assert cost.a2a_efficiency > 0 and cost.beta3 >= 0
    raw = json.loads(out.read_text())["profile"]
    assert len(raw["a2a_fit"]["rows"]) == 3
