"""Model and device presets: the paper's models and the devices the planner knows.

Models are the paper's Table 7 (LLMs) and Table 8 (MLLMs; the LLM part plus the vision
encoder). Devices carry peak dense bf16 FLOP/s, memory, and one P2P link's bandwidth inside and
across nodes. The vision-language models name their encoder (`ModelSpec.encoder`, a
`vision_presets.ENCODERS` name); `VisionSpec` is the coarse encoder size used for the
model-state bytes. Plain tables: the memory model and the analytic estimate (`estimate.py`)
read them, and they import nothing of the cost model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...errors import ConfigError

__all__ = [
    "DEVICES",
    "MODELS",
    "DeviceSpec",
    "ModelSpec",
    "VisionSpec",
    "check_tensor_parallel",
    "device_spec",
    "model_spec",
]


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
    qk_norm: bool = False  # RMSNorm on Q and K per head (Qwen3): their inputs are kept too

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
            qk_norm=True,
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
            qk_norm=True,
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
            qk_norm=True,
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
        # Llama 3 / 3.1 70B: 80 layers, GQA with 8 KV heads of 128, untied LM head; 70.6e9
        # parameters by `ModelSpec.params` (the published 70.6B). Trained at TP = 8.
        ModelSpec(
            name="llama3-70b",
            layers=80,
            hidden=8192,
            heads=64,
            kv_heads=8,
            ffn=28672,
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
            qk_norm=True,
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
            qk_norm=True,
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
            qk_norm=True,
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


def model_spec(name: str) -> ModelSpec:
    """The preset `name` (case-insensitive), or ValueError listing the known ones."""
    return _lookup(MODELS, name, "model")


def device_spec(name: str) -> DeviceSpec:
    """The device preset `name` (case-insensitive), or ValueError listing the known ones."""
    return _lookup(DEVICES, name, "device")


def _lookup(table: dict[str, Any], name: str, what: str) -> Any:
    key = name.lower()
    if key not in table:
        raise ConfigError(f"unknown {what} {name!r}; known: {sorted(table)}")
    return table[key]


def check_tensor_parallel(m: ModelSpec, tensor_parallel: int) -> None:
    """ConfigError unless TP splits the model's heads evenly (megatron-core asserts both
    num_attention_heads % TP == 0 and num_query_groups % TP == 0: Llama3-70B's 64 heads and 8
    KV heads allow TP 1, 2, 4, 8; Qwen3-8B's 8 KV heads the same)."""
    for what, count in (("attention heads", m.heads), ("KV heads", m.kv_heads)):
        if count % tensor_parallel:
            ok = [t for t in range(1, count + 1) if m.heads % t == 0 and m.kv_heads % t == 0]
            raise ConfigError(
                f"tensor_parallel={tensor_parallel} does not divide the {count} {what} of "
                f"{m.name}: each TP rank must hold whole heads; use one of {ok}"
            )
