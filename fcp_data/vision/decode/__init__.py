"""One video frame decoder with backends (PyAV, decord, torchcodec) that decodes only the GOPs
holding wanted frames.

    from fcp_data.vision.decode import DecodeStats, decode_video_frames, resolve_backend
    name = resolve_backend("auto", "cpu")             # once: "torchcodec" or "pyav"
    stats = DecodeStats()
    frames = decode_video_frames(mp4, [0, 17, 102, 119], (48, 64), backend=name, stats=stats)
    stats.frames_decoded, stats.seeks                  # work done, for benchmarks

Modules: `base` (the backend contract, DecodeStats), `gop` (which spans to decode), one
module per backend, `backends` (choosing one), `errors` (VideoDecodeError and its messages),
`frames` (decode_video_frames), `sample` (the rule-driven, resized entry points the readers
re-export). Nothing here imports a decoding library until a frame is decoded.
"""

from .backends import AUTO_ORDER, BACKENDS, resolve_backend
from .base import DecodeStats, FrameBackend
from .errors import VideoDecodeError
from .frames import decode_video_frames
from .sample import decode_frames, decode_index_video, decode_sample_video, groups_for_token_range

__all__ = [
    "AUTO_ORDER",
    "BACKENDS",
    "DecodeStats",
    "FrameBackend",
    "VideoDecodeError",
    "decode_frames",
    "decode_index_video",
    "decode_sample_video",
    "decode_video_frames",
    "groups_for_token_range",
    "resolve_backend",
]
