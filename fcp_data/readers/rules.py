"""Vision-token rules by name: "qwen2-vl", "qwen2.5-vl", "qwen3-vl", "internvl".

Qwen2-VL and Qwen2.5-VL share qwen-vl-utils' arithmetic with patch 14 (factor 28); Qwen3-VL uses
patch 16 (factor 32) and adds a "<t seconds>" timestamp before each 2-frame group.
"""

from __future__ import annotations

import dataclasses

from .rules_base import TextCounter, VisionTokenRule
from .rules_internvl import InternVLRule, InternVLRuleConfig
from .rules_qwen import QwenRuleConfig, QwenVisionRule

__all__ = ["RULE_NAMES", "get_rule"]

RULE_NAMES = ("qwen2-vl", "qwen2.5-vl", "qwen3-vl", "internvl")


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
    return build(cls(**{**base, **overrides}))
