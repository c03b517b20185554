"""Model and device presets, and the analytic estimate of cost coefficients from them.

Models are the paper's Table 7 (LLMs) and Table 8 (MLLMs; the LLM part plus the vision
encoder). Devices carry peak dense bf16 FLOP/s, memory, and one P2P link's bandwidth inside and
across nodes. The estimate assumes model FLOPs utilisation of 55% for the per-token layers and
45% for attention (typical measured MFU of large dense training), bf16 activations with
selective recomputation (34·h bytes per token per layer, Korthikanti et al. 2022), model states
of 6 bytes per parameter (bf16 weights + fp32 grads; Adam states sharded by a distributed
optimizer) and the ring traffic fcp_exec really sends per layer: bf16 K and V forward and
backward plus fp32 dK and dV (`cost.ring_bytes_per_token`).
A fitted profile (`fcp profile`) replaces all of this with measurements.
The vision-language models name their encoder (`ModelSpec.encoder`); its VisionCost
(`vision_presets`: encoder fwd+bwd per unit, decode per megapixel) rides on the estimate as
`CostModel.vision`. `VisionSpec` stays the coarse size used for the model-state bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .cost import CostModel, ring_bytes_per_token
from .vision_presets import estimate_vision_cost

__all__ = ["DEVICES", "MODELS", "DeviceSpec", "ModelSpec", "VisionSpec", "estimate_cost_model"]

LINEAR_MFU = 0.55
ATTENTION_MFU = 0.45
BYTES_PER_PARAM_STATE = 6.0
ACT_BYTES_PER_TOKEN_PER_HIDDEN_PER_LAYER = 34.0
ACTIVATION_BYTES = 2  # bf16 K/V on the ring
LAUNCH_SECONDS_PER_LAYER = 3 * 15e-6  # fwd + bwd kernel launches and syncs, per layer
RING_STEP_LATENCY_PER_LAYER = 3 * 8e-6  # one P2P handshake per layer per pass


@dataclass(kw_only=True, slots=True, frozen=True)
class VisionSpec:
    """A ViT encoder. `patches_per_token`: patches merged into one LLM token (2×2 → 4)."""

    layers: int
    hidden: int
    ffn: int
    patches_per_token: int = 4


@dataclass(kw_only=True, slots=True, frozen=True)
class ModelSpec:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    head_dim: int | None = None
    vision: VisionSpec | None = None
    encoder: str | None = None  # vision_presets.ENCODERS name: the planner's vision cost

    @property
    def dim_head(self) -> int:
        return self.head_dim if self.head_dim is not None else self.hidden // self.heads

    @property
    def params(self) -> float:
        hd = self.dim_head
        attn = self.hidden * hd * (2 * self.heads + 2 * self.kv_heads)
        mlp = 3 * self.hidden * self.ffn
        p = self.layers * (attn + mlp) + 2 * self.vocab * self.hidden
        if self.vision is not None:
            v = self.vision
            p += v.layers * (4 * v.hidden * v.hidden + 2 * v.hidden * v.ffn)
        return float(p)


@dataclass(kw_only=True, slots=True, frozen=True)
class DeviceSpec:
    name: str
    peak_flops: float
    memory_bytes: float
    intra_node_bandwidth: float
    inter_node_bandwidth: float
    replicas_per_node: int


_QWEN3_VOCAB = 151_936
_QWEN25_VOCAB = 151_674
_LLAMA3_VOCAB = 128_256
_INTERN_VIT = VisionSpec(layers=24, hidden=1024, ffn=4096)  # InternViT-300M, pixel shuffle 2×2
_QWEN3_VIT = VisionSpec(layers=24, hidden=1024, ffn=4096)
_QWEN3_VIT_8B = VisionSpec(layers=27, hidden=1152, ffn=4304)

MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        # Table 7 (LLMs). Qwen3 uses head_dim 128 whatever the hidden size.
        ModelSpec(
            name="qwen3-1.7b",
            layers=28,
            hidden=2048,
            heads=16,
            kv_heads=8,
            ffn=6144,
            vocab=_QWEN3_VOCAB,
            head_dim=128,
        ),
        ModelSpec(
            name="qwen3-4b",
            layers=36,
            hidden=2560,
            heads=32,
            kv_heads=8,
            ffn=9728,
            vocab=_QWEN3_VOCAB,
            head_dim=128,
        ),
        ModelSpec(
            name="qwen3-8b",
            layers=36,
            hidden=4096,
            heads=32,
            kv_heads=8,
            ffn=12288,
            vocab=_QWEN3_VOCAB,
            head_dim=128,
        ),
        ModelSpec(
            name="llama3.2-1b",
            layers=16,
            hidden=2048,
            heads=32,
            kv_heads=8,
            ffn=8192,
            vocab=_LLAMA3_VOCAB,
        ),
        ModelSpec(
            name="llama3.2-3b",
            layers=28,
            hidden=3072,
            heads=24,
            kv_heads=8,
            ffn=8192,
            vocab=_LLAMA3_VOCAB,
        ),
        ModelSpec(
            name="llama3-8b",
            layers=32,
            hidden=4096,
            heads=32,
            kv_heads=8,
            ffn=14336,
            vocab=_LLAMA3_VOCAB,
        ),
        # Table 8 (MLLMs): the language model of each, plus its vision encoder.
        ModelSpec(
            name="internvl3-2b",
            layers=28,
            hidden=1536,
            heads=12,
            kv_heads=2,
            ffn=8960,
            vocab=_QWEN25_VOCAB,
            vision=_INTERN_VIT,
            encoder="internvit-300m",
        ),
        ModelSpec(
            name="internvl2.5-4b",
            layers=36,
            hidden=2048,
            heads=16,
            kv_heads=2,
            ffn=11008,
            vocab=_QWEN25_VOCAB,
            vision=_INTERN_VIT,
            encoder="internvit-300m",
        ),
        ModelSpec(
            name="internvl3-8b",
            layers=28,
            hidden=3584,
            heads=28,
            kv_heads=4,
            ffn=18944,
            vocab=_QWEN25_VOCAB,
            vision=_INTERN_VIT,
            encoder="internvit-300m",
        ),
        ModelSpec(
            name="qwen3-vl-2b",
            layers=28,
            hidden=2048,
            heads=16,
            kv_heads=8,
            ffn=6144,
            vocab=_QWEN3_VOCAB,
            head_dim=128,
            vision=_QWEN3_VIT,
            encoder="qwen3-vl-vit",
        ),
        ModelSpec(
            name="qwen3-vl-4b",
            layers=36,
            hidden=2560,
            heads=32,
            kv_heads=8,
            ffn=9728,
            vocab=_QWEN3_VOCAB,
            head_dim=128,
            vision=_QWEN3_VIT,
            encoder="qwen3-vl-vit",
        ),
        ModelSpec(
            name="qwen3-vl-8b",
            layers=36,
            hidden=4096,
            heads=32,
            kv_heads=8,
            ffn=12288,
            vocab=_QWEN3_VOCAB,
            head_dim=128,
            vision=_QWEN3_VIT_8B,
            encoder="qwen3-vl-vit-8b",
        ),
    )
}

DEVICES: dict[str, DeviceSpec] = {
    d.name: d
    for d in (
        # H200 SXM: 989 TFLOP/s dense bf16, 141 GB HBM3e, NVLink 4 450 GB/s per direction,
        # one 400 Gb/s NIC per GPU (50 GB/s), 8 per node.
        DeviceSpec(
            name="h200",
            peak_flops=989e12,
            memory_bytes=141e9,
            intra_node_bandwidth=450e9,
            inter_node_bandwidth=50e9,
            replicas_per_node=8,
        ),
        # A100-80GB SXM: 312 TFLOP/s bf16, NVLink 3 300 GB/s per direction, 200 Gb/s NIC.
        DeviceSpec(
            name="a100-80gb",
            peak_flops=312e12,
            memory_bytes=80e9,
            intra_node_bandwidth=300e9,
            inter_node_bandwidth=25e9,
            replicas_per_node=8,
        ),
        # Ascend 910C (the paper's cluster): ~752 TFLOP/s bf16 (two 910B dies), 64 GB per NPU as
        # the paper states, HCCS ~196 GB/s, 200 Gb/s RoCE between nodes, 16 per node.
        DeviceSpec(
            name="ascend-910c",
            peak_flops=752e12,
            memory_bytes=64e9,
            intra_node_bandwidth=196e9,
            inter_node_bandwidth=25e9,
            replicas_per_node=16,
        ),
        # This machine's kind of CPU, for demos and gloo tests (a rough order of magnitude).
        DeviceSpec(
            name="cpu",
            peak_flops=2e11,
            memory_bytes=16e9,
            intra_node_bandwidth=5e9,
            inter_node_bandwidth=1e9,
            replicas_per_node=8,
        ),
    )
}


def _lookup(table: dict[str, Any], name: str, what: str) -> Any:
    key = name.lower()
    if key not in table:
        raise ValueError(f"unknown {what} {name!r}; known: {sorted(table)}")
    return table[key]


def estimate_cost_model(model: str | ModelSpec, device: str | DeviceSpec) -> CostModel:
    """Analytic coefficients for `model` on `device` (see the module docstring for assumptions)."""
    m = _lookup(MODELS, model, "model") if isinstance(model, str) else model
    dev = _lookup(DEVICES, device, "device") if isinstance(device, str) else device
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
