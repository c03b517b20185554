"""megatron-dynamic: Megatron-LM dev's DefaultDynamicCPScheduler as a baseline.

The small cases are worked by hand from their code (megatron/core/datasets/
data_schedule_utils.py: next_hdp_group_packing_aware, fill_empty_gpus_once,
fill_with_full_dpxcp_group, dcp_gpus_needed) with knob = capacity = 100 tokens and pad unit 1,
so a member holds shard_tokens(L, c) = 2·ceil(L / 2c) tokens and their workload is L² / c.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from planner_problems import problems as shared_problems

from fcp_data.planner import Cluster, plan_global_batch, score_plan
from fcp_data.planner.cost.problem import Problem
from fcp_data.planner.simulate import check_plan
from fcp_data.planner.strategies.megatron_dynamic import (
    KNOB_GRID,
    busy_bound,
    megatron_dynamic,
    megatron_dynamic_tuned,
)


def _groups(lens, n, cost, knob=None):
    prob = Problem.build(
        np.array(lens), Cluster(n, replicas_per_node=n, tokens_per_replica=100), cost
    )
    sch = megatron_dynamic(prob, knob=knob)
    assert sch is not None
    out = [
        (int(s), int(d), sorted(m.tolist())) for s, d, m in zip(sch.starts, sch.degs, sch.members())
    ]
    return out, sch, prob


def test_pack_then_fill_widens_the_smallest_groups_first(qwen8b):
    # N = 4, lengths 100, 60, 30, 10 (ids 0-3); cap on workload: tall · knob · 1.05 = 10500.
    # 100 opens group A on rank 0 (workload 10000, 100 tokens: full). 60: A has no room; a new
    # group on rank 1 projects max(3600, 10000) = 10000 <= 10500, nothing projects lower.
    # 30 and 10 join that group (60 + 30 + 10 = 100 tokens, busiest rank still 10000).
    # Ranks 2, 3 are empty: fill widens the first group of the smallest size (A, 1 -> 2)
    # and shifts B to rank 2, then widens B (1 -> 2): A on 0-1, B on 2-3, one micro-batch.
    groups, sch, _ = _groups([100, 60, 30, 10], 4, qwen8b)
    assert groups == [(0, 2, [0]), (2, 2, [1, 2, 3])]
    assert sch.name == "megatron-dynamic"


def test_a_sequence_without_room_waits_for_the_next_micro_batch(qwen8b):
    # N = 2, three sequences of 100 tokens (a full rank each). Micro-batch 1: id 0 on rank 0,
    # id 1 on a new group on rank 1 (projects 10000 = the busiest, within 10500); id 2 fits
    # neither group and no rank is free: it waits. Micro-batch 2: id 2 alone on rank 0, and
    # fill widens it onto the empty rank 1 (a group of 2).
    groups, _, _ = _groups([100, 100, 100], 2, qwen8b)
    assert groups == [(0, 1, [0]), (1, 1, [1]), (0, 2, [2])]


def test_a_wider_group_when_it_lowers_the_busiest_rank(qwen8b):
    # N = 4. 102 tokens need c = 2 (52 tokens each; 102 > 100 at c = 1): group A on ranks 0-1,
    # workload 102² / 2 = 5202, cap 102 · 100 · 1.05 = 10710. 100 at c = 1 would project
    # 10000; at c = 2, A has no room (52 + 50 > 100) but a new pair projects
    # max(5000, 5202) = 5202 < 10000: group B on ranks 2-3. No rank is left empty.
    groups, _, _ = _groups([102, 100], 4, qwen8b)
    assert groups == [(0, 2, [0]), (2, 2, [1])]


def test_full_group_fallback_when_fill_cannot_widen(qwen8b):
    # N = 7. 400 tokens need c = 4 (100 each): A on ranks 0-3, workload 40000, cap 42000.
    # 200 needs c = 2 (100 each): a new pair on ranks 4-5 projects max(20000, 40000) = 40000.
    # Rank 6 is empty; fill would widen the pair to 4 ranks but 5 + 2 >= 7, and A is not of
    # the smallest size, so fill_with_full_dpxcp_group runs both on all 7 ranks instead
    # (58 + 30 = 88 tokens each <= 100).
    groups, _, _ = _groups([400, 200], 7, qwen8b)
    assert groups == [(0, 7, [0, 1])]


def test_n_not_a_power_of_two(qwen8b):
    # N = 3, 250 tokens: their dcp_gpus_needed gives 4 > 3 ranks and asserts; here the
    # minimum is the full group of 3 (84 tokens each), the one non-power-of-two size their
    # scheduler ever forms.
    groups, _, _ = _groups([250], 3, qwen8b)
    assert groups == [(0, 3, [0])]
    # N = 3, four sequences of 100: three single-rank groups, the fourth waits; alone in
    # micro-batch 2 it is widened 1 -> 2, then 2 -> min(4, 3) = 3 ranks.
    groups, _, _ = _groups([100] * 4, 3, qwen8b)
    assert groups == [(0, 1, [0]), (1, 1, [1]), (2, 1, [2]), (0, 3, [3])]


def test_knob_below_capacity_and_tuned_grid(qwen8b):
    # knob 50: 100 tokens need c = 2 (50 each), so each sequence gets a pair.
    groups, _, prob = _groups([100, 100], 4, qwen8b, knob=50)
    assert groups == [(0, 2, [0]), (2, 2, [1])]
    with pytest.raises(ValueError, match="knob"):
        megatron_dynamic(prob, knob=101)
    tuned = megatron_dynamic_tuned(prob)
    assert 1 <= len(tuned) <= len(KNOB_GRID)
    assert len({s.name for s in tuned}) == len(tuned)
    # knob 12 (100 × 0.125) cannot hold 100 tokens on 4 ranks (26 each): that knob is skipped
    assert all(s.name != "megatron-dynamic(knob=12)" for s in tuned)


def test_busy_bound_is_below_the_score(qwen8b):
    _, sch, prob = _groups([400, 200, 90, 60, 60, 30, 10], 7, qwen8b)
    assert busy_bound(prob, sch.starts, sch.degs, sch.units, sch.unit_group) <= sch.makespan


@st.composite
def problems(draw):
    lens, causal, (n, rpn, cap, speed), cost = draw(shared_problems())
    tp = draw(st.sampled_from([1, 1, 2]))  # TP = 2 under sequence parallel: pad unit 2
    cluster = Cluster(
        n,
        replicas_per_node=rpn,
        tokens_per_replica=cap,
        speed=speed,
        tensor_parallel=tp,
        sequence_parallel=tp > 1,
    )
    return lens, causal, cluster, cost


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(), st.sampled_from(["megatron-dynamic", "megatron-dynamic-tuned"]))
def test_every_sequence_once_memory_kept_no_idle_rank(prob, strategy):
    lens, causal, cluster, cost = prob
    plan = plan_global_batch(lens, cluster, cost, causal=causal, strategy=strategy)
    check_plan(plan, lens, cluster, cost)  # each sequence exactly once, memory, disjoint
    sc = score_plan(plan, lens, cluster, cost, causal=causal)
    assert sc.makespan == pytest.approx(plan.predicted_time, rel=1e-9)
    assert sc.idle_slots == 0  # fill (or the full group) leaves no rank idle in any wave
    assert plan.lower_bound <= plan.predicted_time * (1 + 1e-9)
    for g in plan.groups:  # power-of-two degrees, or the full (non-power-of-two) group
        assert g.degree & (g.degree - 1) == 0 or g.degree == cluster.num_replicas
    if strategy == "megatron-dynamic-tuned":
        default = plan_global_batch(lens, cluster, cost, causal=causal, strategy="megatron-dynamic")
        assert plan.predicted_time <= default.predicted_time * (1 + 1e-12)
