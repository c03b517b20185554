"""The memory model (`fcp_data.planner.cost.memory`): each term, the worked examples, the errors,
and the replica's devices in the analytic cost model."""

import dataclasses

import pytest

from fcp_data.errors import ConfigError
from fcp_data.planner import MODELS, Cluster, CostModel
from fcp_data.planner.cost.estimate import pipeline_speedup
from fcp_data.planner.cost.memory import (
    MemoryBudget,
    ParallelLayout,
    derive_tokens_per_replica,
    replicas_per_node,
)

H200 = 141e9
L70 = "llama3-70b"


def budget(model: str = "qwen3-8b", n: int = 64, memory: float = H200, **layout) -> MemoryBudget:
    return derive_tokens_per_replica(model, ParallelLayout(**layout), memory, n)


def test_llama3_70b_preset_is_the_published_shape():
    m = MODELS[L70]
    assert (m.layers, m.hidden, m.ffn, m.heads, m.kv_heads, m.vocab) == (
        80,
        8192,
        28672,
        64,
        8,
        128256,
    )
    assert m.params == pytest.approx(70.55e9, rel=1e-3)
    c = CostModel.from_model(L70, "h200")
    assert c.alpha1 > 0 and c.alpha2 > 0


def test_worked_examples_are_pinned():
    """The numbers docs/memory.md quotes."""
    sp = budget(L70, 8, tensor_parallel=8, sequence_parallel=True)
    assert sp.model_state_bytes == pytest.approx(66.15e9, rel=1e-3)
    assert sp.activation_bytes_per_token == pytest.approx(2.815e6, rel=1e-3)
    assert sp.tokens_per_replica == 21568
    no_sp = budget(L70, 8, tensor_parallel=8)
    assert no_sp.model_state_bytes == sp.model_state_bytes
    assert no_sp.tokens_per_replica == 8174
    q = budget("qwen3-8b", 64)
    assert q.model_state_bytes == pytest.approx(50.7e9, rel=1e-3)
    assert q.activation_bytes_per_token == 36 * 137_344 + 2 * 2 * 4096 + 4 * 151936
    assert q.tokens_per_replica == 13686
    # counting activations only (no model states) would promise 2.1x the tokens
    assert sp.usable_bytes / sp.activation_bytes_per_token / sp.tokens_per_replica > 2.0


def test_plain_adam_without_sharding_is_16_to_18_bytes_per_parameter():
    p = MODELS["qwen3-8b"].params
    for fp32, per_param in ((True, 18), (False, 16)):
        with pytest.raises(ConfigError, match="model states take") as exc:
            budget(zero_stage=0, fp32_grads=fp32)
        assert f"{per_param * p:.4g}" in str(exc.value) and "1.41e+11 B memory" in str(exc.value)
    assert 128e9 < 16 * p < 18 * p < 148e9  # ~131-147 GB: no H200 holds it with activations


def test_zero_stages_divide_their_states_by_the_replicas():
    p = MODELS["qwen3-8b"].params
    z0 = budget(n=64, zero_stage=0, memory=1e12)
    z1 = budget(n=64, zero_stage=1)
    z1_8 = budget(n=8, zero_stage=1)
    z2 = budget(n=64, zero_stage=2)
    z3 = budget(n=64, zero_stage=3)
    assert z0.weight_bytes == 2 * p and z0.grad_bytes == 4 * p and z0.optimizer_bytes == 12 * p
    assert z1.optimizer_bytes == pytest.approx(12 * p / 64)  # ZeRO-1 over N divides Adam by N
    assert z1_8.optimizer_bytes == pytest.approx(8 * z1.optimizer_bytes)
    assert z1.grad_bytes == z0.grad_bytes and z1.weight_bytes == z0.weight_bytes
    assert z2.grad_bytes == pytest.approx(4 * p / 64) and z2.weight_bytes == 2 * p
    assert z3.weight_bytes == pytest.approx(2 * p / 64) and z3.gathered_bytes > 0
    assert z3.tokens_per_replica > z2.tokens_per_replica > z1.tokens_per_replica
    bf16 = budget(n=64, fp32_grads=False)
    assert bf16.grad_bytes == pytest.approx(z1.grad_bytes / 2)


