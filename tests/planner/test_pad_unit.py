"""The planner's memory check counts the pad unit of sequence parallel (TP under SP).

A group of degree d fits iff Σ_k shard_tokens(s_k, d, unit) <= tokens_per_replica: exactly the
rows the collator allocates, so a plan never holds more than the replica can.
"""

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fcp_data.errors import ConfigError
from fcp_data.layout import shard_tokens
from fcp_data.planner import Cluster, CostModel, generate_lengths, plan_global_batch
from fcp_data.planner.bounds import lower_bound
from fcp_data.planner.cost.problem import Problem
from fcp_data.planner.oracle import exhaustive_optimum
from fcp_data.planner.simulate import check_plan

STRATS = ["fcp", "paper", "lanes", "moldable", "static-balanced", "pow2", "static"]
COST = CostModel.from_model("llama3.2-1b", "h200")


def cluster(n: int, cap: int, unit: int, rpn: int | None = None, **kw) -> Cluster:
    """unit 1: no sequence parallel (TP = 2 without SP pads nothing); else TP = unit with SP.
    rpn None: every replica on one node."""
    rpn = n if rpn is None else rpn
    if unit == 1:
        return Cluster(n, replicas_per_node=rpn, tokens_per_replica=cap, tensor_parallel=2, **kw)
    return Cluster(
        n,
        replicas_per_node=rpn,
        tokens_per_replica=cap,
        tensor_parallel=unit,
        sequence_parallel=True,
        **kw,
    )


def assert_fits(plan, lens: np.ndarray, cl: Cluster) -> None:
    seen = np.zeros(lens.size, np.int64)
    for g in plan.groups:
        ids = np.asarray(g.sequence_ids, np.int64)
        held = int(np.sum(shard_tokens(lens[ids], g.degree, cl.pad_unit)))
        assert held <= cl.tokens_per_replica, (g, held)
        assert held % (2 * cl.pad_unit) == 0  # a packed row is a multiple of TP under SP
        np.add.at(seen, ids, 1)
    np.add.at(seen, np.asarray(plan.dropped, np.int64), 1)
    assert np.all(seen == 1)


