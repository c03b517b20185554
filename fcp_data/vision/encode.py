"""One media sample -> token ids, loss targets, encoder-unit layout and whole-sample M-RoPE ids.

Sequence layout (what the index counted): the rule's template parts (special tokens, template
text, pads), then the caption's tokens, then `eod` end-of-document ids. Targets (tokens a label
may predict) are the caption and EOD tokens, plus the template text when `loss_on_template`;
special tokens and pads are never targets.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..readers.rules_base import VisionTokens
from .options import FamilySpec, VisionOptions
from .positions import mrope_positions, second_per_grid
from .template import MediaLayout, render
from .tokens import SpecialTokenIds

__all__ = ["EncodedMedia", "encode_media", "media_loss_tokens"]


@dataclass(kw_only=True, slots=True)
class EncodedMedia:
    """Ids, targets, layout and positions ([3, L] for Qwen, None for 1-D families)."""

    tokens: np.ndarray
    targets: np.ndarray
    layout: MediaLayout
    mrope: np.ndarray | None


def _template_targets(vt: VisionTokens, text_counter: Callable[[str], int]) -> np.ndarray:
    flags: list[np.ndarray] = []
    for part, value in vt.parts:
        if part == "text":
            flags.append(np.ones(text_counter(str(value)), dtype=bool))
        else:
            n = int(value) if part.endswith(("_pad", "_context")) else 1
            flags.append(np.zeros(n, dtype=bool))
    return np.concatenate(flags) if flags else np.zeros(0, dtype=bool)


def media_loss_tokens(
    vt: VisionTokens, seqlen: int, *, loss_on_template: bool, text_counter: Callable[[str], int]
) -> int:
    """Loss tokens of a media sample of `seqlen` tokens, from its template alone (no reading)."""
    if not loss_on_template:
        return seqlen - vt.total  # position 0 is a template token, never predicted
    tpl = _template_targets(vt, text_counter)
    return seqlen - vt.total + int(tpl[1:].sum())


def encode_media(
    vt: VisionTokens,
    *,
    kind: int,
    spec: FamilySpec,
    options: VisionOptions,
    token_ids: SpecialTokenIds,
    text_ids: Callable[[str], Sequence[int]],
    caption: np.ndarray,
    eod: int,
    eod_id: int,
    num_frames: int = 0,
    fps: float = 0.0,
) -> EncodedMedia:
    """Encode one image (kind 1) or video (kind 2) sample; see the module docstring."""
    tpl, layout = render(vt, kind=kind, family=spec.family, token_ids=token_ids, text_ids=text_ids)
    tokens = np.concatenate([tpl, caption.astype(np.int64), np.full(eod, eod_id, dtype=np.int64)])
    if options.loss_on_template:
        tpl_targets = _template_targets(vt, lambda s: len(text_ids(s)))
    else:
        tpl_targets = np.zeros(tpl.size, dtype=bool)
    targets = np.concatenate([tpl_targets, np.ones(caption.size + eod, dtype=bool)])
    mrope = None
    if spec.rope != "1d":
        interval = np.float32(1.0)
        if spec.time_scaled and kind == 2:
            spg = second_per_grid(
                num_frames=num_frames,
                fps=fps,
                sampled=len(vt.frame_indices),
                convention=options.second_per_grid,
                temporal_patch_size=spec.temporal,
                processor_fps=options.processor_fps,
            )
            # transformers: tokens_per_second * float32(second_per_grid_ts), in float32
            interval = np.float32(options.tokens_per_second) * np.float32(spg)
        mrope = mrope_positions(
            tokens.size,
            [layout],
            merge=spec.merge,
            interval=float(interval),
            next_text=options.next_text,
        )
    return EncodedMedia(tokens=tokens, targets=targets, layout=layout, mrope=mrope)
