"""`fcp profile --vision`: also time a ViT-like encoder and PyAV decode, fit the vision terms.

The fitted `VisionCost` is attached to the saved cost model (`CostModel.vision`), so
`fcp plan --cost FILE` and `plan_global_batch(..., vision=...)` price vision work with it; the
per-point error tables go to the profile's "vision" section.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

__all__ = ["add_arguments", "attach_vision"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--vision",
        action="store_true",
        help="also time a ViT-like encoder (fwd+bwd per unit of 64..1024 patches) and PyAV "
        "decode of generated mp4s; fit and save the vision terms (~10 s)",
    )


def attach_vision(profile: Any, args: argparse.Namespace, console: Any) -> None:
    """Run the vision measurements when asked; print their tables; attach them to `profile`."""
    if not getattr(args, "vision", False):
        return
    from rich.table import Table

    from fcp.profiling.vision import VisionProfileConfig, run_vision_profile

    vp = run_vision_profile(VisionProfileConfig(device=args.device))
    for title, fit, unit in (
        ("encoder fit: t(P) = a_unit + a_patch·P + a_full·P²  (one unit, fwd+bwd)", vp.encoder,
         "patches"),
        ("decode fit: t = decode_seconds_per_mpix · megapixels  (per frame, + resize)",
         vp.decode, "megapixels"),
    ):  # fmt: skip
        t = Table(title=title)
        for col in (unit, "measured (ms)", "fitted (ms)", "error"):
            t.add_column(col, justify="right")
        for row in fit.rows:
            t.add_row(
                f"{row.x:g}",
                f"{row.measured * 1e3:.2f}",
                f"{row.predicted * 1e3:.2f}",
                f"{row.rel_error:+.1%}",
            )
        console.print(t)
    profile.cost = dataclasses.replace(profile.cost, vision=vp.cost)
    profile.meta["vision"] = vp.to_dict()
    console.print(
        f"vision: encoder error max {vp.encoder.max_abs_error:.1%}, decode error max "
        f"{vp.decode.max_abs_error:.1%}"
    )
