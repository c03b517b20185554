"""A replica's vision payload for one micro-batch: pixels of the units it holds, where they go.

For each sequence of the micro-batch this replica holds the global positions
`packed.global_positions[k]` (its two zigzag chunks). An encoder unit (tubelet, tile, frame)
whose pad tokens intersect them is decoded and encoded here; consecutive held units of one
image or video form a run, one `grid_thw` row (units, grid_h, grid_w in patches) that the
vision tower encodes as one item (no attention, norm or position term crosses a unit, so a run
of units encodes exactly as the same units inside the whole video). A unit cut by a chunk edge
is held by both owners: each encodes it whole and keeps only its own tokens (`scatter` -1 for
the others); `partial_units` counts them. See docs/vision-payload.md for the contract.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..optional import require
from .families import FamilySpec, qwen_rows
from .media import decode_video_frames, internvl_tiles, load_image, resize_frames, resize_image
from .modality import Modality
from .options import VisionOptions
from .pixels import normalize
from .template import MediaLayout

__all__ = ["PayloadParts", "build_payload", "sequence_payload"]


@dataclass(kw_only=True, slots=True)
class PayloadParts:
    """numpy pieces of a micro-batch payload (MicroBatch turns them into tensors)."""

    pixel_values: list[np.ndarray] = field(default_factory=list)
    grid_thw: list[tuple[int, int, int]] = field(default_factory=list)
    runs: list[tuple[int, int, int, int]] = field(default_factory=list)
    scatter: list[np.ndarray] = field(default_factory=list)
    mrope: list[np.ndarray] = field(default_factory=list)
    units: int = 0
    partial_units: int = 0


def _held_units(layout: MediaLayout, inv: np.ndarray) -> tuple[list[int], int]:
    held, partial = [], 0
    for u in range(layout.num_units):
        s, e = layout.unit_range(u)
        r = inv[s:e]
        if (r >= 0).any():
            held.append(u)
            partial += int((r < 0).any())
    return held, partial


def _runs(units: Sequence[int]) -> list[list[int]]:
    out: list[list[int]] = []
    for u in units:
        if out and out[-1][-1] == u - 1:
            out[-1].append(u)
        else:
            out.append([u])
    return out


def _unit_pixels(
    layout: MediaLayout,
    units: Sequence[int],
    media: bytes,
    spec: FamilySpec,
    opts: VisionOptions,
    size: tuple[int, int] | None = None,
    *,
    backend: str = "auto",
    device: str = "cpu",
) -> np.ndarray:
    """Encoder input of `units` in order: Qwen rows or InternVL tiles [n, 3, tile, tile].

    Frames come from the one decoder (fcp_data.vision.decode) with the loader's backend, which
    seeks to the keyframe before each held run of units, so a member holding the first and
    the last chunk of a video decodes those GOPs, not the whole video."""

    def frames_at(idx: list[int]) -> np.ndarray:
        return decode_video_frames(media, idx, size, backend=backend, device=device)

    vt = layout.vt
    mean = opts.mean or spec.mean
    std = opts.std or spec.std
    if spec.pixel_layout == "rows":
        if layout.modality is Modality.VIDEO:
            t = spec.temporal
            idx = [vt.frame_indices[u * t + j] for u in units for j in range(t)]
            frames = resize_frames(frames_at(idx), vt.resized)
        else:  # an image is its own tubelet, repeated to temporal_patch_size frames
            frames = np.repeat(
                resize_image(load_image(media, size), vt.resized)[None], spec.temporal, axis=0
            )
        x = normalize(frames, mean, std)  # [2n, 3, H, W]
        x = x.reshape(len(units), spec.temporal, *x.shape[1:])
        return qwen_rows(x, patch=spec.patch, merge=spec.merge)
    side = vt.resized[0] if layout.modality is Modality.VIDEO else spec.tile
    if layout.modality is Modality.VIDEO:
        raw = frames_at([vt.frame_indices[u] for u in units])
        tiles = np.stack([resize_image(_pil(f), (side, side)) for f in raw])
    else:
        rows, cols = vt.grid[1], vt.grid[2]
        tiles = internvl_tiles(
            load_image(media, size),
            rows=rows,
            cols=cols,
            thumbnail=vt.grid[0] > rows * cols,
            tiles=units,
            side=side,  # the family's tile (InternVL 448)
        )
    return normalize(tiles, mean, std)


def _pil(frame: np.ndarray) -> Any:
    return require("PIL.Image", "resizing InternVL video frames (Pillow)").fromarray(frame)


def sequence_payload(
    out: PayloadParts,
    k: int,
    *,
    layout: MediaLayout | None,
    media: bytes | None,
    mrope: np.ndarray | None,
    length: int,
    held: np.ndarray,
    offset: int,
    padded_len: int,
    spec: FamilySpec,
    opts: VisionOptions,
    media_size: tuple[int, int] | None = None,
    backend: str = "auto",
    device: str = "cpu",
) -> None:
    """Append sequence k's positions and (if it has media) pixels, runs and scatter to `out`.

    `media_size` (height, width) is what the index counted the media at; decoded media of
    another size raises ValueError (the loader skips and counts it, or raises by key).
    """
    if spec.rope != "1d":
        full = mrope if mrope is not None else np.tile(np.arange(length), (3, 1))
        if padded_len > length:  # padding continues the text ids past the largest id
            start = int(full.max()) + 1
            tail = np.tile(np.arange(start, start + padded_len - length), (3, 1))
            full = np.concatenate([full, tail], axis=1)
        out.mrope.append(full[:, held])
    if layout is None or media is None or not opts.payload:
        return
    inv = np.full(padded_len, -1, dtype=np.int64)
    inv[held] = offset + np.arange(held.size)
    units, partial = _held_units(layout, inv)
    if not units:
        return
    pixels = _unit_pixels(
        layout, units, media, spec, opts, media_size, backend=backend, device=device
    )
    per_unit = pixels.shape[0] // len(units)
    at = 0
    for run in _runs(units):
        n = len(run)
        out.pixel_values.append(pixels[at * per_unit : (at + n) * per_unit])
        at += n
        out.grid_thw.append(spec.grid_row(layout.vt, n))
        out.runs.append((k, layout.kind, run[0], n))
        out.scatter.append(np.concatenate([inv[slice(*layout.unit_range(u))] for u in run]))
    out.units += len(units)
    out.partial_units += partial
    # count check: every held pad token is filled by exactly one kept encoder output
    pads = np.zeros(padded_len, dtype=bool)
    for u in range(layout.num_units):
        pads[slice(*layout.unit_range(u))] = True
    kept = sum(int((s >= 0).sum()) for s in out.scatter[len(out.scatter) - len(_runs(units)) :])
    if kept != int(pads[held].sum()):
        raise AssertionError(f"scatter keeps {kept} rows for {int(pads[held].sum())} held pads")


def build_payload(parts: PayloadParts, spec: FamilySpec, *, row_width: int) -> dict[str, Any]:
    """Tensors of a micro-batch payload from its pieces (empty but typed when nothing is held)."""
    import torch

    def cat(xs: list[np.ndarray], empty: tuple[int, ...], dtype: Any) -> torch.Tensor:
        if not xs:
            return torch.zeros(empty, dtype=dtype)
        return torch.from_numpy(np.ascontiguousarray(np.concatenate(xs)))

    pix_empty = spec.empty_pixels(row_width)
    return {
        "pixel_values": cat(parts.pixel_values, pix_empty, torch.float32),
        "grid_thw": torch.tensor(parts.grid_thw, dtype=torch.int64).reshape(-1, 3),
        "vision_runs": torch.tensor(parts.runs, dtype=torch.int64).reshape(-1, 4),
        "vision_scatter": cat(parts.scatter, (0,), torch.int64),
        "mrope_position_ids": (
            torch.from_numpy(np.ascontiguousarray(np.concatenate(parts.mrope, axis=1)))
            if parts.mrope
            else (torch.zeros((3, 0), dtype=torch.int64) if spec.rope != "1d" else None)
        ),
        "vision_units": parts.units,
        "vision_partial_units": parts.partial_units,
    }
