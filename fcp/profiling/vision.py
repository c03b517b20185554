"""Measure and fit the vision side of the cost model: encoder per unit, decode per megapixel.

* Encoder: a ViT-like stack (patch embedding of 2 × 14 × 14 RGB tubelets, pre-norm blocks
  with bidirectional SDPA attention over one unit's patches and a GELU MLP, a 2×2 merger) runs
  fwd+bwd on one unit of P patches; the whole stack is timed, for several P. Fitted by
  non-negative relative least squares: t(P) = a_unit + a_patch · P + a_full · P², the
  VisionCost terms (full attention in every block; windows are a preset-only term).
* Decode: an mp4 (H.264, PyAV) of moving noise is generated in memory at several sizes and
  decoded + resized by the loader's own path (`fcp_data.vision.decode.decode_frames`); fitted as
  t = decode_seconds_per_mpix · megapixels per frame.

Both report the per-point error table like the compute fit. The defaults (2 blocks of width
128, 64..1024 patches; 3 sizes of 24 frames) take ~10 s on one CPU core.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from fcp_data.errors import ConfigError
from fcp_data.optional import require
from fcp_data.planner.cost.vision import VisionCost

from .fit import Fit, FitRow, nonneg_relative_lstsq
from .timing import _sync_for, median_seconds

__all__ = ["VisionProfile", "VisionProfileConfig", "make_test_video", "run_vision_profile"]


@dataclass(kw_only=True, slots=True, frozen=True)
class VisionProfileConfig:
    layers: int = 2
    hidden: int = 128
    heads: int = 4
    ffn: int = 512
    patch: int = 14
    temporal_patch: int = 2
    patches: tuple[int, ...] = (64, 128, 256, 512, 1024)
    sizes: tuple[tuple[int, int], ...] = ((160, 96), (320, 176), (640, 368))
    frames: int = 24
    repeats: int = 3
    decode_workers: int = 1
    device: str = "cpu"
    name: str = field(default="cpu-vit-tiny")

    def __post_init__(self) -> None:
        if min(self.patches, default=0) < 4 or any(p % 4 for p in self.patches):
            raise ConfigError(f"patches={self.patches}: each must be a multiple of 4 (2×2 merge)")
        if len(self.patches) < 3 or len(self.sizes) < 1:
            raise ConfigError("measure at least 3 patch counts and 1 decode size")
        if self.hidden % self.heads:
            raise ConfigError(f"hidden={self.hidden} must be a multiple of heads={self.heads}")


class _Block(torch.nn.Module):
    def __init__(self, hidden: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = torch.nn.LayerNorm(hidden), torch.nn.LayerNorm(hidden)
        self.qkv = torch.nn.Linear(hidden, 3 * hidden)
        self.proj = torch.nn.Linear(hidden, hidden)
        self.fc1, self.fc2 = torch.nn.Linear(hidden, ffn), torch.nn.Linear(ffn, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p, h = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(p, 3, self.heads, h // self.heads).unbind(1)
        a = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
        )
        x = x + self.proj(a.transpose(0, 1).reshape(p, h))
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm2(x))))


class TinyViT(torch.nn.Module):
    """Patch embedding, `layers` blocks attending over one unit, a 2×2 merger."""

    def __init__(self, c: VisionProfileConfig) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(3 * c.temporal_patch * c.patch**2, c.hidden)
        self.blocks = torch.nn.ModuleList(_Block(c.hidden, c.heads, c.ffn) for _ in range(c.layers))
        self.merge = torch.nn.Sequential(
            torch.nn.LayerNorm(4 * c.hidden),
            torch.nn.Linear(4 * c.hidden, 4 * c.hidden),
            torch.nn.GELU(),
            torch.nn.Linear(4 * c.hidden, c.hidden),
        )

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        x = self.embed(pixels)
        for blk in self.blocks:
            x = blk(x)
        return self.merge(x.reshape(-1, 4 * x.shape[-1]))


def time_encoder(c: VisionProfileConfig, patches: int) -> float:
    """Seconds of fwd+bwd of the tiny stack on one unit of `patches` patches."""
    dev = torch.device(c.device)
    torch.manual_seed(0)
    model = TinyViT(c).to(dev)
    x = torch.randn(patches, 3 * c.temporal_patch * c.patch**2, device=dev)

    def run() -> None:
        model(x).sum().backward()
        model.zero_grad(set_to_none=True)

    return median_seconds(run, c.repeats, sync=_sync_for(dev))


def make_test_video(width: int, height: int, frames: int, *, fps: int = 30) -> bytes:
    """An H.264 mp4 of moving noise (incompressible enough to decode like real video)."""
    av = require("av", "making a test video for the decode profile (PyAV)")

    rng = np.random.default_rng(width * height)
    base = rng.integers(0, 256, (height, width * 2, 3), dtype=np.uint8)
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as out:
        stream = out.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for i in range(frames):
            img = np.ascontiguousarray(base[:, i * 4 % width : i * 4 % width + width])
            for packet in stream.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()


def time_decode(width: int, height: int, frames: int, repeats: int) -> float:
    """Seconds per frame to decode every frame of a `width`×`height` mp4 and resize it to the
    28-multiple nearest its size (the loader's path)."""
    from fcp_data.vision.decode import decode_frames

    data = make_test_video(width, height, frames)
    size = (max(28, height // 28 * 28), max(28, width // 28 * 28))
    total = median_seconds(
        lambda: decode_frames(data, list(range(frames)), size), repeats, sync=lambda: None
    )
    return total / frames


@dataclass(kw_only=True, slots=True, frozen=True)
class VisionProfile:
    cost: VisionCost
    encoder: Fit
    decode: Fit

    def to_dict(self) -> dict[str, Any]:
        def table(fit: Fit) -> dict[str, Any]:
            rows = [
                {
                    "x": r.x,
                    "measured_s": r.measured,
                    "predicted_s": r.predicted,
                    "rel_error": r.rel_error,
                }
                for r in fit.rows
            ]
            return {"coef": fit.coef, "rows": rows, "max_abs_error": fit.max_abs_error}

        return {"encoder_fit": table(self.encoder), "decode_fit": table(self.decode)}


def run_vision_profile(c: VisionProfileConfig | None = None) -> VisionProfile:
    """Measure the tiny encoder and PyAV decode here; fit a VisionCost with its error tables."""
    c = c or VisionProfileConfig()
    p = np.array(c.patches, np.float64)
    enc = np.array([time_encoder(c, int(n)) for n in c.patches])
    a = np.stack([np.ones_like(p), p, p * p], 1)
    ce = nonneg_relative_lstsq(a, enc)
    enc_fit = Fit(
        coef={
            "seconds_per_unit": ce[0],
            "seconds_per_patch": ce[1],
            "seconds_per_full_pair": ce[2],
        },
        rows=tuple(
            FitRow(x=float(x), measured=float(y), predicted=float(v))
            for x, y, v in zip(p, enc, a @ ce)
        ),
    )
    mpix = np.array([w * h / 1e6 for w, h in c.sizes])
    dec = np.array([time_decode(w, h, c.frames, c.repeats) for w, h in c.sizes])
    cd = nonneg_relative_lstsq(mpix[:, None], dec)
    dec_fit = Fit(
        coef={"decode_seconds_per_mpix": float(cd[0])},
        rows=tuple(
            FitRow(x=float(x), measured=float(y), predicted=float(x * cd[0]))
            for x, y in zip(mpix, dec)
        ),
    )
    cost = VisionCost(
        seconds_per_patch=float(ce[1]),
        seconds_per_unit=float(ce[0]),
        seconds_per_full_pair=float(ce[2]),
        decode_seconds_per_mpix=float(cd[0]),
        decode_workers=c.decode_workers,
        name=f"{c.name} (measured)",
    )
    return VisionProfile(cost=cost, encoder=enc_fit, decode=dec_fit)


def with_vision(cost: Any, profile: VisionProfile) -> Any:
    """`cost` (a CostModel) with the measured vision coefficients attached."""
    return replace(cost, vision=profile.cost)
