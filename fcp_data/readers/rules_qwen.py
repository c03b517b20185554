"""Qwen2-VL, Qwen2.5-VL and Qwen3-VL rules: re-exported from `fcp_data.vision.families`.

Kept so that `from fcp_data.readers.rules_qwen import smart_resize` (and the other names
below) still works; the family lives in `fcp_data.vision.families.qwen`.
"""

from __future__ import annotations

from ..vision.families import (
    FPS,
    FPS_MAX_FRAMES,
    FPS_MIN_FRAMES,
    FRAME_FACTOR,
    IMAGE_MAX_TOKEN_NUM,
    IMAGE_MIN_TOKEN_NUM,
    MAX_RATIO,
    MODEL_SEQ_LEN,
    QWEN2VL_LEGACY_TOTAL_PIXELS,
    SPATIAL_MERGE_SIZE,
    VIDEO_MAX_TOKEN_NUM,
    VIDEO_MIN_TOKEN_NUM,
    QwenRuleConfig,
    QwenVisionRule,
    smart_nframes,
    smart_resize,
)

__all__ = [
    "FPS",
    "FPS_MAX_FRAMES",
    "FPS_MIN_FRAMES",
    "FRAME_FACTOR",
    "IMAGE_MAX_TOKEN_NUM",
    "IMAGE_MIN_TOKEN_NUM",
    "MAX_RATIO",
    "MODEL_SEQ_LEN",
    "QWEN2VL_LEGACY_TOTAL_PIXELS",
    "SPATIAL_MERGE_SIZE",
    "VIDEO_MAX_TOKEN_NUM",
    "VIDEO_MIN_TOKEN_NUM",
    "QwenRuleConfig",
    "QwenVisionRule",
    "smart_nframes",
    "smart_resize",
]
