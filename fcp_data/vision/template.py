"""Emit a rule's template parts as token ids and describe where each encoder unit's tokens sit.

This is the loader's half of the one template description: `VisionTokens.parts` (made by the
rule, counted by the index with `count_template`) is walked here part by part, so the emitted
length equals the counted one by construction; `render` still checks it and names the sample.

An encoder unit is what the vision tower encodes independently: a Qwen tubelet (2 frames; an
image repeated to 2) of grid_h*grid_w/4 merged tokens, an InternVL tile or frame of 256 tokens.
A unit's tokens are one contiguous run of pads, so a replica holding any of them encodes the
whole unit and keeps the tokens it holds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError
from .families import PAD_PARTS, SPECIAL_PARTS, VisionTokens, spec_of_family
from .modality import Modality
from .tokens import SpecialTokenIds

__all__ = ["MediaLayout", "render"]


@dataclass(kw_only=True, slots=True)
class MediaLayout:
    """Where one image's or video's encoder units sit in its sequence (offsets in tokens).

    `unit_starts[u]` is the first pad token of unit u; every unit has `unit_tokens` pads.
    `pad_runs` lists (first token, first unit, unit count) of each pad part (one per video for
    Qwen2/2.5, one per temporal group for Qwen3-VL, one per frame/image for InternVL): M-RoPE
    treats each run as one grid. `kind` is the media's token type as transformers'
    mm_token_type_ids spells it (`Modality.token_type`: 1 image, 2 video).
    """

    kind: int
    family: str
    unit_tokens: int
    unit_starts: np.ndarray
    pad_runs: tuple[tuple[int, int, int], ...]
    vt: VisionTokens

    @property
    def modality(self) -> Modality:
        """`kind` as a `Modality` (Modality.IMAGE or Modality.VIDEO)."""
        return Modality.of_token_type(self.kind)

    @property
    def num_units(self) -> int:
        return int(self.unit_starts.size)

    def unit_range(self, u: int) -> tuple[int, int]:
        s = int(self.unit_starts[u])
        return s, s + self.unit_tokens


def render(
    vt: VisionTokens,
    *,
    kind: int,
    family: str,
    token_ids: SpecialTokenIds | None,
    text_ids: Callable[[str], Sequence[int]],
    offset: int = 0,
    placeholder: tuple[int, int] = (0, 0),
) -> tuple[np.ndarray, MediaLayout]:
    """Token ids of the template + pads and its layout, offsets shifted by `offset`.

    Without `token_ids`, special and text parts emit `placeholder[0]` per counted token and pads
    `placeholder[1]` (shape-only runs); with them, the family's real ids and tokenized text.
    """
    if not vt.parts:
        raise ConfigError(
            f"{family} VisionTokens carries no template parts; rebuild it with a rule"
        )
    unit_tokens = spec_of_family(family).unit_tokens(vt)
    chunks: list[np.ndarray] = []
    starts: list[int] = []
    runs: list[tuple[int, int, int]] = []
    at = offset
    for part, value in vt.parts:
        if part == "text":
            ids = np.asarray(text_ids(str(value)), dtype=np.int64)
            if token_ids is None:
                ids = np.full(ids.size, placeholder[0], dtype=np.int64)
        elif part in SPECIAL_PARTS:
            tid = placeholder[0] if token_ids is None else token_ids[part]
            ids = np.array([tid], dtype=np.int64)
        elif part in PAD_PARTS:
            n = int(value)
            if unit_tokens <= 0 or n % unit_tokens:
                raise ConfigError(f"{n} pads are not whole units of {unit_tokens} tokens")
            tid = placeholder[1] if token_ids is None else token_ids[part]
            ids = np.full(n, tid, dtype=np.int64)
            runs.append((at, len(starts), n // unit_tokens))
            starts.extend(range(at, at + n, unit_tokens))
        else:
            raise ConfigError(f"unknown template part {part!r}")
        chunks.append(ids)
        at += ids.size
    tokens = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int64)
    if tokens.size != vt.total:
        raise ConfigError(
            f"the template emits {tokens.size} tokens but the rule counts {vt.total}: the index "
            "was counted with another tokenizer than the loader's; rebuild the index with it"
        )
    layout = MediaLayout(
        kind=kind,
        family=family,
        unit_tokens=unit_tokens,
        unit_starts=np.asarray(starts, dtype=np.int64),
        pad_runs=tuple(runs),
        vt=vt,
    )
    return tokens, layout
