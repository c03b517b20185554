"""Decode the frames a rule samples, resized as the model expects: uint8 (T, H, W, C).

Only the collator calls this, for the sequences its replica owns. PyAV is the default backend
(wheels for every platform, no known hangs); decord is available by name. Resizing is bicubic
with antialias on float then rounded back to uint8, as qwen-vl-utils' `fetch_video` does with
torchvision (we use torch.nn.functional.interpolate, same kernel family; values may differ by a
few levels from PIL/torchvision because clamping happens at the end). A video that does not
open, a frame that fails to decode, or fewer decodable frames than the highest index asked
for raises `SampleError` naming the shard, key and frame counts: no frame is ever made up.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch

from ..errors import ConfigError, SampleError
from .optional import require
from .rules_base import VisionTokenRule, VisionTokens

if TYPE_CHECKING:
    from .length_index import LengthIndex

__all__ = ["decode_frames", "decode_index_video", "decode_sample_video", "groups_for_token_range"]


def _pyav_frames(data: bytes, indices: Sequence[int], where: _Where) -> list[np.ndarray]:
    av = require("av", "decoding video frames with PyAV")

    wanted = sorted(set(indices))
    wanted_set = set(wanted)
    got: dict[int, np.ndarray] = {}
    count, opened = 0, False  # frames decoded so far; the container opened
    try:
        with av.open(io.BytesIO(data)) as container:
            opened = True
            if not container.streams.video:
                raise where.error("the video has no video stream")
            for count, frame in enumerate(container.decode(video=0), start=1):
                if count - 1 in wanted_set:
                    got[count - 1] = frame.to_ndarray(format="rgb24")
                if count > wanted[-1]:
                    break
    except av.FFmpegError as exc:
        if not opened:
            raise where.error(f"the video does not open ({type(exc).__name__}: {exc})") from exc
        raise where.error(
            f"frame {count} does not decode ({type(exc).__name__}: {exc}); "
            f"{count} frames decoded before it"
        ) from exc
    _check_all(got, wanted, count, where)
    return [got[i] for i in indices]


def _decord_frames(data: bytes, indices: Sequence[int], where: _Where) -> list[np.ndarray]:
    decord = require("decord", "decoding video frames with decord")

    try:
        vr = decord.VideoReader(io.BytesIO(data))
        n = len(vr)
    except (decord.DECORDError, RuntimeError) as exc:
        raise where.error(f"the video does not open (decord: {exc})") from exc
    _check_all({i: None for i in indices if i < n}, sorted(set(indices)), n, where)
    try:
        return list(vr.get_batch(list(indices)).asnumpy())
    except (decord.DECORDError, RuntimeError) as exc:
        raise where.error(f"frames {list(indices)} do not decode (decord: {exc})") from exc


class _Where:
    """Names the sample in decode errors: SampleError(shard, key, reason)."""

    __slots__ = ("key", "shard")

    def __init__(self, shard: str, key: str) -> None:
        self.shard, self.key = shard, key

    def error(self, reason: str) -> SampleError:
        return SampleError(self.shard, self.key, reason)


def _check_all(got: dict[int, object], wanted: list[int], decoded: int, where: _Where) -> None:
    """Every wanted frame decoded, or SampleError: frames are never made up.

    A container header or sidecar can over-report frames (decord#54); repeating the last
    frame for the missing indices would train on a video that is not in the data.
    """
    missing = [i for i in wanted if i not in got]
    if missing:
        raise where.error(
            f"video has {decoded} decodable frames but frame {missing[0]} was asked for "
            f"({len(missing)} of {len(wanted)} requested frames missing, highest "
            f"{wanted[-1]}); its metadata over-reports frames: fix the sidecar or re-index"
        )


def decode_frames(
    data: bytes,
    indices: Sequence[int],
    resized: tuple[int, int],
    *,
    backend: Literal["pyav", "decord"] = "pyav",
    key: str = "?",
    shard: str = "?",
    native: tuple[int, int] | None = None,
) -> torch.Tensor:
    """Frames `indices` of encoded video `data`, resized to (H, W): uint8 tensor (T, H, W, 3).

    Raises SampleError(shard, key, reason) when the video does not open, a frame fails to
    decode, or it has fewer frames than the highest index; `key` and `shard` only name it.
    `native` (height, width): the size the index counted; frames of another size raise
    (they would be stretched to a resize computed for the wrong aspect).
    """
    if not indices:
        raise ValueError("no frame indices to decode")
    where = _Where(shard, key)
    if backend == "pyav":
        frames = _pyav_frames(data, indices, where)
    elif backend == "decord":
        frames = _decord_frames(data, indices, where)
    else:
        raise ConfigError(f"decode backend {backend!r}; allowed: 'pyav', 'decord'")
    if native is not None and all(native) and tuple(frames[0].shape[:2]) != tuple(native):
        got_h, got_w = frames[0].shape[:2]
        raise where.error(
            f"the video decodes at {got_w}x{got_h} (width x height) but the index says "
            f"{native[1]}x{native[0]}: it would load stretched; fix the sidecar's width/height "
            "or re-index"
        )
    x = torch.from_numpy(np.stack(frames)).permute(0, 3, 1, 2).float()
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
    backend: Literal["pyav", "decord"] = "pyav",
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
    index: LengthIndex,
    i: int,
    *,
    rule: VisionTokenRule | None = None,
    token_range: tuple[int, int] | None = None,
    backend: Literal["pyav", "decord"] = "pyav",
) -> torch.Tensor:
    """Frames of video sample i of `index`, under the rule the index was built with (default).

    The same rule object gives the same frame indices and size as the token count in
    `index.vision_tokens[i]`, so the decoded tensor always matches the planned length.
    """
    from .rules import get_rule
    from .scan import VIDEO_EXTS

    if index.modality_name(i) != "video":
        raise ValueError(f"sample {i} ({index.keys[i]}) is {index.modality_name(i)}, not video")
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
