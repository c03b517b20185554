"""The vision path of the loader's sample encoder: one object the loader's encoder holds.

Media samples become real template ids, loss targets and whole-sample M-RoPE ids (`encode`);
the global loss count is derived from the index (`loss_tokens`); per micro-batch each sequence
adds its M-RoPE slice and pixel payload (`payload`). `VisionEncoder` holds everything it reads
as explicit fields (the rule, the options, the special-token ids, the caption field, the
decoder); what belongs to the text side (the tokenizer's ids, the caption's ids, the EOD id) is
passed in by the caller, so this package needs nothing from the loader or the readers: a
source is anything with the index columns (`modality`, `num_frames`, `fps`, `height`,
`width`) and a `read(pos[, exts])`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ConfigError, MemberError
from .chat import chat_flags, chat_pieces, is_chat
from .encode import encode_media, media_loss_tokens
from .families import FamilySpec, VisionTokenRule, VisionTokens, rule_spec
from .modality import Modality
from .options import VisionOptions
from .payload import PayloadParts, sequence_payload
from .tokens import SpecialTokenIds

__all__ = ["VisionEncoder", "media_tokens"]

TextIds = Callable[[str], np.ndarray]
"""A text's token ids with the loader's tokenizer."""


def media_tokens(rule: VisionTokenRule, source: Any, pos: int, modality: int) -> VisionTokens:
    """The rule's tokens of media sample `pos` from the index columns (no pixel read)."""
    if modality == Modality.VIDEO:
        return rule.video(
            num_frames=int(source.num_frames[pos]),
            fps=float(source.fps[pos]),
            height=int(source.height[pos]),
            width=int(source.width[pos]),
        )
    return rule.image(height=int(source.height[pos]), width=int(source.width[pos]))


@dataclass(frozen=True, kw_only=True, slots=True)
class VisionEncoder:
    """Media samples on the vision path (`LoaderOptions.vision`); see the module docstring.

    Picklable: it travels to DataLoader workers inside the loader's encoder.
    """

    rule: VisionTokenRule
    options: VisionOptions
    token_ids: SpecialTokenIds | None = None
    caption_field: str = "caption"
    decode_backend: str = "auto"  # fcp_data.vision.decode.BACKENDS, resolved by the loader
    decode_device: str = "cpu"

    @property
    def spec(self) -> FamilySpec:
        return rule_spec(self.rule)

    def encode(
        self,
        source: Any,
        pos: int,
        sample: Mapping[str, Any],
        vt: VisionTokens,
        modality: int,
        *,
        eod: int,
        eod_id: int,
        media: bytes,
        text_ids: TextIds,
        caption_ids: Callable[[Mapping[str, Any]], np.ndarray],
    ) -> dict[str, Any]:
        """The fields of the loader's EncodedSample: real ids, targets, layout, M-RoPE ids."""
        if self.token_ids is None:
            raise ConfigError(
                "the vision path needs the template's special-token ids (VisionOptions("
                "token_ids=...) or a tokenizer to read them from)"
            )
        turns = self.turns(sample)
        if turns is None:
            text: dict[str, Any] = {"caption": caption_ids(sample)}
        else:
            before, after = chat_pieces(turns, text_ids, self.options.chat_loss_roles)
            text = {"before": before, "after": after}
        video = modality == Modality.VIDEO
        em = encode_media(
            vt,
            kind=Modality(modality).token_type,
            spec=self.spec,
            options=self.options,
            token_ids=self.token_ids,
            text_ids=text_ids,
            **text,
            eod=eod,
            eod_id=eod_id,
            num_frames=int(source.num_frames[pos]) if video else 0,
            fps=float(source.fps[pos]) if video else 0.0,
        )
        return {
            "tokens": em.tokens,
            "vision_start": 0,
            "vision": vt,
            "video": media if video else None,
            "image": media if modality == Modality.IMAGE else None,
            "targets": em.targets,
            "layout": em.layout,
            "mrope": em.mrope,
            "media_size": (int(source.height[pos]), int(source.width[pos])),
        }

    def turns(self, sample: Mapping[str, Any]) -> list[dict[str, Any]] | None:
        """The conversation in the caption field, or None for a plain caption."""
        if "txt" in sample or "json" not in sample:
            return None
        obj = json.loads(sample["json"])
        turns = obj.get(self.caption_field) if isinstance(obj, dict) else None
        if not is_chat(turns):
            return None
        if not self.options.chat:  # this sample's, named by key where it is read (a skip)
            raise MemberError(
                f"the {self.caption_field!r} field holds a conversation; set "
                "VisionOptions(chat=True) to train on it (loss on chat_loss_roles)"
            )
        return turns

    def loss_tokens(
        self, source: Any, pos: int, seqlen: int, modality: int, *, text_ids: TextIds
    ) -> int:
        """Loss tokens of media sample `pos` (planned length `seqlen`) from the index; a
        conversation's .json is read, since its targets depend on its roles."""
        vt = media_tokens(self.rule, source, pos, modality)
        count = _Counter(text_ids)
        pieces: dict[str, Any] = {}
        if self.options.chat:
            try:
                turns = self.turns(_read_json(source, pos))
            except ValueError:
                turns = None  # unreadable here: the read itself reports it, by key
            if turns is not None:
                flags = chat_flags(turns, count, self.options.chat_loss_roles)
                pieces = dict(zip(("before", "after"), flags))
        return media_loss_tokens(
            vt,
            seqlen,
            loss_on_template=self.options.loss_on_template,
            text_counter=count,
            **pieces,
        )

    def payload(
        self,
        out: PayloadParts,
        k: int,
        enc: Any,
        *,
        held: np.ndarray,
        offset: int,
        padded_len: int,
    ) -> None:
        """Add sequence k's M-RoPE slice and pixel payload to `out` (`enc`: its EncodedSample)."""
        sequence_payload(
            out,
            k,
            layout=enc.layout,
            media=enc.video if enc.video is not None else enc.image,
            mrope=enc.mrope,
            length=len(enc.tokens),
            held=held,
            offset=offset,
            padded_len=padded_len,
            spec=self.spec,
            opts=self.options,
            media_size=enc.media_size,
            backend=self.decode_backend,
            device=self.decode_device,
        )


@dataclass(frozen=True, slots=True)
class _Counter:
    """Token count with the loader's tokenizer (picklable, unlike a lambda)."""

    ids: TextIds

    def __call__(self, text: str) -> int:
        return len(self.ids(text))


def _read_json(source: Any, pos: int) -> Mapping[str, Any]:
    """Only the .json (and .txt, which wins as caption) members when the source can."""
    try:
        return source.read(pos, ["json", "txt"])
    except TypeError:
        return source.read(pos)
