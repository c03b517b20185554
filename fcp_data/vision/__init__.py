"""fcp_data.vision: what a vision-language model consumes for the tokens a replica holds.

Exact templates from the model's tokenizer (`SpecialTokenIds`, `template.render`), the pixel
payload of the encoder units a replica holds (`payload`), whole-sample M-RoPE ids sliced to the
replica (`positions`), and the options that select conventions (`VisionOptions`). The loader
uses it when `LoaderOptions.vision` is set; docs/vision-payload.md is the contract.

What a sample is lives here too, for readers, loader and planner alike: its `Modality` (the
index's codes and transformers' token types), the model families (`families`: one module per
family, one registry mapping a rule name to it: `get_rule`, `RULE_NAMES`, `family_spec`,
`family_of`), the ChatML conversation format (`is_chat`, `count_chat`, `chat_pieces`), and a
batch's encoder work for the planner (`vision_work_from_index`, `vision_work_from_media`), and
the one video decoder (`decode_video_frames`, `resolve_backend`, `DECODE_BACKENDS`: PyAV,
decord, torchcodec; see `decode`).
Importing the package loads no torch, PyAV or Pillow.
"""

from .chat import MEDIA_MARKERS, ROLES, chat_flags, chat_pieces, chat_segments, count_chat, is_chat
from .decode import BACKENDS as DECODE_BACKENDS
from .decode import DecodeStats, VideoDecodeError, decode_video_frames, resolve_backend
from .families import (
    RULE_NAMES,
    TOKEN_STRINGS,
    FamilySpec,
    UnknownRuleError,
    VisionTokenRule,
    VisionTokens,
    family_of,
    family_spec,
    get_rule,
    rule_spec,
)
from .modality import Modality
from .options import VisionOptions
from .positions import mrope_positions, second_per_grid
from .template import MediaLayout, render
from .tokens import SpecialTokenIds, TokenizerText
from .work import vision_work_from_index, vision_work_from_media

__all__ = [
    "DECODE_BACKENDS",
    "MEDIA_MARKERS",
    "ROLES",
    "RULE_NAMES",
    "TOKEN_STRINGS",
    "DecodeStats",
    "FamilySpec",
    "MediaLayout",
    "Modality",
    "SpecialTokenIds",
    "TokenizerText",
    "UnknownRuleError",
    "VideoDecodeError",
    "VisionOptions",
    "VisionTokenRule",
    "VisionTokens",
    "chat_flags",
    "chat_pieces",
    "chat_segments",
    "count_chat",
    "decode_video_frames",
    "family_of",
    "family_spec",
    "get_rule",
    "is_chat",
    "mrope_positions",
    "render",
    "resolve_backend",
    "rule_spec",
    "second_per_grid",
    "vision_work_from_index",
    "vision_work_from_media",
]
