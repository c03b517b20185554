"""Video decode per backend on this machine: the CP members' frame sets, PyAV vs the others.

One H.264 clip (GOP 30, 2 B-frames) is made with PyAV; the qwen2.5-vl rule samples its frames
and a degree-4 zigzag group's members hold their two chunks each. Each backend that loads
(`fcp_data.vision.decode`: pyav, decord, torchcodec on CPU, torchcodec on CUDA when a GPU is
there) decodes every member's frames, best of `repeats`; reported: seconds per backend, the
ratio to PyAV, and the largest pixel difference to PyAV's frames (PyAV and decord agree bit for
bit on the clips of the tests; torchcodec's colour conversion may differ by a level or two, which
the suite records rather than hides). A backend that does not load is skipped with the reason
(torchcodec's PyPI wheel is a CUDA build: it does not load on a CPU-only machine).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from .common import skipped

__all__ = ["bench_video_decode"]


def _member_frames(vt: Any, degree: int) -> list[list[int]]:
    """Frames of the tubelets with a pad token in each member's two zigzag chunks."""
    from fcp_data.collate import chunk_bounds, padded_seqlen

    per = vt.grid[1] * vt.grid[2] // 4
    units = [(1 + u * per, 1 + (u + 1) * per) for u in range(vt.grid[0])]
    out = []
    for member in range(degree):
        held = sorted(
            {
                u
                for a, b in chunk_bounds(padded_seqlen(vt.total, degree), degree, member)
                for u, (s, e) in enumerate(units)
                if max(s, a) < min(e, b)
            }
        )
        out.append([vt.frame_indices[2 * u + j] for u in held for j in (0, 1)])
    return out


def bench_video_decode(cfg: dict[str, Any]) -> dict[str, Any]:
    """cfg: width, height, frames, fps, degree, repeats, cuda (try torchcodec on CUDA)."""
    import importlib.util
    import sys
    from pathlib import Path

    from fcp_data.errors import ConfigError, MissingDependencyError
    from fcp_data.vision import get_rule
    from fcp_data.vision.decode import decode_video_frames, resolve_backend

    if importlib.util.find_spec("av") is None:
        return skipped("PyAV is not installed (pip install 'fcp[video]')")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import tempfile

    from media_decode import encode_clip

    w, h, n, fps = cfg["width"], cfg["height"], cfg["frames"], cfg["fps"]
    with tempfile.TemporaryDirectory() as tmp:
        data = encode_clip(Path(tmp) / "clip.mp4", w, h, n, fps, 30)
    vt = get_rule("qwen2.5-vl").video(num_frames=n, fps=fps, height=h, width=w)
    members = _member_frames(vt, cfg["degree"])
    candidates = [("pyav", "cpu"), ("decord", "cpu"), ("torchcodec", "cpu")]
    if cfg.get("cuda"):
        candidates.append(("torchcodec", "cuda"))
    rows, skips, ref = [], [], None
    for backend, device in candidates:
        try:
            resolve_backend(backend, device)
            decode_video_frames(data, members[0][:2], backend=backend, device=device)  # warm
        except (MissingDependencyError, ConfigError, RuntimeError) as exc:
            skips.append({"backend": f"{backend}/{device}", "reason": f"{exc}"[:300]})
            continue
        best, frames = float("inf"), []
        for _ in range(cfg["repeats"]):
            t0 = time.perf_counter()
            frames = [decode_video_frames(data, m, backend=backend, device=device) for m in members]
            best = min(best, time.perf_counter() - t0)
        if ref is None:
            ref = (best, frames)
        diff = max(int(np.abs(a.astype(np.int16) - b).max()) for a, b in zip(frames, ref[1]))
        rows.append({"backend": backend, "device": device, "seconds": best,
                     "vs_pyav": best / ref[0], "max_pixel_diff_vs_pyav": diff})  # fmt: skip
    return {"status": "ok", "clip": {"width": w, "height": h, "frames": n, "fps": fps,
            "gop": 30, "degree": cfg["degree"]}, "rows": rows, "skipped": skips}  # fmt: skip