@st.composite
def problems(draw):
    unit = draw(st.sampled_from([1, 2, 4, 8]))
    n = draw(st.integers(1, 12))
    rpn = draw(st.integers(1, n))
    cap = draw(st.sampled_from([48, 100, 513, 2048, 8191]))
    k = draw(st.integers(1, 30))
    lens = draw(st.lists(st.integers(1, max(1, cap * n // 2)), min_size=k, max_size=k))
    speed = None
    if draw(st.booleans()):
        speed = draw(st.lists(st.sampled_from([0.5, 1.0, 1.3]), min_size=n, max_size=n))
    return np.array(lens), cluster(n, cap, unit, rpn, speed=speed)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(), st.sampled_from(STRATS))
def test_every_group_fits_with_the_pad_unit(prob, strategy):
    lens, cl = prob
    try:
        plan = plan_global_batch(lens, cl, COST, strategy=strategy, on_too_long="drop")
    except ValueError as exc:
        assert strategy in ("static", "pow2"), exc
        return
    assert_fits(plan, lens, cl)
    check_plan(plan, lens, cl, COST)
    # exactly the sequences no degree can hold are dropped
    prob_ = Problem.build(lens, cl, COST, pow2=strategy == "pow2")
    assert set(plan.dropped) == set(np.flatnonzero(prob_.dmin == 0).tolist())
    for i in np.flatnonzero(prob_.dmin > 0):
        d = int(prob_.dmin[i])
        assert shard_tokens(int(lens[i]), d, cl.pad_unit) <= cl.tokens_per_replica
        if strategy != "pow2" and d > 1:
            assert shard_tokens(int(lens[i]), d - 1, cl.pad_unit) > cl.tokens_per_replica


def test_unit_one_plans_are_bit_identical_to_a_cluster_without_layout():
    lens = generate_lengths("github", 96, seed=4)
    plain = Cluster(16, replicas_per_node=8, tokens_per_replica=8191)
    tp = Cluster(16, replicas_per_node=8, tokens_per_replica=8191, tensor_parallel=8)
    assert tp.pad_unit == 1
    for strategy in ("fcp", "static", "megatron-hybrid"):
        a = plan_global_batch(lens, plain, COST, strategy=strategy, on_too_long="drop")
        b = plan_global_batch(lens, tp, COST, strategy=strategy, on_too_long="drop")
        assert a.digest == b.digest and a.predicted_time == b.predicted_time


def test_sequence_parallel_padding_raises_the_degree_where_it_must():
    # 1000 tokens in 520 per replica: d = 2 holds 500 (unit 1) but 512 at TP = 8 under SP...
    one, sp = cluster(8, 520, 1), cluster(8, 520, 8)
    assert COST.min_degree([1000], one) == 2 and COST.min_degree([1000], sp) == 2
    # ...and 1040 tokens: 520 each at unit 1, 528 (> 520) at unit 8, so d = 3 (352)
    assert COST.min_degree([1040], one) == 2 and COST.min_degree([1040], sp) == 3
    assert COST.shard_tokens([1040], 2, sp) == 528 and not COST.fits([1040], 2, sp)
    assert COST.fits([1040], 3, sp) and COST.fits([1040], 2, one)
    for strategy in ("fcp", "megatron-hybrid", "static"):
        plan = plan_global_batch([1040, 30, 30], sp, COST, strategy=strategy)
        assert_fits(plan, np.array([1040, 30, 30]), sp)
        assert plan.groups[0].degree >= 3 or 0 not in plan.groups[0].sequence_ids


def test_check_plan_counts_the_pad_unit():
    lens = np.array([1040, 16])
    one, sp = cluster(4, 520, 1), cluster(4, 520, 8)
    plan = plan_global_batch(lens, one, COST, strategy="static")  # d = 2 or 4 at unit 1
    if plan.groups[0].degree == 2 and 0 in plan.groups[0].sequence_ids:
        with pytest.raises(ValueError, match="tokens per replica > 520"):
            check_plan(plan, lens, sp, COST)
    # a hand-made d = 2 group of 1040 tokens: fine at unit 1, 528 > 520 at unit 8
    g = plan.groups[0]
    two = msgspec.structs.replace(g, replicas=(0, 1), degree=2, sequence_ids=(0,), seqlens=(1040,))
    rest = msgspec.structs.replace(g, replicas=(2,), degree=1, sequence_ids=(1,), seqlens=(16,))
    w = msgspec.structs.replace(plan.waves[0], groups=(two, rest))
    hand = msgspec.structs.replace(plan, waves=(w,), dropped=())
    check_plan(hand, lens, one, COST)
    with pytest.raises(ValueError, match="holds 528 tokens per replica > 520"):
        check_plan(hand, lens, sp, COST)


def test_bound_and_oracle_use_the_pad_unit():
    lens = np.array([1040, 300, 200])
    sp = cluster(3, 520, 8)
    plan = plan_global_batch(lens, sp, COST)
    prob = Problem.build(lens, sp, COST)
    assert plan.predicted_time >= lower_bound(prob) * (1 - 1e-12)
    opt = exhaustive_optimum(lens, sp, COST)
    assert plan.predicted_time >= opt * (1 - 1e-9)
    assert opt > exhaustive_optimum(lens, cluster(3, 520, 1), COST)  # d = 2 no longer holds it


def test_replicas_per_node_follow_the_layout_in_one_rule() -> None:
    """Cluster(..., tensor_parallel=T, pipeline_parallel=P) derives replicas per node from the
    devices per node as from_budget and the CLI do, refuses to guess without it, and refuses a
    contradiction (was: 8 replicas of TP = 8 priced as one node)."""
    assert Cluster(8, tokens_per_replica=64, tensor_parallel=8, devices_per_node=8)\
        .replicas_per_node == 1  # fmt: skip
    assert Cluster(16, tokens_per_replica=64, tensor_parallel=2, pipeline_parallel=2,
                   devices_per_node=8).replicas_per_node == 2  # fmt: skip
    assert Cluster(8, tokens_per_replica=64).replicas_per_node == 8  # one device each: one node
    with pytest.raises(ConfigError, match=r"TP x PP = 8 x 1 = 8 devices.*devices_per_node="):
        Cluster(8, tokens_per_replica=64, tensor_parallel=8)
    with pytest.raises(ConfigError, match="replicas_per_node=4 contradicts devices_per_node=8"):
        Cluster(8, tokens_per_replica=64, tensor_parallel=8, devices_per_node=8,
                replicas_per_node=4)  # fmt: skip
    cl = Cluster(8, tokens_per_replica=64, tensor_parallel=8, devices_per_node=8)
    assert cl.spans_nodes((0, 1)) and not Cluster(8, tokens_per_replica=64).spans_nodes((0, 1))
