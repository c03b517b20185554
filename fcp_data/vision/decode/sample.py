"""Frames a vision rule samples, resized as the model expects: uint8 torch (T, H, W, 3).

The placeholder loader path (`SampleEncoder.vision_input`), the profiler and
`fcp_data.readers` (which re-exports these) use them; the pixel-payload path calls
`decode_video_frames` directly. Resizing is bicubic with antialias on float then rounded
back to uint8, as qwen-vl-utils' `fetch_video` does with torchvision (we use
torch.nn.functional.interpolate, same kernel family; values may differ by a few levels from
PIL/torchvision because clamping happens at the end). Every decode fault is a SampleError
naming the shard and key (the VideoDecodeError's text as its reason): no frame is made up.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ...errors import ConfigError, SampleError
from ..families import VisionTokenRule, VisionTokens, get_rule
from ..modality import VIDEO_EXTS
from .base import DecodeStats
from .errors import VideoDecodeError
from .frames import decode_video_frames

if TYPE_CHECKING:
    import torch

__all__ = ["decode_frames", "decode_index_video", "decode_sample_video", "groups_for_token_range"]


def decode_frames(
    data: bytes,
    indices: Sequence[int],
    resized: tuple[int, int],
    *,
    backend: str = "auto",
    device: str = "cpu",
    key: str = "?",
    shard: str = "?",
    native: tuple[int, int] | None = None,
    stats: DecodeStats | None = None,
) -> torch.Tensor:
    """Frames `indices` of encoded video `data`, resized to (H, W): uint8 tensor (T, H, W, 3).

    `backend`: "auto" (default, as on every path: torchcodec where it loads, else PyAV),
    "pyav", "decord", "torchcodec" (see fcp_data.vision.decode.backends). Raises
    SampleError(shard, key, reason) when the video does not open, a frame fails to decode, or
    it has fewer frames than the highest index; `key` and `shard` only name it. `native`
    (height, width): the size the index counted; frames of another size raise (they would be
    stretched to a resize computed for the wrong aspect). A missing backend raises
    MissingDependencyError.
    """
    import torch  # here, not at import: importing the decoder costs no torch start-up

    if not indices:
        raise ConfigError("frame indices are empty: pass at least one frame index to decode")
    try:
        frames = decode_video_frames(
            data, indices, native, backend=backend, device=device, stats=stats
        )
    except VideoDecodeError as exc:
        raise SampleError(shard, key, str(exc)) from exc
    x = torch.from_numpy(frames).permute(0, 3, 1, 2).float()
    h, w = resized
    if x.shape[-2:] != (h, w):
        x = torch.nn.functional.interpolate(
            x, size=(h, w), mode="bicubic", antialias=True, align_corners=False
        )
    return x.round_().clamp_(0, 255).to(torch.uint8).permute(0, 2, 3, 1).contiguous()


def groups_for_token_range(tokens: VisionTokens, start: int, stop: int) -> range:
    """Temporal groups whose vision tokens intersect [start, stop) of the vision tokens.

    A replica that owns only part of a long video's tokens decodes only these groups (each
    group is `grid[1] * grid[2] / 4` tokens for Qwen, 256 per frame for InternVL).
    """
    groups = tokens.grid[0]
    per = tokens.vision // groups if groups else 0
    if per == 0 or stop <= start:
        return range(0)
    return range(max(0, start // per), min(groups, -(-stop // per)))


def decode_sample_video(
    data: bytes,
    rule: VisionTokenRule,
    *,
    num_frames: int,
    fps: float,
    height: int,
    width: int,
    token_range: tuple[int, int] | None = None,
    backend: str = "auto",
    key: str = "?",
    shard: str = "?",
) -> torch.Tensor:
    """The frames `rule` samples from a video (optionally only those covering `token_range`).

    SampleError naming `key`/`shard` when the video has fewer decodable frames than needed.
    """
    vt = rule.video(num_frames=num_frames, fps=fps, height=height, width=width)
    indices = list(vt.frame_indices)
    if token_range is not None:
        per_group = len(indices) // max(1, vt.grid[0])
        groups = groups_for_token_range(vt, *token_range)
        indices = indices[groups.start * per_group : groups.stop * per_group]
    return decode_frames(data, indices, vt.resized, backend=backend, key=key, shard=shard)


def decode_index_video(
    index: Any,
    i: int,
    *,
    rule: VisionTokenRule | None = None,
    token_range: tuple[int, int] | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Frames of video sample i of `index` (a LengthIndex), under the rule it was built with.

    The same rule object gives the same frame indices and size as the token count in
    `index.vision_tokens[i]`, so the decoded tensor always matches the planned length.
    """
    if index.modality_name(i) != "video":
        raise ConfigError(f"sample {i} ({index.keys[i]}) is {index.modality_name(i)}, not video")
    if rule is None:
        scan = index.header.scan
        rule = get_rule(scan.vision_rule, **scan.rule_overrides)
    members = index.read(i)
    ext = next(e for e in VIDEO_EXTS if e in members)
    return decode_sample_video(
        members[ext],
        rule,
        num_frames=int(index.num_frames[i]),
        fps=float(index.fps[i]),
        height=int(index.height[i]),
        width=int(index.width[i]),
        token_range=token_range,
        backend=backend,
        key=str(index.keys[i]),
        shard=index.shard_url(i),
    )
