"""Vision-encoder presets and the analytic estimate of their VisionCost on a device.

Encoders, from their published configs (Hugging Face `config.json` / `vision_config`):

- qwen2.5-vl-vit (Qwen2.5-VL 3B/7B/72B, 675M): depth 32, hidden 1280, 16 heads, ffn 3420 ¹,
  patch 14 ²; 8×8-patch windows, full attention in blocks 7, 15, 23, 31.
- qwen3-vl-vit (Qwen3-VL-2B/-4B): depth 24, hidden 1024, 16 heads, ffn 4096, patch 16 ²; full
  attention; DeepStack mergers after blocks 5, 11, 17.
- qwen3-vl-vit-8b (Qwen3-VL-8B): depth 27, hidden 1152, 16 heads, ffn 4304, patch 16 ²; full
  attention; DeepStack mergers after blocks 8, 16, 24.
- internvit-300m (InternVL3-2B/-8B, InternVL2.5-4B): depth 24, hidden 1024, 16 heads, ffn 4096,
  patch 14; full attention over 1024 patches + CLS per 448² tile.
- internvit-6b (InternVL2.5-26B/38B/78B): depth 45, hidden 3200, 25 heads, ffn 12800, patch 14;
  full attention over 1024 patches + CLS per 448² tile.

¹ SwiGLU (3 matrices); the others use a 2-matrix GELU MLP. ² 2-frame tubelets (Conv3d over
2 × p × p); a unit is one tubelet (Qwen) or one tile/frame (InternVL). Attention never crosses
a unit in any of them (Qwen: `cu_seqlens` per temporal patch; InternViT: one tile per row).

FLOPs per patch, forward: patch embedding 2·(3·t·p²)·h; per block 2·(4h² + k·h·ffn) (k = 3
SwiGLU, 2 GELU); mergers 2·(4h·mid + mid·out)/4 per patch (Qwen: mid = 4h, one merger plus one
per DeepStack level; InternVL's mlp1: mid = out = the LLM's hidden); attention 4·h per
(query, key) pair per block (QKᵀ and PV, bidirectional). Seconds divide by the device's peak
at 40% (per-patch layers) and 35% (attention) utilisation, lower than the LLM's 55%/45% since
1024-1280-wide matmuls and many short varlen attentions fill the device less (estimates; `fcp
profile --vision` measures them). Trainable encoders pay 3× forward (fwd + bwd), frozen 1×.

Decode (documented estimate, per device class = its host CPU): software H.264 at ~400 frames/s
per core for 720p on a current x86 server core (≈ 2.5 ms per megapixel, resize included), half
that on the Kunpeng 920 hosts of Ascend 910C nodes (≈ 5 ms/Mpix); 8 loader workers per replica.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import ConfigError
from .vision import VisionCost

__all__ = ["DECODE_SECONDS_PER_MPIX", "ENCODERS", "EncoderSpec", "estimate_vision_cost"]

VISION_LINEAR_MFU = 0.40
VISION_ATTENTION_MFU = 0.35
DECODE_WORKERS = 8
DECODE_SECONDS_PER_MPIX: dict[str, float] = {
    "h200": 2.5e-3,
    "a100-80gb": 2.5e-3,
    "ascend-910c": 5.0e-3,
    "cpu": 4.0e-3,
}


@dataclass(kw_only=True, slots=True, frozen=True)
class EncoderSpec:
    """A vision encoder. `full_blocks` lists full-attention blocks when the others use windows
    of `window_patches` patches; None means every block attends over the whole unit."""

    name: str
    layers: int
    hidden: int
    heads: int
    ffn: int
    patch: int
    temporal_patch: int = 2
    gated_mlp: bool = False
    window_patches: int = 0
    full_blocks: tuple[int, ...] | None = None
    mergers: int = 1  # 1 + DeepStack levels
    merger_mid: int | None = None  # None: the merger's hidden is 4h (Qwen); else out (InternVL)
    cls_token: bool = False

    @property
    def params(self) -> float:
        k = 3 if self.gated_mlp else 2
        return float(self.layers * (4 * self.hidden**2 + k * self.hidden * self.ffn))


ENCODERS: dict[str, EncoderSpec] = {
    e.name: e
    for e in (
        EncoderSpec(
            name="qwen2.5-vl-vit",
            layers=32,
            hidden=1280,
            heads=16,
            ffn=3420,
            patch=14,
            gated_mlp=True,
            window_patches=64,  # window_size 112 px / patch 14 = 8 × 8
            full_blocks=(7, 15, 23, 31),
        ),
        EncoderSpec(
            name="qwen3-vl-vit", layers=24, hidden=1024, heads=16, ffn=4096, patch=16, mergers=4
        ),
        EncoderSpec(
            name="qwen3-vl-vit-8b", layers=27, hidden=1152, heads=16, ffn=4304, patch=16, mergers=4
        ),
        EncoderSpec(
            name="internvit-300m",
            layers=24,
            hidden=1024,
            heads=16,
            ffn=4096,
            patch=14,
            temporal_patch=1,
            merger_mid=0,
            cls_token=True,
        ),
        EncoderSpec(
            name="internvit-6b",
            layers=45,
            hidden=3200,
            heads=25,
            ffn=12800,
            patch=14,
            temporal_patch=1,
            merger_mid=0,
            cls_token=True,
        ),
    )
}


def estimate_vision_cost(
    encoder: str | EncoderSpec,
    device: str,
    *,
    peak_flops: float,
    llm_hidden: int,
    frozen: bool = False,
) -> VisionCost:
    """VisionCost of `encoder` feeding an LLM of width `llm_hidden` on `device` (module doc)."""
    if isinstance(encoder, str):
        if encoder not in ENCODERS:
            raise ConfigError(f"unknown vision encoder {encoder!r}; known: {sorted(ENCODERS)}")
        encoder = ENCODERS[encoder]
    e, h = encoder, encoder.hidden
    k = 3 if e.gated_mlp else 2
    mid = 4 * h if e.merger_mid is None else llm_hidden
    fwd_patch = (
        2 * 3 * e.temporal_patch * e.patch**2 * h
        + e.layers * 2 * (4 * h * h + k * h * e.ffn)
        + e.mergers * 2 * (4 * h * mid + mid * llm_hidden) / 4
    )
    full = e.layers if e.full_blocks is None else len(e.full_blocks)
    window = e.layers - full if e.window_patches else 0
    passes = 1.0 if frozen else 3.0
    lin_rate = peak_flops * VISION_LINEAR_MFU
    att_rate = peak_flops * VISION_ATTENTION_MFU
    return VisionCost(
        seconds_per_patch=passes * fwd_patch / lin_rate,
        seconds_per_window_pair=passes * 4 * h * window / att_rate,
        seconds_per_full_pair=passes * 4 * h * full / att_rate,
        window_patches=e.window_patches,
        extra_patches=1 if e.cls_token else 0,
        decode_seconds_per_mpix=DECODE_SECONDS_PER_MPIX.get(device, 4.0e-3),
        decode_workers=DECODE_WORKERS,
        name=f"{e.name}@{device} (analytic{', frozen' if frozen else ''})",
    )
