"""Moved to `fcp_data.vision.decode` (one video decoder with backends); kept for old imports."""

from ..vision.decode import (
    decode_frames,
    decode_index_video,
    decode_sample_video,
    groups_for_token_range,
)

__all__ = ["decode_frames", "decode_index_video", "decode_sample_video", "groups_for_token_range"]
