"""The vision path of the loader's sample encoder (mixed into loader.encode.SampleEncoder).

Media samples become real template ids, loss targets and whole-sample M-RoPE ids
(`_encode_real`); the global loss count is derived from the index (`loss_tokens`); per
micro-batch each sequence adds its M-RoPE slice and pixel payload (`vision_payload`). The host
class provides `vision`, `token_ids`, `rule`, `eod_id`, `caption_field`, `_ids` and
`caption_ids`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from ..readers.sample_source import SampleSource

from .chat import chat_flags, chat_pieces, is_chat
from .encode import encode_media, media_loss_tokens
from .families import FamilySpec, VisionTokens, rule_spec
from .modality import Modality
from .payload import PayloadParts, sequence_payload

__all__ = ["VisionEncoderMixin", "rule_spec"]  # rule_spec: a re-export of the registry's


class VisionEncoderMixin:
    """Vision-path methods of SampleEncoder (see the module docstring)."""

    __slots__ = ()
    vision: Any
    token_ids: Any
    rule: Any
    eod_id: int
    text_field: str
    caption_field: str

    def _ids(self, text: str) -> np.ndarray:  # provided by the host class
        raise NotImplementedError

    def for_source(self, source: Any, pos: int) -> Any:
        """This encoder, or a copy reading the fields `pos`'s source was indexed with.

        A Blend's sources may be indexed with other --text-field / --caption-field values;
        a copy (not a mutation: samples run in helper threads) keeps each read consistent
        with the counts of its own index.
        """
        fields = getattr(source, "read_fields", None)
        if not callable(fields):
            return self
        text_field, caption_field = fields(pos)
        if (text_field, caption_field) == (self.text_field, self.caption_field):
            return self
        return dataclasses.replace(  # type: ignore[type-var]
            self,  # type: ignore[arg-type]
            text_field=text_field,
            caption_field=caption_field,
        )

    def media_tokens(self, source: SampleSource, pos: int, modality: int) -> VisionTokens:
        """The rule's tokens of media sample `pos` from the index columns (no pixel read)."""
        if modality == Modality.VIDEO:
            return self.rule.video(
                num_frames=int(source.num_frames[pos]),
                fps=float(source.fps[pos]),
                height=int(source.height[pos]),
                width=int(source.width[pos]),
            )
        return self.rule.image(height=int(source.height[pos]), width=int(source.width[pos]))

    def caption_ids(self, sample: Mapping[str, Any]) -> np.ndarray:  # provided by the host
        raise NotImplementedError

    def _spec(self) -> FamilySpec:
        return rule_spec(self.rule)

    def _encode_real(
        self,
        source: SampleSource,
        pos: int,
        sample: Any,
        vt: Any,
        modality: int,
        eod: int,
        media: bytes,
    ) -> dict[str, Any]:
        """The vision path: EncodedSample fields (real ids, targets, layout, M-RoPE ids)."""
        assert self.vision is not None and self.token_ids is not None
        turns = self._turns(sample)
        if turns is None:
            text: dict[str, Any] = {"caption": self.caption_ids(sample)}
        else:
            before, after = chat_pieces(turns, self._ids, self.vision.chat_loss_roles)
            text = {"before": before, "after": after}
        em = encode_media(
            vt,
            kind=Modality(modality).token_type,
            spec=self._spec(),
            options=self.vision,
            token_ids=self.token_ids,
            text_ids=self._ids,
            **text,
            eod=eod,
            eod_id=self.eod_id,
            num_frames=int(source.num_frames[pos]) if modality == Modality.VIDEO else 0,
            fps=float(source.fps[pos]) if modality == Modality.VIDEO else 0.0,
        )
        return {
            "tokens": em.tokens,
            "vision_start": 0,
            "vision": vt,
            "video": media if modality == Modality.VIDEO else None,
            "image": media if modality == Modality.IMAGE else None,
            "targets": em.targets,
            "layout": em.layout,
            "mrope": em.mrope,
            "media_size": (int(source.height[pos]), int(source.width[pos])),
        }

    def _turns(self, sample: Mapping[str, Any]) -> list[dict[str, Any]] | None:
        """The conversation in the caption field, or None for a plain caption."""
        if "txt" in sample or "json" not in sample:
            return None
        obj = json.loads(sample["json"])
        turns = obj.get(self.caption_field) if isinstance(obj, dict) else None
        if not is_chat(turns):
            return None
        if self.vision is None or not self.vision.chat:
            raise ValueError(
                f"the {self.caption_field!r} field holds a conversation; set "
                "VisionOptions(chat=True) to train on it (loss on chat_loss_roles)"
            )
        return turns

    def loss_tokens(
        self, source: SampleSource, pos: int, seqlen: int, time_limit: Any = None
    ) -> int:
        """Loss tokens of sample `pos` (planned length `seqlen`); a text chat is read (under
        `time_limit`, the loader's sample time limit) to count its targets."""
        modality = int(source.modality[pos])
        other = self.for_source(source, pos)
        if other is not self:
            return int(other.loss_tokens(source, pos, seqlen, time_limit))
        if modality == Modality.TEXT:  # a text chat's targets, else seqlen - 1 (loader.encode)
            text_count = getattr(self, "text_loss_tokens", None)
            if text_count is None:
                return seqlen - 1
            if time_limit is None:
                return int(text_count(source, pos, seqlen))
            return int(text_count(source, pos, seqlen, time_limit))
        if self.vision is None or self.rule is None:
            return seqlen - 1
        vt = self.media_tokens(source, pos, modality)
        count = _Counter(self)
        pieces: dict[str, Any] = {}
        if self.vision.chat:  # a conversation's targets depend on its roles: read its .json
            try:
                turns = self._turns(_read_json(source, pos))
            except ValueError:
                turns = None  # unreadable here: the read itself reports it, by key
            if turns is not None:
                pieces = dict(
                    zip(("before", "after"), chat_flags(turns, count, self.vision.chat_loss_roles))
                )
        return media_loss_tokens(
            vt,
            seqlen,
            loss_on_template=self.vision.loss_on_template,
            text_counter=count,
            **pieces,
        )

    def vision_payload(
        self,
        out: PayloadParts,
        k: int,
        enc: Any,
        *,
        held: np.ndarray,
        offset: int,
        padded_len: int,
    ) -> None:
        """Add sequence k's M-RoPE slice and pixel payload to `out` (vision path only)."""
        if self.vision is None or self.rule is None:
            return
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
            spec=self._spec(),
            opts=self.vision,
            media_size=enc.media_size,
            backend=getattr(self, "decode_backend", "auto"),
            device=getattr(self, "decode_device", "cpu"),
        )


@dataclass(frozen=True, slots=True)
class _Counter:
    """Token count with the encoder's tokenizer (picklable, unlike a lambda)."""

    enc: Any

    def __call__(self, text: str) -> int:
        return len(self.enc._ids(text))


def _read_json(source: Any, pos: int) -> Mapping[str, Any]:
    """Only the .json (and .txt, which wins as caption) members when the source can."""
    try:
        return source.read(pos, ["json", "txt"])
    except TypeError:
        return source.read(pos)
