"""Pixels -> the rows a vision tower takes, in the family processor's exact order and scale.

Qwen (Qwen2VLImageProcessor.patchify / Qwen2VLVideoProcessor.patchify): a unit of 2 frames
(C, H, W) each, normalised, is cut into patches of p x p; rows run over merged h, merged w,
then the 2x2 merge window (h, w), and each row holds C * 2 * p * p values ordered channel,
frame, patch row, patch column. So 2 frames of 56x56 at p = 14 give 16 rows of 1176 values,
and 4 consecutive rows are one LLM token. Units are concatenated in time order (t-major), which
is the processor's order for a whole video.

Normalisation is the processors' arithmetic: uint8 * (1/255) in float64, cast to float32, then
(x - mean) / std in float32 (transformers image_transforms.rescale / normalize).
InternVL (InternVL's build_transform): tiles resized to 448x448, x / 255, ImageNet mean/std,
kept as images [tiles, 3, 448, 448].
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = [
    "CLIP_MEAN",
    "CLIP_STD",
    "HALF_MEAN",
    "HALF_STD",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "normalize",
    "qwen_rows",
]

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)  # Qwen2/2.5-VL processors
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
HALF_MEAN = (0.5, 0.5, 0.5)  # Qwen3-VL processors (IMAGENET_STANDARD_*)
HALF_STD = (0.5, 0.5, 0.5)
IMAGENET_MEAN = (0.485, 0.456, 0.406)  # InternVL build_transform
IMAGENET_STD = (0.229, 0.224, 0.225)


def normalize(frames: np.ndarray, mean: Sequence[float], std: Sequence[float]) -> np.ndarray:
    """uint8 (..., H, W, 3) -> float32 (..., 3, H, W) rescaled and normalised per channel."""
    x = (frames.astype(np.float64) * (1 / 255)).astype(np.float32)
    x = np.moveaxis(x, -1, -3)
    m = np.asarray(mean, dtype=np.float32).reshape(3, 1, 1)
    s = np.asarray(std, dtype=np.float32).reshape(3, 1, 1)
    return np.ascontiguousarray((x - m) / s)


def qwen_rows(units: np.ndarray, *, patch: int, merge: int = 2) -> np.ndarray:
    """float32 [U, tps, C, H, W] (U units of tps frames) -> rows [U * gh * gw, C * tps * p * p]."""
    u, tps, c, h, w = units.shape
    if h % (patch * merge) or w % (patch * merge):
        raise ValueError(
            f"frame size {h}x{w} is not a multiple of patch*merge={patch * merge}; resize it "
            "with the rule's smart_resize first"
        )
    gh, gw = h // patch, w // patch
    x = units.reshape(u, tps, c, gh // merge, merge, patch, gw // merge, merge, patch)
    # -> (U, gh/m, gw/m, m_h, m_w, C, tps, p_h, p_w)
    x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return np.ascontiguousarray(x.reshape(u * gh * gw, c * tps * patch * patch))
