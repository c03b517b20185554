"""Bad input: a clear error naming the value and the limit, or a counted drop."""

import math

import numpy as np
import pytest

from fcp_data.planner import Cluster, generate_lengths, plan_global_batch
from fcp_data.planner.simulate import check_plan


@pytest.fixture
def cl():
    return Cluster(4, replicas_per_node=4, tokens_per_replica=1000)


def test_empty_batch(cl, qwen8b):
    with pytest.raises(ValueError, match="seqlens is empty"):
        plan_global_batch([], cl, qwen8b)


@pytest.mark.parametrize("bad", [[10, 0, 5], [10, -3]])
def test_non_positive_lengths(cl, qwen8b, bad):
    with pytest.raises(ValueError, match=r"sequence ids \[\d\] have \[-?\d+\]"):
        plan_global_batch(bad, cl, qwen8b)


@pytest.mark.parametrize("bad", [[10.5, 3], [math.nan, 3], [math.inf]])
def test_non_integer_lengths(cl, qwen8b, bad):
    with pytest.raises(ValueError, match="whole token counts"):
        plan_global_batch(bad, cl, qwen8b)


def test_two_dimensional_lengths(cl, qwen8b):
    with pytest.raises(ValueError, match="one-dimensional"):
        plan_global_batch(np.ones((2, 2), int), cl, qwen8b)


def test_causal_of_wrong_length(cl, qwen8b):
    with pytest.raises(ValueError, match="causal has 2 flags for 3 sequences"):
        plan_global_batch([1, 2, 3], cl, qwen8b, causal=[True, False])


def test_too_long_raises_or_is_dropped_and_counted(cl, qwen8b):
    lens = [100, 5000, 300, 4001]
    with pytest.raises(
        ValueError, match=r"2 sequence\(s\) cannot fit even on all 4 replicas of 1000 tokens"
    ):
        plan_global_batch(lens, cl, qwen8b)
    plan = plan_global_batch(lens, cl, qwen8b, on_too_long="drop")
    assert plan.dropped == (1, 3)
    assert sorted(plan.sequence_ids()) == [0, 2]
    check_plan(plan, lens, cl, qwen8b)
    empty = plan_global_batch([5000, 4500], cl, qwen8b, on_too_long="drop")
    assert empty.dropped == (0, 1) and empty.num_waves == 1 and not empty.groups
    assert all(empty.for_replica(r, 0).is_empty for r in range(4))  # every replica sits it out
    with pytest.raises(ValueError, match="on_too_long='truncate' is not one of"):
        plan_global_batch(lens, cl, qwen8b, on_too_long="truncate")


def test_pow2_names_its_limit(qwen8b):
    cl = Cluster(6, tokens_per_replica=1000)
    # 5000 tokens need 5 replicas; the next power of two (8) exceeds N = 6
    with pytest.raises(ValueError, match="at power-of-two degrees"):
        plan_global_batch([5000, 10], cl, qwen8b, strategy="pow2")
    assert plan_global_batch([5000, 10], cl, qwen8b).degrees[0] >= 5


def test_unknown_strategy_and_wrong_types(cl, qwen8b):
    with pytest.raises(ValueError, match="strategy='best' is not one of"):
        plan_global_batch([1], cl, qwen8b, strategy="best")
    with pytest.raises(TypeError, match="cluster must be"):
        plan_global_batch([1], 4, qwen8b)
    with pytest.raises(TypeError, match="cost must be"):
        plan_global_batch([1], cl, None)


def test_static_uses_a_degree_dividing_n(qwen8b):
    cl = Cluster(6, tokens_per_replica=1000)
    plan = plan_global_batch([3500, 10], cl, qwen8b, strategy="static")  # needs 4: 6 divides 6
    assert set(plan.degrees) == {6}


def test_check_plan_catches_broken_plans(qwen8b):
    import msgspec

    cl = Cluster(8, replicas_per_node=4, tokens_per_replica=8192)
    lens = generate_lengths("c4", 40, seed=2)
    plan = plan_global_batch(lens, cl, qwen8b)
    check_plan(plan, lens, cl, qwen8b)
    w0 = plan.waves[0]
    g0 = w0.groups[0]
    dup = msgspec.structs.replace(
        g0,
        sequence_ids=(*g0.sequence_ids, g0.sequence_ids[0]),
        seqlens=(*g0.seqlens, g0.seqlens[0]),
    )
    bad = msgspec.structs.replace(
        plan, waves=(msgspec.structs.replace(w0, groups=(dup, *w0.groups[1:])), *plan.waves[1:])
    )
    with pytest.raises(ValueError, match="placed"):
        check_plan(bad, lens, cl, qwen8b)
    tight = Cluster(8, replicas_per_node=4, tokens_per_replica=64)
    with pytest.raises(ValueError, match="tokens per replica"):
        check_plan(plan, lens, tight, qwen8b)


def test_mixed_hardware_is_planned_not_averaged(qwen8b):
    """Half the replicas at half speed: fcp must keep long work off the slow ones."""
    lens = generate_lengths("github", 128, seed=5)
    fast = Cluster(16, replicas_per_node=8, tokens_per_replica=16384)
    mixed = Cluster(16, replicas_per_node=8, tokens_per_replica=16384, speed=[1.0] * 8 + [0.5] * 8)
    plan = plan_global_batch(lens, mixed, qwen8b)
    check_plan(plan, lens, mixed, qwen8b)
    busy = np.zeros(16)
    for g in plan.groups:
        busy[list(g.replicas)] += g.predicted_time
    # everyone finishes near the same time, so slow replicas carry less work than fast ones
    work_fast = sum(g.num_tokens for g in plan.groups if max(g.replicas) < 8)
    work_slow = sum(g.num_tokens for g in plan.groups if min(g.replicas) >= 8)
    assert work_slow < 0.8 * work_fast
    static = plan_global_batch(lens, mixed, qwen8b, strategy="static")
    assert plan.predicted_time < static.predicted_time
    assert plan.predicted_time > plan_global_batch(lens, fast, qwen8b).predicted_time
