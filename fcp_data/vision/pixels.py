"""Pixels -> float32 in the family processor's exact scale; the families' row orders and stats.

Normalisation is the processors' arithmetic: uint8 * (1/255) in float64, cast to float32, then
(x - mean) / std in float32 (transformers image_transforms.rescale / normalize). The statistics
and Qwen's patch-row order (`qwen_rows`) belong to their families (fcp_data.vision.families)
and are re-exported here for old imports.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .families import (
    CLIP_MEAN,
    CLIP_STD,
    HALF_MEAN,
    HALF_STD,
    IMAGENET_MEAN,
    IMAGENET_STD,
    qwen_rows,
)

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


def normalize(frames: np.ndarray, mean: Sequence[float], std: Sequence[float]) -> np.ndarray:
    """uint8 (..., H, W, 3) -> float32 (..., 3, H, W) rescaled and normalised per channel."""
    x = (frames.astype(np.float64) * (1 / 255)).astype(np.float32)
    x = np.moveaxis(x, -1, -3)
    m = np.asarray(mean, dtype=np.float32).reshape(3, 1, 1)
    s = np.asarray(std, dtype=np.float32).reshape(3, 1, 1)
    return np.ascontiguousarray((x - m) / s)
