"""M-RoPE position ids of one whole sample (Qwen2/2.5/3-VL), computed before zigzag slicing.

Positions after a video depend on the whole video's grid and fps, so they are computed per
sample on the full sequence and only then sliced to a replica's chunks (`positions[:, held]`).

* Text and template tokens: one id on all 3 axes, counting on from the previous run.
* A pad run with merged grid (t, h, w) starting at id s: temporal s + floor(k * interval),
  height s + i, width s + j, in (t, h, w) row-major order (the encoder's merged output order).
  interval is 1 for Qwen2-VL (and for images), `tokens_per_second * second_per_grid_t` for
  Qwen2.5-VL videos; Qwen3-VL makes every temporal group its own run with t = 1, so the
  temporal id restarts at the run's start and time is carried by the "<t seconds>" text.
* The next text run starts at max(run) + 1 (`next_text="max+1"`, Qwen's fine-tuning code and
  transformers before 5.x) or at s + max(h, w) (`"spatial"`, the installed transformers 5.x
  `get_rope_index`). They differ only when a video's last temporal id passes s + max(h, w) - 1,
  e.g. 12 tubelets at interval 2 on a 4x4 merged grid: 22 + 1 vs 4. `VisionOptions(next_text=
  "auto")` (the default) picks the one the installed transformers computes (rope_check).

The interval is multiplied in float32 and truncated, as transformers does with its float32
`second_per_grid_ts` tensor, so ids agree at exact multiples.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from ..errors import ConfigError
from .modality import Modality
from .template import MediaLayout

__all__ = ["NEXT_TEXT", "mrope_positions", "second_per_grid"]

NEXT_TEXT = ("max+1", "spatial")


def second_per_grid(
    *,
    num_frames: int,
    fps: float,
    sampled: int,
    convention: Literal["measured", "constant"],
    temporal_patch_size: int = 2,
    processor_fps: float = 2.0,
) -> float:
    """Seconds one tubelet spans: 2 / sample_fps (qwen-vl-utils) or 2 / processor fps.

    qwen-vl-utils measures sample_fps = sampled / num_frames * fps and passes it to the
    processor; Qwen's fine-tuning script uses temporal_patch_size / video_processor.fps (1.0).
    They differ whenever the frame-count clamps bite (e.g. a 1 s clip: 4 frames at min_frames,
    sample_fps 4 -> 0.5 s per tubelet instead of 1.0).
    """
    if convention == "constant":
        return temporal_patch_size / processor_fps
    if convention != "measured":
        raise ConfigError(f"second_per_grid convention {convention!r}; allowed: measured, constant")
    sample_fps = sampled / max(num_frames, 1e-6) * fps
    return temporal_patch_size / sample_fps


def mrope_positions(
    length: int,
    layouts: list[MediaLayout],
    *,
    merge: int = 2,
    interval: float = 1.0,
    next_text: str = "max+1",
) -> np.ndarray:
    """int64 [3, length] M-RoPE ids of a sample whose media runs are described by `layouts`."""
    if next_text not in NEXT_TEXT:
        raise ConfigError(f"next_text={next_text!r}; allowed: {', '.join(NEXT_TEXT)}")
    out = np.empty((3, length), dtype=np.int64)
    runs = sorted(
        (start, n_units, lay) for lay in layouts for start, _first, n_units in lay.pad_runs
    )
    tok, pos = 0, 0
    for start, n_units, lay in runs:
        if start > tok:  # text run before the pads
            out[:, tok:start] = np.arange(pos, pos + start - tok)
            pos += start - tok
        gh, gw = lay.vt.grid[1] // merge, lay.vt.grid[2] // merge
        step = np.float32(interval) if lay.modality is Modality.VIDEO else np.float32(1.0)
        t_ids = (np.arange(n_units, dtype=np.float32) * step).astype(np.int64)
        n = n_units * gh * gw
        out[0, start : start + n] = pos + np.repeat(t_ids, gh * gw)
        out[1, start : start + n] = pos + np.tile(np.repeat(np.arange(gh), gw), n_units)
        out[2, start : start + n] = pos + np.tile(np.arange(gw), n_units * gh)
        if next_text == "max+1":
            pos = pos + max(int(t_ids[-1]), gh - 1, gw - 1) + 1
        else:
            pos = pos + max(gh, gw)
        tok = start + n
    if tok < length:
        out[:, tok:] = np.arange(pos, pos + length - tok)
    return out
