"""The analytic estimate of cost coefficients from a model preset and a device preset.

The estimate assumes model FLOPs utilisation of 55% for the per-token layers and
45% for attention (typical measured MFU of large dense training), bf16 activations with
selective recomputation (34·h bytes per token per layer, Korthikanti et al. 2022), model states
of 6 bytes per parameter (bf16 weights + fp32 grads; Adam states sharded by a distributed
optimizer) and the ring traffic fcp_exec really sends per layer: bf16 K and V forward and
backward plus fp32 dK and dV (`model.ring_bytes_per_token`).
A replica of TP x PP devices (`tensor_parallel=`, `pipeline_parallel=`) gets TP times the
compute, PP times less the 1F1B bubble, and one ring per TP rank (`estimate_cost_model`); the
exact memory of such a layout is `memory.derive_tokens_per_replica`, not the coarse
`bytes_per_token` / `static_bytes` here.
A fitted profile (`fcp profile`) replaces all of this with measurements.
A vision-language model's VisionCost (`vision_presets`: encoder fwd+bwd per unit, decode per
megapixel) rides on the estimate as `CostModel.vision`.
`CostModel.from_model` calls `estimate_cost_model` through the one lazy import of this room:
the estimate builds CostModels, so `model.py` cannot import it at module level.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ...errors import ConfigError
from .model import CostModel, ring_bytes_per_token
from .presets import DeviceSpec, ModelSpec, check_tensor_parallel, device_spec, model_spec
from .transports import (
    A2A_EXCHANGES_PER_LAYER,
    a2a_bytes_per_token,
    head_parallel_degrees,
    ring_share,
)
from .vision_presets import estimate_vision_cost

__all__ = ["estimate_cost_model", "head_parallel_terms", "pipeline_speedup"]

LINEAR_MFU = 0.55
ATTENTION_MFU = 0.45
BYTES_PER_PARAM_STATE = 6.0
ACT_BYTES_PER_TOKEN_PER_HIDDEN_PER_LAYER = 34.0
ACTIVATION_BYTES = 2  # bf16 K/V on the ring
LAUNCH_SECONDS_PER_LAYER = 3 * 15e-6  # fwd + bwd kernel launches and syncs, per layer
RING_STEP_LATENCY_PER_LAYER = 3 * 8e-6  # one P2P handshake per layer per pass
# one NCCL/HCCL all-to-all of a few MB inside a node: ~20 us of latency (launch, handshake);
# a head-parallel transport runs A2A_EXCHANGES_PER_LAYER of them per layer and micro-batch
A2A_LATENCY_PER_EXCHANGE = 20e-6


def pipeline_speedup(pipeline_parallel: int, micro_batches: int) -> float:
    """Throughput of PP stages over one device under 1F1B: PP × m / (m + PP − 1).

    A step of m micro-batches takes (m + PP − 1) stage-times instead of m × PP: the fill and
    drain bubble idles each stage PP − 1 stage-times. PP = 4 with m = 8 gives 2.91x, not 4x;
    PP = 1 gives exactly 1.
    """
    return pipeline_parallel * micro_batches / (micro_batches + pipeline_parallel - 1)


def _whole(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name}={value!r} must be an integer >= 1")
    return value


def estimate_cost_model(
    model: str | ModelSpec,
    device: str | DeviceSpec,
    *,
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
    pipeline_micro_batches: int = 8,
    head_parallel: bool = False,
) -> CostModel:
    """Analytic coefficients for `model` on `device` (see the module docstring for assumptions).

    A replica is TP × PP devices. TP devices share every layer, each holding 1/TP of the heads
    and of the MLP: the compute terms (alpha1, alpha2, alpha_vision) are divided by TP (the 55% /
    45% MFU figures are those of large TP = 8 runs, so they already carry the TP collectives),
    and each TP rank runs its own ring over its KV heads, so the ring bytes per link (alpha3)
    are divided by TP while the TP links carry them in parallel. PP stages pipeline the layers:
    compute is divided by `pipeline_speedup(PP, pipeline_micro_batches)` (1F1B, bubble
    included; PP = 4, m = 8: 2.91x), and each stage's ring moves only its layers' K/V, so
    alpha3 is divided by PP and beta2 (per-layer handshakes) too. beta1 (kernel launches) is
    per device, not divided by TP; it is divided by the pipeline speedup like the compute.
    Llama3-70B at TP = 8 on H200: alpha2 = 0.096 ms per token per replica instead of 0.767 ms
    on one device; alpha3 = 163,840 B per token per link instead of 1,310,720 B.
    `bytes_per_token` and `static_bytes` (the coarse `memory_bytes` path) become per device:
    activations / TP, model states / (TP × PP); `memory.py` derives the exact
    budget of a layout. `head_parallel=True` adds the hybrid transports the heads of one TP
    rank allow (H / TP query and H_kv / TP K/V heads), with all-to-all bytes per link divided
    by PP like alpha3 and a latency of `A2A_LATENCY_PER_EXCHANGE` per exchange
    (`head_parallel_terms`).
    """
    m = model_spec(model) if isinstance(model, str) else model
    dev = device_spec(device) if isinstance(device, str) else device
    tp = _whole("tensor_parallel", tensor_parallel)
    pp = _whole("pipeline_parallel", pipeline_parallel)
    mb = _whole("pipeline_micro_batches", pipeline_micro_batches)
    check_tensor_parallel(m, tp)
    if m.layers % pp:
        raise ConfigError(
            f"pipeline_parallel={pp} does not divide the {m.layers} layers of {m.name}: "
            "megatron-core gives every stage the same number of layers; use a divisor of "
            f"{m.layers}"
        )
    cost = _estimate_one_device(m, dev)
    if head_parallel:
        cost = replace(cost, **head_parallel_terms(m, tensor_parallel=tp, pipeline_parallel=pp))
    if tp == 1 and pp == 1:
        return cost
    compute = tp * pipeline_speedup(pp, mb)
    return replace(
        cost,
        alpha1=cost.alpha1 / compute,
        alpha2=cost.alpha2 / compute,
        alpha_vision=cost.alpha_vision / compute,
        alpha3=cost.alpha3 / (tp * pp),
        beta1=cost.beta1 / pipeline_speedup(pp, mb),
        beta2=cost.beta2 / pp,
        bytes_per_token=cost.bytes_per_token / tp,
        static_bytes=cost.static_bytes / (tp * pp),
        name=f"{m.name}@{dev.name} TP={tp} PP={pp} (analytic)",
        vision=None
        if cost.vision is None
        else replace(  # the encoder runs on the replica's devices too; decoding does not
            cost.vision,
            seconds_per_patch=cost.vision.seconds_per_patch / compute,
            seconds_per_unit=cost.vision.seconds_per_unit / compute,
            seconds_per_window_pair=cost.vision.seconds_per_window_pair / compute,
            seconds_per_full_pair=cost.vision.seconds_per_full_pair / compute,
        ),
    )


def head_parallel_terms(
    m: ModelSpec, *, tensor_parallel: int = 1, pipeline_parallel: int = 1
) -> dict[str, Any]:
    """CostModel fields of the head-parallel hybrid for one TP rank of `m` on a PP stage:
    the allowed u, all-to-all bytes per local token and link, ring shares and beta3.
    Qwen3-8B at TP = 1: u in (2, 4, 8, 16, 32), 2.36 MB per local token at u = 2 (36 layers)."""
    heads, kv = m.heads // tensor_parallel, m.kv_heads // tensor_parallel
    layers = m.layers // pipeline_parallel
    us = head_parallel_degrees(heads, kv)
    return {
        "head_parallel": us,
        "a2a_bytes": tuple(
            a2a_bytes_per_token(
                heads=heads,
                kv_heads=kv,
                head_dim=m.dim_head,
                ulysses=u,
                activation_bytes=ACTIVATION_BYTES,
                layers=layers,
            )
            for u in us
        ),
        "ring_shares": tuple(ring_share(kv, u) for u in us),
        "beta3": A2A_LATENCY_PER_EXCHANGE * A2A_EXCHANGES_PER_LAYER * layers,
    }


def _estimate_one_device(m: ModelSpec, dev: DeviceSpec) -> CostModel:
    hd = m.dim_head
    q_dim, kv_dim = m.heads * hd, m.kv_heads * hd
    # Forward FLOPs per token of the per-token layers: QKVO projections, SwiGLU MLP, LM head.
    fwd_linear = (
        m.layers * 2 * (m.hidden * (q_dim + 2 * kv_dim) + q_dim * m.hidden + 3 * m.hidden * m.ffn)
    )
    fwd_linear += 2 * m.hidden * m.vocab
    alpha2 = 3 * fwd_linear / (dev.peak_flops * LINEAR_MFU)
    # Causal attention forward: QK^T and PV over half the s² pairs: 2·2·s²·q_dim/2 per layer.
    alpha1 = 3 * m.layers * 2 * q_dim / (dev.peak_flops * ATTENTION_MFU)
    alpha3 = ring_bytes_per_token(
        kv_heads=m.kv_heads, head_dim=hd, activation_bytes=ACTIVATION_BYTES, layers=m.layers
    )
    alpha_vision = 0.0
    if m.vision is not None:
        v = m.vision
        # Per patch: QKVO 4h², MLP 2·h·ffn, window/tile attention ~ 2·1024·h; ×2 FLOPs, ×3 fwd+bwd.
        per_patch = v.layers * 2 * (4 * v.hidden**2 + 2 * v.hidden * v.ffn + 2 * 1024 * v.hidden)
        alpha_vision = 3 * per_patch * v.patches_per_token / (dev.peak_flops * LINEAR_MFU)
    return CostModel(
        alpha1=alpha1,
        alpha2=alpha2,
        alpha3=float(alpha3),
        beta1=LAUNCH_SECONDS_PER_LAYER * m.layers,
        beta2=RING_STEP_LATENCY_PER_LAYER * m.layers,
        intra_node_bandwidth=dev.intra_node_bandwidth,
        inter_node_bandwidth=dev.inter_node_bandwidth,
        bytes_per_token=ACT_BYTES_PER_TOKEN_PER_HIDDEN_PER_LAYER * m.hidden * m.layers,
        static_bytes=BYTES_PER_PARAM_STATE * m.params,
        alpha_vision=alpha_vision,
        name=f"{m.name}@{dev.name} (analytic)",
        vision=None
        if m.encoder is None
        else estimate_vision_cost(
            m.encoder, dev.name, peak_flops=dev.peak_flops, llm_hidden=m.hidden
        ),
    )
