"""What a vision-token rule is: re-exported from `fcp_data.vision.families` (its home).

Kept so that `from fcp_data.readers.rules_base import VisionTokens` (and the other names
below) still works; new code imports from `fcp_data.vision.families`.
"""

from __future__ import annotations

from ..vision.families import (
    PAD_PARTS,
    SPECIAL_PARTS,
    TemplatePart,
    TextCounter,
    VisionTokenRule,
    VisionTokens,
    count_template,
    qwen_digit_text_tokens,
)

__all__ = [
    "PAD_PARTS",
    "SPECIAL_PARTS",
    "TemplatePart",
    "TextCounter",
    "VisionTokenRule",
    "VisionTokens",
    "count_template",
    "qwen_digit_text_tokens",
]
