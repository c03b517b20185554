"""The loader's sample encoder, made once from its source, tokenizer, vision rule and options.

Everything an encoder needs is settled here, in the main process, before any DataLoader worker
starts: the rule (the source's own, or the one given), the template's special-token ids, the
vision options with `next_text="auto"` probed once (workers never import transformers), the
text and caption fields each source was indexed with, and the video decoder resolved once so a
run never mixes libraries.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from ..vision.decode import resolve_backend
from ..vision.families import VisionTokenRule, rule_spec
from ..vision.modality import Modality
from ..vision.sample import VisionEncoder
from .blend import read_fields_for
from .encode import CustomEncoder, SampleEncoder
from .options import LoaderOptions
from .source import resolve_rule, tokenizer_hint
from .token_source import open_token_store
from .types import SampleSource

__all__ = ["make_encoder"]


def make_encoder(
    source: SampleSource,
    tokenizer: Any,
    vision_rule: VisionTokenRule | str | None,
    opts: LoaderOptions,
) -> SampleEncoder | CustomEncoder:
    """The encoder of every sample: the user's (`opts.encode`) or the loader's own.

    `tokenizer` is the loader's (already `as_tokenizer`), or None.
    """
    if opts.encode is not None:
        return CustomEncoder(fn=opts.encode)
    rule = resolve_rule(source, vision_rule)
    text_field, caption_field = read_fields_for(source, opts.text_field, opts.caption_field)
    backend = _decode_backend(source, opts)
    text, vision = tokenizer, None
    if opts.vision is not None and rule is not None:
        from ..vision import TokenizerText

        text = None if tokenizer is None else TokenizerText(tokenizer)
        vision, rule = _vision_encoder(rule, tokenizer, text, opts, caption_field, backend)
    encoder = SampleEncoder(
        tokenizer=text,
        vision_encoder=vision,
        rule=rule,
        text_field=text_field,
        caption_field=caption_field,
        eod_id=opts.eod_id,
        special_token_id=opts.special_token_id,
        vision_token_id=opts.vision_token_id,
        decode_backend=backend,
        decode_device=opts.decode_device,
        chat_loss_roles=opts.chat_loss_roles,
        tokenizer_hint=tokenizer_hint(source),
    )
    if opts.token_store:
        encoder.store = open_token_store(source)
    return encoder


def _vision_encoder(
    rule: VisionTokenRule,
    tokenizer: Any,
    text: Any,
    opts: LoaderOptions,
    caption_field: str,
    backend: str,
) -> tuple[VisionEncoder, VisionTokenRule]:
    """The vision path's encoder and the rule it counts template text with (`text`: the
    tokenizer as `TokenizerText`, or None)."""
    from ..vision import SpecialTokenIds
    from ..vision.rope_check import resolve_vision_options

    assert opts.vision is not None
    token_ids = opts.vision.token_ids or SpecialTokenIds.from_tokenizer(tokenizer, rule.name)
    if text is not None and hasattr(rule, "text_counter"):
        # template text (timestamps, frame labels) counted by the loader's tokenizer, as the
        # index counted it with its exact counter; a copy: the caller's rule stays as it was
        rule = copy.copy(rule)
        rule.text_counter = text.count
    # next_text="auto" probed here once: DataLoader workers never import transformers
    options = resolve_vision_options(opts.vision, rule_spec(rule))
    vision = VisionEncoder(
        rule=rule,
        options=options,
        token_ids=token_ids,
        caption_field=caption_field,
        decode_backend=backend,
        decode_device=opts.decode_device,
    )
    return vision, rule


def _decode_backend(src: Any, opts: LoaderOptions) -> str:
    """The decoder every sample of this loader uses: `opts.decode_backend` resolved once ("auto"
    -> the fastest that loads), so a run never mixes libraries; unresolved when the source
    holds no video (a text corpus needs no PyAV)."""
    modality = getattr(src, "modality", None)
    if modality is None or not bool(np.any(np.asarray(modality) == Modality.VIDEO)):
        return opts.decode_backend
    return resolve_backend(opts.decode_backend, opts.decode_device)
