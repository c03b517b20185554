"""The InternVL rule: re-exported from `fcp_data.vision.families`.

Kept so that `from fcp_data.readers.rules_internvl import closest_grid` (and the other names
below) still works; the family lives in `fcp_data.vision.families.internvl`.
"""

from __future__ import annotations

from ..vision.families import (
    IMAGE_SIZE,
    NUM_IMAGE_TOKEN,
    InternVLRule,
    InternVLRuleConfig,
    closest_grid,
)

__all__ = ["IMAGE_SIZE", "NUM_IMAGE_TOKEN", "InternVLRule", "InternVLRuleConfig", "closest_grid"]