def test_one_layer_is_the_sum_of_its_tensors():
    """Llama3-70B per layer and token: 8h replicated + (4 q_dim + 4 kv_dim + 4 heads + 6 ffn)."""
    h, q, kv, heads, ffn = 8192, 8192, 1024, 64, 28672
    replicated = 8 * h
    split = 4 * q + 4 * kv + 4 * heads + 6 * ffn
    assert replicated + split == 274_688  # 33.5 h; the paper's GPT shape gives 34 h
    one = budget(L70, 8, tensor_parallel=1, memory=1e13)
    assert one.layer_bytes_per_token == replicated + split
    tp = budget(L70, 8, tensor_parallel=8, memory=1e13)
    assert tp.layer_bytes_per_token == replicated + split / 8  # TP splits only its part
    sp = budget(L70, 8, tensor_parallel=8, sequence_parallel=True, memory=1e13)
    assert sp.layer_bytes_per_token == (replicated + split) / 8  # SP divides everything by TP
    head = 2 * 2 * h / 8 + 4 * 128256 / 8  # final norm + head inputs, fp32 logits
    assert sp.logits_bytes_per_token == 4 * 128256 / 8
    assert sp.activation_bytes_per_token == pytest.approx(80 * sp.layer_bytes_per_token + head)
    assert tp.params_per_device == pytest.approx(one.params_per_device / 8)
    # Qwen3's QK-norm keeps Q and K before the norm too: 2 (q_dim + kv_dim) more split bytes
    qwen = budget("qwen3-8b", 8, memory=1e13)
    assert qwen.layer_bytes_per_token == 8 * 4096 + (4 * 4096 + 4 * 1024 + 4 * 32 + 6 * 12288) + (
        2 * (4096 + 1024)
    )
    no_qk = dataclasses.replace(MODELS["qwen3-8b"], qk_norm=False)
    plain = derive_tokens_per_replica(no_qk, ParallelLayout(), 1e13, 8)
    assert qwen.layer_bytes_per_token - plain.layer_bytes_per_token == 2 * (4096 + 1024)


def test_recompute_full_keeps_layer_inputs_and_selective_equals_none():
    kw = dict(model=L70, n=8, tensor_parallel=8, sequence_parallel=True)
    none, sel, full = (budget(**kw, recompute=r) for r in ("none", "selective", "full"))
    assert none.activation_bytes_per_token == sel.activation_bytes_per_token
    head = 2 * 2 * 8192 / 8 + 4 * 128256 / 8
    want = 80 * 2 * 8192 / 8 + full.layer_bytes_per_token + head
    assert full.activation_bytes_per_token == pytest.approx(want)
    assert full.tokens_per_replica > 8 * sel.tokens_per_replica


def test_pipeline_first_stage_holds_pp_micro_batches():
    one = budget(L70, 4, tensor_parallel=8, sequence_parallel=True, memory=1e13)
    two = budget(L70, 4, tensor_parallel=8, sequence_parallel=True, pipeline_parallel=2)
    assert two.layers_per_device == 40 and two.stage == "first" and two.micro_batches == 2
    # 40 layers x 2 micro-batches: the same layer bytes per token as 80 layers x 1
    assert two.activation_bytes_per_token == pytest.approx(80 * one.layer_bytes_per_token)
    # half the layers and only the input embedding (the LM head is on the last stage)
    vh = 128256 * 8192 / 8
    assert two.params_per_device == pytest.approx((one.params_per_device - 2 * vh) / 2 + vh)
    # one micro-batch in flight: the last stage (LM head, logits) binds instead
    deep = budget(
        L70,
        4,
        tensor_parallel=8,
        pipeline_parallel=2,
        micro_batches_in_flight=1,
        sequence_parallel=True,
    )
    assert deep.stage == "last" and deep.logits_bytes_per_token == 4 * 128256 / 8
    assert deep.tokens_per_replica > two.tokens_per_replica
    with pytest.raises(ConfigError, match="does not divide the 80 layers"):
        budget(L70, 4, tensor_parallel=8, pipeline_parallel=3)


def test_reserve_is_a_fraction_or_bytes_and_tokens_are_whole_units():
    frac = budget(L70, 8, tensor_parallel=8, sequence_parallel=True, memory=H200)
    by = derive_tokens_per_replica(
        L70, ParallelLayout(tensor_parallel=8, sequence_parallel=True), H200, 8, reserve=14.1e9
    )
    assert by.tokens_per_replica == frac.tokens_per_replica
    assert frac.tokens_per_replica % 16 == 0  # 2 x pad unit (TP = 8 under SP)
    none = derive_tokens_per_replica(
        L70, ParallelLayout(tensor_parallel=8, sequence_parallel=True), H200, 8, reserve=0.0
    )
    assert none.tokens_per_replica > frac.tokens_per_replica
    for bad in (-0.1, float("nan"), 141e9):
        with pytest.raises(ConfigError, match="reserve"):
            derive_tokens_per_replica("qwen3-8b", ParallelLayout(), H200, 8, reserve=bad)


