"""The planner's transports: ring or head-parallel hybrid u x r, chosen per CP group.

Oracles: the scalar cost model (`CostModel.transport_from_aggregates`) for the compiled kernel
and the vectorised scorer, the exhaustive optimum for the lower bound, and the plan's own
recorded transport for `score_plan`.
"""

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from planner_problems import problems

from fcp_data.errors import ConfigError
from fcp_data.planner import Cluster, CostModel, plan_global_batch, score_plan
from fcp_data.planner.cost.problem import Problem
from fcp_data.planner.cost.transports import (
    a2a_bytes_per_token,
    blocks_span_nodes,
    head_parallel_degrees,
    ring_share,
)
from fcp_data.planner.kernels import group_time
from fcp_data.planner.oracle import exhaustive_optimum


def _slow_links(cost: CostModel, factor: float = 200.0) -> CostModel:
    """The same model on links `factor` x slower: the ring no longer hides behind attention
    for short sequences, the regime where a head-parallel transport can win."""
    return dataclasses.replace(
        cost,
        intra_node_bandwidth=cost.intra_node_bandwidth / factor,
        inter_node_bandwidth=cost.inter_node_bandwidth / factor,
    )


@pytest.fixture(scope="module")
def hybrid() -> CostModel:
    return _slow_links(CostModel.from_model("qwen3-8b", "h200", head_parallel=True))


def test_head_parallel_degrees_follow_the_heads():
    # Qwen3-8B: 32 query heads, 8 KV heads: u divides 32 and divides or is a multiple of 8
    assert head_parallel_degrees(32, 8) == (2, 4, 8, 16, 32)
    # 12 / 2 (Qwen2.5-1.5B): 3 divides 12 but neither divides nor is a multiple of 2
    assert head_parallel_degrees(12, 2) == (2, 4, 6, 12)
    assert head_parallel_degrees(4, 4) == (2, 4)
    assert head_parallel_degrees(1, 1) == ()
    with pytest.raises(ConfigError, match="multiple of kv_heads"):
        head_parallel_degrees(12, 5)
    assert ring_share(8, 2) == 0.5 and ring_share(8, 16) == pytest.approx(1 / 8)


def test_a2a_bytes_count_every_tensor():
    # 4 (H + max(H_kv, u)) D a: Q, K, V out and O back forward, dO out and dQ, dK, dV back
    assert a2a_bytes_per_token(heads=32, kv_heads=8, head_dim=128, ulysses=2) == 4 * 40 * 128 * 2
    # u = 16 > 8 KV heads: each member gets one replicated KV head of 16
    assert a2a_bytes_per_token(heads=32, kv_heads=8, head_dim=128, ulysses=16) == 4 * 48 * 256


@pytest.mark.parametrize("heads,kv,u", [(32, 8, 2), (32, 8, 8), (32, 8, 32), (12, 2, 4), (4, 4, 2)])
def test_the_planner_charges_the_bytes_the_transport_sends(heads, kv, u):
    """fcp_exec.transport_bytes is checked against bytes counted on the real all-to-all and
    ring calls (tests/exec/test_ulysses.py); the planner's terms must equal it."""
    from fcp_data.planner.cost.model import ring_bytes_per_token
    from fcp_exec.transport_bytes import a2a_bytes_per_token as sent_a2a
    from fcp_exec.transport_bytes import hybrid_ring_bytes_per_token as sent_ring

    planned = a2a_bytes_per_token(heads=heads, kv_heads=kv, head_dim=64, ulysses=u, layers=3)
    assert (u - 1) / u * planned == pytest.approx(
        sent_a2a(heads=heads, kv_heads=kv, head_dim=64, ulysses=u, layers=3)
    )
    r, d = 3, 3 * u
    # per local token the ring sends (r - 1) x share x alpha3 x d / r (its r-shard of u d/d)
    alpha3 = ring_bytes_per_token(kv_heads=kv, head_dim=64, layers=3)
    assert (r - 1) / r * ring_share(kv, u) * alpha3 * d == pytest.approx(
        sent_ring(kv_heads=kv, head_dim=64, ulysses=u, ring_degree=r, layers=3)
    )


