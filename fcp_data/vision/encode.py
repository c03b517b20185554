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

from .families import FamilySpec, VisionTokens
from .modality import Modality
from .options import VisionOptions
from .positions import mrope_positions, second_per_grid
from .rope_check import resolve_next_text
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
    vt: VisionTokens,
    seqlen: int,
    *,
    loss_on_template: bool,
    text_counter: Callable[[str], int],
    before: Sequence[tuple[int, bool]] = (),
    after: Sequence[tuple[int, bool]] | None = None,
) -> int:
    """Loss tokens (targets at positions 1..L-1) of a media sample, without tokenizing it.

    `before`/`after` are (token count, is_target) pieces around the media (a conversation);
    by default everything after the template (caption and end-of-document ids) is a target.
    """
    if loss_on_template:
        tpl = _template_targets(vt, text_counter)
    else:  # no template token is a target: nothing to tokenize
        tpl = np.zeros(vt.total, dtype=bool)
    flags = [np.full(n, t, dtype=bool) for n, t in before]
    flags.append(tpl)
    head = sum(f.size for f in flags)
    if after is None:
        flags.append(np.ones(seqlen - head, dtype=bool))
    else:
        flags += [np.full(n, t, dtype=bool) for n, t in after]
        flags.append(np.ones(seqlen - sum(f.size for f in flags), dtype=bool))  # EOD ids
    allf = np.concatenate(flags)
    return int(allf[1:].sum())


def encode_media(
    vt: VisionTokens,
    *,
    kind: int,
    spec: FamilySpec,
    options: VisionOptions,
    token_ids: SpecialTokenIds,
    text_ids: Callable[[str], Sequence[int]],
    caption: np.ndarray | None = None,
    before: Sequence[tuple[np.ndarray, bool]] = (),
    after: Sequence[tuple[np.ndarray, bool]] = (),
    eod: int,
    eod_id: int,
    num_frames: int = 0,
    fps: float = 0.0,
) -> EncodedMedia:
    """Encode one image (kind 1) or video (kind 2) sample; see the module docstring.

    Text around the media is `caption` (after it, all targets) or `before` / `after` lists of
    (ids, is_target) pieces (a conversation, fcp_data.vision.chat).
    """
    if caption is not None:
        after = [(caption, True)]
    head = sum(int(ids.size) for ids, _ in before)
    tpl, layout = render(
        vt, kind=kind, family=spec.family, token_ids=token_ids, text_ids=text_ids, offset=head
    )
    if options.loss_on_template:
        tpl_targets = _template_targets(vt, lambda s: len(text_ids(s)))
    else:
        tpl_targets = np.zeros(tpl.size, dtype=bool)
    pieces = [*before, (tpl, tpl_targets), *after, (np.full(eod, eod_id, dtype=np.int64), True)]
    tokens = np.concatenate([np.asarray(ids, dtype=np.int64) for ids, _ in pieces])
    targets = np.concatenate(
        [
            t if isinstance(t, np.ndarray) else np.full(len(ids), bool(t), dtype=bool)
            for ids, t in pieces
        ]
    )
    mrope = None
    if spec.rope != "1d":
        interval = np.float32(1.0)
        if spec.time_scaled and kind == Modality.VIDEO.token_type:
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
            next_text=resolve_next_text(options.next_text, spec),  # "auto": cached probe
        )
    return EncodedMedia(tokens=tokens, targets=targets, layout=layout, mrope=mrope)
