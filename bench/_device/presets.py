"""Sizes per run kind: `dry` (CPU, seconds), `cpu` (CPU, a minute or two), `gpu` (CUDA / NPU).

The GPU sizes are chosen to fit the whole suite in ~2-3 minutes on one H200-class device
(measured parts, not spawn and import time): exactness packs of ~2.4k tokens with head_dim 128
(flash-attn's common size), the d = 1 kernel at 4k/16k/32k tokens with Llama-3-8B attention
heads (32 query, 8 KV, dim 128, bf16), the hot path's micro-batches A, B, C at full size with
those heads and a 4-layer 2048-wide Llama for the model step, the profile on llama3.2-1b's
shape up to 16k tokens, a Qwen2.5-VL-width vision encoder (4 of its 32 blocks) up to 8192 patches.
"""

from __future__ import annotations

from typing import Any

__all__ = ["preset"]


def preset(kind: str, device: str) -> dict[str, Any]:
    """Every size the suite uses for run kind `kind` ('dry', 'cpu', 'gpu') on `device`."""
    if kind == "gpu":
        return {
            "tiny_cases": False,
            "job_min_s": 60.0,
            "kernel_lengths": [4096, 16384, 32768],
            "kernel": {"heads": 32, "kv_heads": 8, "head_dim": 128, "dtype": "bfloat16",
                       "repeats": 3},
            "profile_shape": "llama3.2-1b",
            "profile_lengths": [1024, 2048, 4096, 8192, 16384],
            "profile_repeats": 3,
            "profile_min_s": 30.0,
            "vision": {"layers": 4, "hidden": 1280, "heads": 16, "ffn": 5120,
                       "patches": (256, 1024, 2048, 4096, 8192),
                       "sizes": ((320, 176), (640, 368), (1280, 720)),
                       "frames": 16, "repeats": 3, "device": device, "name": "vit-1280x4"},
            "hot_path": {"heads": 32, "kv_heads": 8, "head_dim": 128, "dtype": "bfloat16",
                         "repeats": 5, "scale": 1, "min_s": 20.0,
                         "model": {"vocab": 32000, "hidden": 2048, "ffn": 5632, "layers": 4,
                                   "heads": 16, "kv_heads": 4}},
            "vision_min_s": 20.0,
            "decode": {"width": 1280, "height": 720, "frames": 300, "fps": 30, "degree": 4,
                       "repeats": 3, "cuda": True},
            "decode_min_s": 20.0,
            "p2p": {"sizes": [1 << 16, 1 << 20, 1 << 24, 1 << 27], "repeats": 5, "min_s": 10.0},
            "overlap": {"seqlen": 32768, "heads": 32, "kv_heads": 8, "head_dim": 128,
                        "dtype": "bfloat16", "repeats": 3, "min_s": 15.0},
        }  # fmt: skip
    dry = kind == "dry"
    return {
        "tiny_cases": True,
        "job_min_s": 10.0 if dry else 30.0,
        "kernel_lengths": [128, 256] if dry else [512, 1024, 2048],
        "kernel": {"heads": 4 if dry else 8, "kv_heads": 2, "head_dim": 32 if dry else 64,
                   "dtype": "float32", "repeats": 2 if dry else 3},
        "profile_shape": "cpu-small",
        "profile_lengths": [64, 128, 256, 512] if dry else [256, 512, 1024, 2048],
        "profile_repeats": 1 if dry else 2,
        "profile_min_s": 2.0 if dry else 20.0,
        "vision": {"layers": 1, "hidden": 64, "heads": 2, "ffn": 128,
                   "patches": (16, 32, 64, 128), "sizes": ((64, 48),), "frames": 4,
                   "repeats": 1, "device": "cpu", "name": "vit-dry"}
        if dry else {"device": "cpu"},
        "hot_path": {"heads": 8, "kv_heads": 2, "head_dim": 32 if dry else 64,
                     "dtype": "bfloat16", "repeats": 2 if dry else 3,
                     "scale": 64 if dry else 16, "min_s": 2.0 if dry else 20.0,
                     "model": {"vocab": 256, "hidden": 128, "ffn": 256, "layers": 2,
                               "heads": 4, "kv_heads": 2}},
        "vision_min_s": 2.0 if dry else 15.0,
        "decode": {"width": 64 if dry else 320, "height": 48 if dry else 240,
                   "frames": 60 if dry else 300, "fps": 30, "degree": 4,
                   "repeats": 1 if dry else 3, "cuda": False},
        "decode_min_s": 2.0 if dry else 10.0,
        "p2p": {"sizes": [4096, 65536, 262144], "repeats": 3 if dry else 5, "min_s": 1.0},
        "overlap": {"seqlen": 256 if dry else 2048, "heads": 4, "kv_heads": 2, "head_dim": 32,
                    "dtype": "float32", "repeats": 2 if dry else 3, "min_s": 1.0},
    }  # fmt: skip