def test_preset_terms_per_tensor_parallel_rank():
    one = CostModel.from_model("qwen3-8b", "h200", head_parallel=True)
    tp4 = CostModel.from_model("qwen3-8b", "h200", tensor_parallel=4, head_parallel=True)
    assert one.head_parallel == (2, 4, 8, 16, 32)
    assert tp4.head_parallel == (2, 4, 8)  # 8 query and 2 KV heads per TP rank
    # 2 KV heads per rank: u = 4 and 8 replicate them, each member still rings one KV head
    assert tp4.ring_shares == (0.5, 0.5, 0.5)
    assert CostModel.from_model("qwen3-8b", "h200").head_parallel == ()


def test_kernel_scorer_and_cost_model_agree(hybrid):
    rng = np.random.default_rng(0)
    cluster = Cluster(32, tokens_per_replica=1 << 16, replicas_per_node=8)
    prob = Problem.build(rng.integers(100, 60000, 64), cluster, hybrid)
    chose = 0
    for i in range(prob.lens.size):
        for d in (2, 3, 4, 6, 8, 12, 16, 32):
            # windows aligned to nodes: the kernel's block rule is then exact
            start = 0 if d > 8 else 8 - d if d < 8 else 0
            inter = start // 8 != (start + d - 1) // 8
            want, u = hybrid.transport_from_aggregates(
                prob.att[i],
                prob.lin[i],
                prob.comm[i],
                d,
                inter_node=inter,
                blocks_inter_node=lambda k, s=start, n=d: blocks_span_nodes(range(s, s + n), k, 8),
            )
            got = group_time(
                prob.att[i], prob.lin[i], prob.comm[i], d, inter, 1.0, prob.cost_params
            )
            times, us = prob.window_transports(
                prob.att[i : i + 1], prob.lin[i : i + 1], prob.comm[i : i + 1],
                np.array([start]), np.array([d]),
            )  # fmt: skip
            assert got == pytest.approx(want, rel=1e-12)
            assert times[0] == pytest.approx(want, rel=1e-12) and us[0] == u
            assert u == 1 or (d % u == 0 and u in hybrid.head_parallel)
            chose += u > 1
    assert chose > 10, "the fixture must exercise the hybrid, not only the ring"


def test_a_block_that_spans_nodes_pays_the_inter_node_link(hybrid):
    prob = Problem.build([2000], Cluster(16, tokens_per_replica=4096, replicas_per_node=8), hybrid)
    one = (prob.att[:1], prob.lin[:1], prob.comm[:1])
    # d = 4 starting at replica 6: blocks of u = 2 are {6, 7} and {8, 9}: inside nodes
    t_aligned, u_aligned = prob.window_transports(*one, np.array([6]), np.array([4]))
    # starting at 7, blocks {7, 8} and {9, 10}: the first spans two nodes
    t_cross, _ = prob.window_transports(*one, np.array([7]), np.array([4]))
    assert blocks_span_nodes([7, 8, 9, 10], 2, 8) and not blocks_span_nodes([6, 7, 8, 9], 2, 8)
    assert u_aligned[0] > 1
    assert t_cross[0] > t_aligned[0]


