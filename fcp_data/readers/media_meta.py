"""Moved to `fcp_data.vision.media_meta` (media I/O sits with the decoder); kept for old imports."""

from ..vision.media_meta import (
    DURATION_TOLERANCE,
    INT32_MAX,
    VideoMeta,
    decode_json_object,
    image_size,
    parse_sidecar,
    video_meta_from_fields,
)

__all__ = [
    "DURATION_TOLERANCE",
    "INT32_MAX",
    "VideoMeta",
    "decode_json_object",
    "image_size",
    "parse_sidecar",
    "video_meta_from_fields",
]
