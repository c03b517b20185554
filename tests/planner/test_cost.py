import math

import numpy as np
import pytest

from fcp_data.planner import DEVICES, MODELS, Cluster, CostModel, padded_length


def simple_cost(**kw) -> CostModel:
    base = dict(
        alpha1=1e-9,
        alpha2=1e-5,
        alpha3=100.0,
        beta1=1e-3,
        beta2=1e-4,
        intra_node_bandwidth=1e9,
        inter_node_bandwidth=1e8,
    )
    base.update(kw)
    return CostModel(**base)


def test_group_time_matches_the_formula_by_hand():
    c = simple_cost()
    s = [1000, 3000]
    att = 1e-9 * (1000**2 + 3000**2)
    lin = 1e-5 * 4000
    comm_bytes = 100.0 * 4000
    # d = 1: no communication at all
    assert c.group_time(s, 1) == pytest.approx(att + lin + 1e-3, rel=1e-12)
    # d = 4 intra-node: comm overlaps attention, T = L + max(A, C) + beta1
    a, l_ = att / 4, lin / 4
    comm = 3 / 4 * comm_bytes / 1e9 + 1e-4 * 3
    assert c.group_time(s, 4) == pytest.approx(l_ + max(a, comm) + 1e-3, rel=1e-12)
    # inter-node uses the slower link, so communication now dominates
    comm_inter = 3 / 4 * comm_bytes / 1e8 + 1e-4 * 3
    assert comm_inter > a
    assert c.group_time(s, 4, inter_node=True) == pytest.approx(l_ + comm_inter + 1e-3, rel=1e-12)


def test_full_attention_doubles_attention_and_speed_scales_compute_only():
    c = simple_cost(alpha2=0.0, beta1=0.0, alpha3=0.0, beta2=0.0)
    assert c.group_time([1000], 1, causal=False) == pytest.approx(2 * c.group_time([1000], 1))
    slow = c.group_time([1000], 2, speed=0.5)
    assert slow == pytest.approx(2 * c.group_time([1000], 2))
    mixed = c.group_time([1000, 1000], 1, causal=[True, False])
    assert mixed == pytest.approx(3e-9 * 1000**2)


def test_padded_length_and_min_degree_count_zigzag_padding():
    assert padded_length(21, 1) == 22  # even at d = 1: the collator's padded THD offsets
    assert padded_length(21, 2) == 24
    assert padded_length(21, 3) == 24
    c = simple_cost()
    cl = Cluster(8, tokens_per_replica=10)
    assert c.min_degree([19], cl) == 2  # 20 padded / 2 = 10
    assert c.min_degree([20], cl) == 2
    assert c.min_degree([21], cl) == 3  # 24 / 2 = 12 > 10, 24 / 3 = 8
    assert c.min_degree([4, 6], cl) == 1
    assert c.min_degree([5, 5], cl) == 2  # 6 + 6 at d = 1 (what the collator allocates) > 10
    with pytest.raises(ValueError, match="do not fit on all 8 replicas"):
        c.min_degree([81], cl)


def test_capacity_from_memory_bytes():
    c = simple_cost(bytes_per_token=1000.0, static_bytes=1e6)
    cl = Cluster(4, memory_bytes=2e6)
    assert c.capacity_tokens(cl) == 1000
    with pytest.raises(ValueError, match="leaves no room"):
        c.capacity_tokens(Cluster(4, memory_bytes=5e5))


@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("device", sorted(DEVICES))
def test_presets_give_sane_coefficients(model, device):
    c = CostModel.from_model(model, device)
    assert c.alpha1 > 0 and c.alpha2 > 0 and c.alpha3 > 0 and c.bytes_per_token > 0
    # a 128K causal sequence costs more in attention than in the linear layers for 1-8B models
    assert c.alpha1 * 131072**2 > c.alpha2 * 131072


def test_preset_numbers_for_qwen3_8b_on_h200():
    c = CostModel.from_model("qwen3-8b", "h200")
    # 8K tokens of Qwen3-8B on one H200: tens to hundreds of milliseconds, not seconds
    t = c.group_time([8192], 1)
    assert 0.2 < t < 2.0
    assert c.from_model("qwen3-8b", "h200", beta1=0.5).beta1 == 0.5
    with pytest.raises(ValueError, match="unknown model 'gpt5'"):
        CostModel.from_model("gpt5", "h200")


def test_save_load_round_trip_and_bad_files(tmp_path):
    c = CostModel.from_model("llama3-8b", "a100-80gb")
    p = tmp_path / "cost.json"
    c.save(p)
    assert CostModel.load(p) == c
    p.write_text('{"alpha1": 1e-9, "alpha2": 1e-5, "gamma": 3}')
    with pytest.raises(ValueError, match="unknown cost-model fields"):
        CostModel.load(p)


@pytest.mark.parametrize("field", ["alpha1", "alpha3", "beta1", "bytes_per_token"])
@pytest.mark.parametrize("bad", [float("nan"), -1.0, math.inf])
def test_bad_coefficients_are_named(field, bad):
    with pytest.raises(ValueError, match=f"CostModel.{field}="):
        simple_cost(**{field: bad})


def test_cluster_validation():
    with pytest.raises(ValueError, match="num_replicas=0"):
        Cluster(0, tokens_per_replica=10)
    with pytest.raises(ValueError, match="exactly one of"):
        Cluster(4)
    with pytest.raises(ValueError, match="exactly one of"):
        Cluster(4, tokens_per_replica=10, memory_bytes=1e9)
    with pytest.raises(ValueError, match="speed has 3 factors but num_replicas=4"):
        Cluster(4, tokens_per_replica=10, speed=[1, 1, 1])
    with pytest.raises(ValueError, match="positive and finite"):
        Cluster(2, tokens_per_replica=10, speed=[1, -1])
    cl = Cluster(10, replicas_per_node=4, tokens_per_replica=10, speed=np.ones(10))
    assert cl.speed is None and cl.num_nodes == 3 and cl.node_of(9) == 2
    assert cl.spans_nodes((3, 4)) and not cl.spans_nodes((4, 5))
