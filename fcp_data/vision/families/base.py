"""What a model family is: its vision-token rule and the constants its encoder input fixes.

A rule answers three questions the data pipeline asks before any pixel is decoded: how many
frames are sampled, to what size each is resized, and how many LLM tokens (placeholder tokens
plus the special/markup tokens the chat template wraps around them) the sample costs. The
planner only sees the total; the collator uses `frame_indices` and `resized` to decode.

A `FamilySpec` is everything else the input side must know about a rule's model family to lay
out and fill those tokens: the template's token strings, patch / merge / temporal sizes,
pixel statistics, the position-id kind, what an encoder unit is (a Qwen 2-frame tubelet of
grid_h x grid_w patches, an InternVL 448 x 448 tile of 32 x 32 patches) and the payload's
shapes. Code outside `fcp_data.vision.families` asks the spec instead of comparing family
names, so a new family is one new module plus one line in the registry.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import msgspec

from ...errors import ConfigError

__all__ = [
    "PAD_PARTS",
    "SPECIAL_PARTS",
    "FamilySpec",
    "HFRopeModel",
    "TemplatePart",
    "TextCounter",
    "VisionTokenRule",
    "VisionTokens",
    "count_template",
    "qwen_digit_text_tokens",
]

# A function that counts the tokens of a short text (timestamps, frame labels). A real tokenizer
# can be plugged in; the default below is exact for Qwen2/Qwen3's tokenizer on these strings.
TextCounter = Callable[[str], int]

# One piece of a media template, in sequence order: (kind, value). Special parts are one token
# each (value 1), "text" parts a string tokenized by the model's tokenizer, pad parts (value =
# token count) the placeholders the vision encoder fills. The index counts these parts with
# `count_template` and the loader emits exactly these parts (fcp_data.vision.template), so the
# count and the emitted length come from one description.
TemplatePart = tuple[str, "str | int"]
SPECIAL_PARTS = ("vision_start", "vision_end", "img_start", "img_end")
PAD_PARTS = ("video_pad", "image_pad", "img_context")


def count_template(parts: tuple[TemplatePart, ...], text_counter: TextCounter) -> int:
    """Template (non-placeholder) tokens of `parts`: 1 per special part, counted text parts."""
    n = 0
    for kind, value in parts:
        if kind == "text":
            n += text_counter(str(value))
        elif kind in SPECIAL_PARTS:
            n += 1
        elif kind not in PAD_PARTS:
            raise ConfigError(f"template part kind {kind!r} is not text, special or pad")
    return n


def qwen_digit_text_tokens(text: str) -> int:
    """Token count of a short template string under Qwen2-family pre-tokenization.

    The Qwen2/Qwen3 pre-tokenizer splits every digit into its own token (`\\p{N}` alone), runs
    of punctuation into one token, and a letter run with its leading space into one token. So
    "<12.5 seconds>" is `<`,`1`,`2`,`.`,`5`,` seconds`,`>` = 7 tokens. We count digits one each,
    then each maximal run of letters (with its leading space) and each run of other non-space
    characters as one token. Pass a real tokenizer to a rule for an exact count with other
    vocabularies.
    """
    count = 0
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch.isdigit():
            i += 1
        elif ch.isspace() and (i + 1 >= n or text[i + 1].isdigit() or text[i + 1].isspace()):
            i += 1  # a lone space before a digit or at the end is its own token
        else:
            if ch.isspace():
                i += 1  # a space joins the letter or punctuation run that follows it
            if i < n and text[i].isalpha():
                while i < n and text[i].isalpha():
                    i += 1
            else:
                while i < n and not (text[i].isalnum() or text[i].isspace()):
                    i += 1
        count += 1
    return count


class VisionTokens(msgspec.Struct, frozen=True, kw_only=True):
    """The LLM-side cost of one image or video.

    `vision` counts placeholder tokens (`<|video_pad|>`, `<IMG_CONTEXT>`) that the vision encoder
    fills; `special` counts everything the template adds around them (start/end markers,
    Qwen3-VL timestamps, InternVL frame labels). `frame_indices` are the source frames to decode
    (empty for images) and `resized` is the (height, width) each frame is resized to before
    patching (for InternVL: the tile grid's pixel size). `parts` lists the template pieces in
    the order the loader emits them; `special` is counted from them.
    """

    vision: int
    special: int
    frame_indices: tuple[int, ...]
    resized: tuple[int, int]
    grid: tuple[int, int, int]  # (temporal groups or tiles, grid_h, grid_w) in patches
    parts: tuple[tuple[str, str | int], ...] = ()
    """The template in sequence order (see TemplatePart); `special` = count_template(parts)."""

    @property
    def total(self) -> int:
        return self.vision + self.special


class VisionTokenRule(ABC):
    """A model family's vision-token arithmetic. Implementations are pure and deterministic."""

    name: str

    @abstractmethod
    def video(self, *, num_frames: int, fps: float, height: int, width: int) -> VisionTokens:
        """Cost of a video with `num_frames` source frames at `fps`, frames `height`x`width`."""

    @abstractmethod
    def image(self, *, height: int, width: int) -> VisionTokens:
        """Cost of one image of `height`x`width` pixels."""

    @abstractmethod
    def settings(self) -> dict[str, object]:
        """Every setting that changes a count, recorded in an index header to detect mismatch."""


@dataclass(frozen=True, kw_only=True, slots=True)
class HFRopeModel:
    """The transformers classes whose `get_rope_index` a rule's checkpoints run, and the
    vision-config keywords a 1-layer weightless copy of them needs: `fcp_data.vision.rope_check`
    builds one (on the meta device, no weights) to find which `next_text` convention the
    installed transformers computes."""

    config_class: str
    model_class: str
    vision_config: tuple[tuple[str, object], ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class FamilySpec(ABC):
    """What a rule's family fixes (one per rule name: `registry.family_spec`).

    `family` names the token template ("qwen", "internvl"; `SpecialTokenIds.family`) and
    `tokens` spells its roles ((role, token string) pairs). `patch` / `merge` / `temporal`: the
    encoder's patch side, spatial merge and frames per unit; `mean` / `std` its pixel
    statistics; `rope` the position-id kind ("mrope": one grid per video, "mrope-groups":
    Qwen3-VL's one grid per temporal group, "1d": text positions only); `time_scaled`: Qwen2.5-VL
    scales temporal ids by tokens_per_second * second_per_grid. `pixel_layout`: "rows" (Qwen's
    patchified rows [P, C * temporal * patch²]) or "tiles" (images [N, 3, tile, tile]); `tile`
    the tile side in pixels (InternVL 448, None without tiles). `hf_rope_model`: the
    transformers model whose `get_rope_index` decides the rule's `next_text` (None where the
    conventions cannot differ).
    """

    rule: str
    family: str
    tokens: tuple[tuple[str, str], ...]
    patch: int
    merge: int
    temporal: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    rope: Literal["mrope", "mrope-groups", "1d"]
    time_scaled: bool
    pixel_layout: Literal["rows", "tiles"]
    tile: int | None = None
    hf_rope_model: HFRopeModel | None = None

    def token_strings(self) -> dict[str, str]:
        """Template role -> token string, e.g. {"video_pad": "<|video_pad|>", ...}."""
        return dict(self.tokens)

    @abstractmethod
    def unit_tokens(self, vt: VisionTokens) -> int:
        """LLM pad tokens of one encoder unit of `vt` (the unit's merged encoder outputs)."""

    @abstractmethod
    def unit_patches(self, vt: VisionTokens) -> int:
        """Patches the encoder attends over in one unit of `vt` (what its cost scales with)."""

    @abstractmethod
    def grid_row(self, vt: VisionTokens, units: int) -> tuple[int, int, int]:
        """The payload's `grid_thw` row of a run of `units` consecutive units of `vt`."""

    @abstractmethod
    def empty_pixels(self, row_width: int) -> tuple[int, ...]:
        """Shape of `pixel_values` of a micro-batch holding no unit (0 rows, typed columns);
        `row_width` is a Qwen row's C * temporal * patch² values."""
