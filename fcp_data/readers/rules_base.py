"""What a vision-token rule is: from a frame size (and a frame count for video) to LLM tokens.

A rule answers three questions the data pipeline asks before any pixel is decoded: how many
frames are sampled, to what size each is resized, and how many LLM tokens (placeholder tokens
plus the special/markup tokens the chat template wraps around them) the sample costs. The
planner only sees the total; the collator uses `frame_indices` and `resized` to decode.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

import msgspec

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
            raise ValueError(f"template part kind {kind!r} is not text, special or pad")
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