def test_plan_records_the_transport_and_score_plan_prices_it(hybrid):
    lens = np.array([3000] * 8 + [1500] * 8)
    cluster = Cluster(8, tokens_per_replica=1024, replicas_per_node=8)  # 3000 needs d >= 3
    plan = plan_global_batch(lens, cluster, hybrid)
    us = [g.ulysses for g in plan.groups]
    assert any(u > 1 for u in us), us
    for g in plan.groups:
        assert g.degree % g.ulysses == 0 and g.ring_degree * g.ulysses == g.degree
        rp = plan.for_replica(
            g.replicas[0], next(i for i, w in enumerate(plan.waves) if g in w.groups)
        )
        assert rp.ulysses == g.ulysses and rp.ring_degree == g.ring_degree
    score = score_plan(plan, lens, cluster, hybrid)
    assert score.makespan == pytest.approx(plan.predicted_time, rel=1e-9)
    ring = plan_global_batch(
        lens, cluster, dataclasses.replace(hybrid, head_parallel=(), a2a_bytes=(), ring_shares=())
    )
    assert plan.predicted_time < ring.predicted_time
    assert plan.digest != ring.digest  # the transport is part of what members agree on
    # the same plan under a ring-only model cannot be priced: its transports do not exist there
    ring_only = dataclasses.replace(hybrid, head_parallel=(), a2a_bytes=(), ring_shares=())
    with pytest.raises(ValueError, match="head-parallel degrees"):
        score_plan(plan, lens, cluster, ring_only)


def test_ring_only_plans_are_unchanged_by_the_transport_fields():
    lens = np.array([9000, 4000, 3000, 700, 600, 20])
    cluster = Cluster(6, tokens_per_replica=4096, replicas_per_node=3)
    base = CostModel.from_model("qwen3-8b", "h200")
    plan = plan_global_batch(lens, cluster, base)
    assert all(g.ulysses == 1 for g in plan.groups)
    # transports that never pay (an all-to-all of huge latency) leave the plan bit-identical
    costly = dataclasses.replace(
        CostModel.from_model("qwen3-8b", "h200", head_parallel=True), beta3=1e3
    )
    same = plan_global_batch(lens, cluster, costly)
    assert same.digest == plan.digest and same.predicted_time == plan.predicted_time


@pytest.mark.parametrize(
    "lens,n,rpn,cap",
    [([3000], 4, 4, 1024), ([3000, 200], 4, 2, 1024), ([2500, 2500], 4, 4, 700)],
)
def test_bound_holds_where_the_hybrid_is_optimal(lens, n, rpn, cap, hybrid):
    """One sequence that must run wide on slow links: the optimum is a hybrid's time, so a
    bound that knew only the ring would exceed it."""
    lens = np.array(lens)
    cluster = Cluster(n, replicas_per_node=rpn, tokens_per_replica=cap)
    opt = exhaustive_optimum(lens, cluster, hybrid)
    plan = plan_global_batch(lens, cluster, hybrid)
    assert any(g.ulysses > 1 for g in plan.groups)
    assert plan.lower_bound <= opt * (1 + 1e-9) <= plan.predicted_time * (1 + 2e-9)


@settings(max_examples=40, deadline=None)
@given(
    lens=st.lists(st.integers(50, 6000), min_size=1, max_size=4),
    n=st.integers(2, 4),
    rpn=st.integers(1, 4),
    cap=st.sampled_from([1024, 4096]),
)
def test_bound_and_plan_bracket_the_exhaustive_optimum_with_transports(lens, n, rpn, cap, hybrid):
    lens = np.array(lens)
    cluster = Cluster(n, replicas_per_node=min(rpn, n), tokens_per_replica=cap)
    if np.any(lens > n * cap - 2 * n):
        return
    opt = exhaustive_optimum(lens, cluster, hybrid)
    plan = plan_global_batch(lens, cluster, hybrid)
    assert plan.lower_bound <= opt * (1 + 1e-9)
    assert plan.predicted_time >= opt * (1 - 1e-9)
    assert score_plan(plan, lens, cluster, hybrid).makespan == pytest.approx(
        plan.predicted_time, rel=1e-9
    )


