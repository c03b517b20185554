"""The ring's exposed cost: an exact fit on synthetic timings, and what it does to plans."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fcp.profiling import fit_ring, fit_warnings, with_ring
from fcp_data.errors import ConfigError
from fcp_data.planner import Cluster, CostModel, plan_global_batch
from fcp_data.profiles import shipped_profile


def _rows(cost: CostModel, spb: float, beta2: float, slowdown: float) -> list[dict]:
    """What two processes would time if the ring exposed alpha3·s/2·spb + beta2 at d = 2,
    on a machine `slowdown` times slower than the one the profile was taken on."""
    rows = []
    for s in (512, 1024, 2048, 3072):
        t1 = cost.alpha1 * s * s + cost.alpha2 * s + cost.beta1
        exposed = cost.alpha3 * s / 2 * spb + beta2
        t2 = cost.alpha2 * s / 2 + cost.beta1 + exposed
        rows.append({"seqlen": s, "d1_s": slowdown * t1, "d2_s": slowdown * t2})
    return rows


@pytest.mark.parametrize("slowdown", [1.0, 3.7])
def test_ring_fit_recovers_the_exposed_cost_on_a_busy_machine_too(slowdown) -> None:
    cost = CostModel.load(shipped_profile("cpu-small"))
    fit = fit_ring(_rows(cost, 1 / 5e7, 4e-3, slowdown), cost)
    assert fit.coef["seconds_per_byte"] == pytest.approx(1 / 5e7, rel=1e-9)
    assert fit.coef["beta2"] == pytest.approx(4e-3, rel=1e-7)
    assert fit.max_abs_error < 1e-9 and fit_warnings(fit, "ring") == []
    ringed = with_ring(cost, fit)
    assert ringed.intra_node_bandwidth == pytest.approx(5e7, rel=1e-9)
    assert ringed.inter_node_bandwidth == ringed.intra_node_bandwidth
    assert (ringed.alpha1, ringed.alpha2) == (cost.alpha1, cost.alpha2)


def test_ring_fit_refuses_rows_with_nothing_exposed() -> None:
    cost = CostModel.load(shipped_profile("cpu-small"))
    rows = [{"seqlen": s, "d1_s": 1.0, "d2_s": 0.01} for s in (512, 1024)]
    with pytest.raises(ConfigError, match="fully hidden"):
        fit_ring(rows, cost)
    with pytest.raises(ConfigError, match="no ring measurements"):
        fit_ring([], cost)


def test_an_exposed_ring_makes_mixed_degrees_win_on_long_tailed_lengths() -> None:
    """Why the demo measures the ring: with the idle ping-pong price one ring over all
    replicas costs nothing extra and fcp = static; priced as CPU gloo exposes it, fcp keeps
    the short sequences at d = 1 and only the long ones on rings."""
    rng = np.random.default_rng(0)
    lens = np.concatenate([rng.integers(100, 1500, 28), [3000, 5200, 7900, 11000]])
    cluster = Cluster(8, tokens_per_replica=4096)
    shipped = CostModel.load(shipped_profile("cpu-small"))  # its compute terms; links below
    idle = dataclasses.replace(shipped, intra_node_bandwidth=4e9, inter_node_bandwidth=4e9,
                               beta2=3.3e-4)  # an idle loopback ping-pong  # fmt: skip
    exposed = dataclasses.replace(idle, intra_node_bandwidth=1e8, inter_node_bandwidth=1e8,
                                  beta2=5e-3)  # fmt: skip
    ratios = {}
    for name, cost in (("idle", idle), ("exposed", exposed)):
        fcp = plan_global_batch(lens, cluster, cost, strategy="fcp")
        static = plan_global_batch(lens, cluster, cost, strategy="static")
        ratios[name] = static.predicted_time / fcp.predicted_time
        if name == "exposed":
            assert 1 in fcp.degrees and max(fcp.degrees) > 1, fcp.degrees
            assert len(set(static.degrees)) == 1 and min(static.degrees) > 1
    assert ratios["idle"] < 1.05 and ratios["exposed"] > 1.15, ratios


def test_fcp_profile_ring_prices_the_saved_profile_with_the_ring(tmp_path, capsys, monkeypatch):
    import fcp.profiling.measure as measure
    import fcp.profiling.ring as ring
    from fcp.cli import main as fcp_main
    from fcp.profiling import ComputePoint, Profile, fit_compute

    cost = CostModel.load(shipped_profile("cpu-small"))
    s = [512, 1024, 2048]
    t = [cost.alpha1 * n * n + cost.alpha2 * n for n in s]
    planted = Profile(cost=cost, compute=fit_compute(s, t),
                      points=tuple(ComputePoint(seqlen=n, attention_s=x / 2, linear_s=x / 2)
                                   for n, x in zip(s, t)))  # fmt: skip
    monkeypatch.setattr(measure, "run_profile", lambda config, on_step=None: planted)
    monkeypatch.setattr(ring, "measure_ring", lambda shape: _rows(cost, 1 / 5e7, 4e-3, 2.0))
    out = tmp_path / "p.json"
    assert fcp_main(["profile", "--no-p2p", "--ring", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "ring: bandwidth 50 MB/s effective, β2 = 4.00 ms" in text
    saved = CostModel.load(out)
    assert saved.intra_node_bandwidth == pytest.approx(5e7, rel=1e-6)
    assert saved.beta2 == pytest.approx(4e-3, rel=1e-6) and saved.alpha1 == cost.alpha1
