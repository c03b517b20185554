"""fcp.profiling: measure this machine and fit the planner's cost model (`fcp profile`).

    from fcp.profiling import ProfileConfig, run_profile, shape_from_name
    profile = run_profile(ProfileConfig.quick(shape_from_name("cpu-small")))
    profile.save("my.json")               # CostModel.load("my.json") reads it

The measured profiles that ship with fcp are library data: `fcp_data.profiles` finds them by
name (`CostModel.load("cpu-small")`). `spawn` starts the local process groups the measurements
run on; `ring_timing` times real ring groups for `fit_ring`.

Submodules load lazily (PEP 562): importing the package imports neither torch nor numpy.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "SHAPES",
    "ComputePoint",
    "Fit",
    "FitRow",
    "ModelShape",
    "P2PPoint",
    "Profile",
    "ProfileConfig",
    "fit_compute",
    "fit_p2p",
    "fit_ring",
    "fit_warnings",
    "measure_p2p",
    "measure_ring",
    "ring_fit_problems",
    "run_profile",
    "shape_from_name",
    "with_ring",
]

_WHERE = {
    "SHAPES": "shapes", "ModelShape": "shapes", "shape_from_name": "shapes",
    "ComputePoint": "timing",
    "Fit": "fit", "FitRow": "fit", "fit_compute": "fit", "fit_p2p": "fit", "fit_warnings": "fit",
    "P2PPoint": "p2p", "measure_p2p": "p2p",
    "Profile": "measure", "ProfileConfig": "measure", "run_profile": "measure",
    "fit_ring": "ring", "measure_ring": "ring", "with_ring": "ring",
    "ring_fit_problems": "ring",
}  # fmt: skip


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