def test_bad_layouts_are_config_errors():
    with pytest.raises(ConfigError, match="does not divide the 8 KV heads"):
        budget(L70, 4, tensor_parallel=16)
    with pytest.raises(ConfigError, match="sequence_parallel=True needs tensor_parallel > 1"):
        ParallelLayout(sequence_parallel=True)
    with pytest.raises(ConfigError, match="zero_stage=4 is not one of"):
        ParallelLayout(zero_stage=4)
    with pytest.raises(ConfigError, match="recompute='some' is not one of"):
        ParallelLayout(recompute="some")
    with pytest.raises(ConfigError, match="not a preset"):
        budget("gpt-9")
    with pytest.raises(ConfigError, match="no room for one sequence"):
        budget(L70, 8, tensor_parallel=1)  # 70B on one device


def test_replicas_per_node_follow_tp_times_pp():
    assert replicas_per_node(8, 8) == 1
    assert replicas_per_node(8, 2) == 4
    assert replicas_per_node(8, 2, 2) == 2
    assert replicas_per_node(8, 8, 2) == 1  # a replica spans two nodes
    with pytest.raises(ConfigError, match="does not tile nodes of 8 devices"):
        replicas_per_node(8, 3)


def test_cluster_from_budget_carries_the_layout():
    b = budget(L70, 8, tensor_parallel=8, sequence_parallel=True)
    cl = Cluster.from_budget(b, devices_per_node=8)
    assert cl.tokens_per_replica == b.tokens_per_replica and cl.replicas_per_node == 1
    assert cl.pad_unit == 8 and cl.num_replicas == 8 and cl.num_nodes == 8
    with pytest.raises(ConfigError, match="contradicts devices_per_node=8"):
        Cluster.from_budget(b, devices_per_node=8, replicas_per_node=4)
    assert b.to_dict()["layout"]["tensor_parallel"] == 8
    assert "tokens_per_replica=21568" in b.summary() and len(b.summary().splitlines()) == 2


def test_cost_model_gives_a_replica_its_devices():
    one = CostModel.from_model(L70, "h200")
    tp = CostModel.from_model(L70, "h200", tensor_parallel=8)
    assert tp.alpha1 == pytest.approx(one.alpha1 / 8) and tp.alpha2 == pytest.approx(one.alpha2 / 8)
    assert tp.alpha3 == pytest.approx(one.alpha3 / 8)  # one ring per TP rank over its KV heads
    assert tp.beta1 == one.beta1 and tp.beta2 == one.beta2
    assert tp.intra_node_bandwidth == one.intra_node_bandwidth
    pp = CostModel.from_model(L70, "h200", tensor_parallel=8, pipeline_parallel=4)
    speed = pipeline_speedup(4, 8)
    assert speed == pytest.approx(32 / 11)  # 1F1B bubble: 4 x 8 / (8 + 3)
    assert pp.alpha2 == pytest.approx(one.alpha2 / (8 * speed))
    assert pp.alpha3 == pytest.approx(one.alpha3 / 32) and pp.beta2 == pytest.approx(one.beta2 / 4)
    assert CostModel.from_model(L70, "h200", tensor_parallel=1) == one
    with pytest.raises(ConfigError, match="does not divide the 64 attention heads"):
        CostModel.from_model(L70, "h200", tensor_parallel=128)
    with pytest.raises(ConfigError, match="does not divide the 8 KV heads"):
        CostModel.from_model(L70, "h200", tensor_parallel=16)
    # overrides still replace single coefficients
    assert CostModel.from_model(L70, "h200", tensor_parallel=8, beta1=0.0).beta1 == 0.0
    vl = CostModel.from_model("qwen3-vl-8b", "h200", tensor_parallel=2)
    base = CostModel.from_model("qwen3-vl-8b", "h200")
    assert vl.vision.seconds_per_patch == pytest.approx(base.vision.seconds_per_patch / 2)
    assert dataclasses.replace(vl.vision, seconds_per_patch=0).decode_workers >= 1