@settings(max_examples=25, deadline=None)
@given(problems())
def test_every_group_runs_a_transport_its_heads_allow(prob):
    lens, causal, (n, rpn, cap, speed), cost = prob
    cost = _slow_links(dataclasses.replace(cost, **_terms(cost)))
    cluster = Cluster(n, replicas_per_node=rpn, tokens_per_replica=cap, speed=speed)
    plan = plan_global_batch(lens, cluster, cost, causal=causal, on_too_long="drop")
    for g in plan.groups:
        assert g.ulysses == 1 or (g.degree % g.ulysses == 0 and g.ulysses in cost.head_parallel)
    placed = sorted(plan.sequence_ids() + list(plan.dropped))
    assert placed == list(range(lens.size))
    assert plan.predicted_time >= plan.lower_bound * (1 - 1e-9)


def _terms(cost: CostModel) -> dict:
    name = cost.name.split("@")[0]
    device = cost.name.split("@")[1].split(" ")[0]
    full = CostModel.from_model(name, device, head_parallel=True)
    return {f: getattr(full, f) for f in ("head_parallel", "a2a_bytes", "ring_shares", "beta3")}


@pytest.mark.parametrize(
    "fields,match",
    [
        ({"head_parallel": (2,), "a2a_bytes": (), "ring_shares": ()}, "one entry per"),
        ({"head_parallel": (1,), "a2a_bytes": (1.0,), "ring_shares": (1.0,)}, "u >= 2"),
        ({"head_parallel": (2, 2), "a2a_bytes": (1.0, 1.0), "ring_shares": (1, 1)}, "distinct"),
        ({"head_parallel": (2,), "a2a_bytes": (float("nan"),), "ring_shares": (1,)}, "finite"),
        ({"head_parallel": (2,), "a2a_bytes": (1.0,), "ring_shares": (-1,)}, ">= 0"),
        (
            {"head_parallel": (2,), "a2a_bytes": (1.0,), "ring_shares": (1,), "alpha3": 0.0},
            "alpha3",
        ),
        ({"head_parallel": 2}, "must be a tuple"),
    ],
)
def test_bad_transport_fields_are_named(fields, match):
    base = {"alpha1": 1e-9, "alpha2": 1e-6, "alpha3": 1e5}
    with pytest.raises(ConfigError, match=match):
        CostModel(**{**base, **fields})


def test_transport_fields_survive_save_and_load(tmp_path):
    cost = CostModel.from_model("qwen3-8b", "h200", head_parallel=True)
    cost.save(tmp_path / "c.json")
    back = CostModel.load(tmp_path / "c.json")
    assert back == cost and isinstance(back.head_parallel, tuple)


def test_the_viewer_draws_each_groups_transport(hybrid):
    from fcp_data.viewer.bars import timeline
    from fcp_data.viewer.gantt import label_for

    lens = np.array([3000] * 8 + [1500] * 8)
    cluster = Cluster(8, tokens_per_replica=1024, replicas_per_node=8)
    plan = plan_global_batch(lens, cluster, hybrid)
    bars, _ = timeline(plan, lens, cluster, hybrid, np.ones(lens.size, bool))
    assert [b.ulysses for b in bars] == [g.ulysses for w in plan.waves for g in w.groups]
    assert max(b.end for b in bars) == pytest.approx(plan.predicted_time, rel=1e-9)
    wide = next(b for b in bars if b.ulysses > 1)
    assert wide.transport == f"{wide.ulysses}×{wide.degree // wide.ulysses}"
    assert wide.transport in label_for(wide, 1e4, 1e3)


@settings(max_examples=20, deadline=None)
@given(problems())
def test_transports_never_make_a_plan_slower(prob):
    lens, causal, (n, rpn, cap, speed), cost = prob
    hybrid = _slow_links(dataclasses.replace(cost, **_terms(cost)), factor=20.0)
    ring = dataclasses.replace(hybrid, head_parallel=(), a2a_bytes=(), ring_shares=())
    cluster = Cluster(n, replicas_per_node=rpn, tokens_per_replica=cap, speed=speed)
    with_t = plan_global_batch(lens, cluster, hybrid, causal=causal, on_too_long="drop")
    without = plan_global_batch(lens, cluster, ring, causal=causal, on_too_long="drop")
    assert with_t.predicted_time <= without.predicted_time * (1 + 1e-12)
