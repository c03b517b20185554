"""Vision-token rules by name: "qwen2-vl", "qwen2.5-vl", "qwen3-vl", "internvl".

Qwen2-VL and Qwen2.5-VL share qwen-vl-utils' arithmetic with patch 14 (factor 28); Qwen3-VL uses
patch 16 (factor 32) and adds a "<t seconds>" timestamp before each 2-frame group.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import typing

from ..errors import ConfigError
from .rules_base import TextCounter, VisionTokenRule
from .rules_internvl import InternVLRule, InternVLRuleConfig
from .rules_qwen import QwenRuleConfig, QwenVisionRule

__all__ = ["RULE_NAMES", "get_rule"]

RULE_NAMES = ("qwen2-vl", "qwen2.5-vl", "qwen3-vl", "internvl")
MAX_SETTING = 2**31 - 1  # counts and pixel areas must fit the index's int32 columns
# (low, high) settings that must be ordered when both are given
_ORDERED = (
    ("min_frames", "max_frames"),
    ("video_min_pixels", "video_max_pixels"),
    ("image_min_pixels", "image_max_pixels"),
    ("min_dynamic_patch", "max_dynamic_patch"),
)


def _check_setting(rule: str, name: str, value: object, hint: object) -> None:
    """ConfigError naming the setting unless `value` fits its declared type and range.

    Overrides come from `--rule-option KEY=VALUE` (JSON) or Python; a list, a negative fps, or
    nan would otherwise be stored in the index header (nan as null: an index that cannot be
    opened) or crash the first video with a raw TypeError.
    """
    allowed = set(typing.get_args(hint)) or {hint}
    if value is None and type(None) in allowed:
        return
    if bool in allowed:
        if not isinstance(value, bool):
            raise ConfigError(f"rule {rule!r} setting {name}={value!r} must be true or false")
        return
    integral = int in allowed and float not in allowed
    ok = isinstance(value, numbers.Integral if integral else numbers.Real) and not isinstance(
        value, bool
    )
    if not ok or not math.isfinite(float(value)) or not 0 < float(value) <= MAX_SETTING:  # type: ignore[arg-type]
        kind = "an integer" if integral else "a finite number"
        raise ConfigError(
            f"rule {rule!r} setting {name}={value!r} must be {kind} in (0, {MAX_SETTING}]"
        )


def get_rule(
    name: str, *, text_counter: TextCounter | None = None, **overrides: object
) -> VisionTokenRule:
    """The rule called `name`, with config fields overridden by keyword (e.g. num_frames=8).

    `text_counter` counts template text (timestamps, frame labels) exactly with the model's
    tokenizer; by default Qwen2-family digit splitting is assumed.
    """
    if name in ("qwen2-vl", "qwen2.5-vl", "qwen3-vl"):
        base = {"patch_size": 16, "timestamps": True} if name == "qwen3-vl" else {}
        cls, build = QwenRuleConfig, lambda cfg: QwenVisionRule(name, cfg, text_counter)
    elif name == "internvl":
        base = {}
        cls, build = InternVLRuleConfig, lambda cfg: InternVLRule(cfg, text_counter)
    else:
        raise ValueError(f"unknown vision rule {name!r}; choose one of {', '.join(RULE_NAMES)}")
    allowed = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(overrides) - allowed)
    if unknown:
        raise ValueError(
            f"rule {name!r} has no setting {', '.join(unknown)}; "
            f"allowed: {', '.join(sorted(allowed))}"
        )
    hints = typing.get_type_hints(cls)
    for key, value in overrides.items():
        _check_setting(name, key, value, hints[key])
    merged = {**base, **overrides}
    cfg = cls(**merged)
    for low, high in _ORDERED:
        lo, hi = getattr(cfg, low, None), getattr(cfg, high, None)
        if lo is not None and hi is not None and lo > hi:  # type: ignore[operator]
            raise ConfigError(f"rule {name!r}: {low}={lo} is above {high}={hi}")
    return build(cfg)
