"""Sample -> token ids (+ the video frames this replica needs): the loader's default encoder.

Layout of a sequence (the length index counted exactly these tokens):

* text: `tokenizer(text)` (or pre-tokenized `.npy`) followed by `special_tokens[i]` EOD ids
  (the index's `text_special_tokens`, Megatron's end-of-document token);
* video / image (images decoded whole with Pillow, resized to the rule's size): the rule's
  `special` template ids, then `vision` placeholder ids, then the
  caption's ids, then EOD ids for any index special tokens beyond the template's.
  The template tokens are emitted as `special_token_id` (a model's exact template, e.g.
  Qwen3-VL's per-group timestamps, can be supplied with `LoaderOptions.encode`). Placeholders
  form `grid[0]` equal temporal groups; group g is filled by frames
  frame_indices[g*f:(g+1)*f] (f = 2 for Qwen's temporal patch, 1 for InternVL).

A replica decodes only the groups with a placeholder in its zigzag shard: in a degree-4 group
each member decodes about a quarter of a long video's frames instead of all of them (a group
split across a chunk boundary is decoded by both owners).

With `vision` options (LoaderOptions.vision) media samples take the real path instead, through
the `fcp_data.vision.sample.VisionEncoder` it holds (`vision_encoder`): the rule's template
parts emitted with the tokenizer's ids in order, loss targets on text only, whole-sample M-RoPE
ids, and per micro-batch the pixel payload of the encoder units this replica holds
(`vision_encoder.payload`); `vision_input` is then not used.
"""

from __future__ import annotations

import dataclasses
import io
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..collate import VisionInput
from ..errors import ConfigError, FCPError, MemberError
from ..readers.members import effective_exts
from ..readers.sample_source import SampleSource
from ..vision.families import VisionTokenRule, VisionTokens
from ..vision.modality import Modality
from ..vision.sample import VisionEncoder, media_tokens

__all__ = ["CustomEncoder", "EncodedSample", "SampleEncoder", "Tokenizer"]

Tokenizer = Callable[[str], Sequence[int]]


@dataclass(kw_only=True, slots=True)
class EncodedSample:
    """Token ids of one sequence and, for media, where its placeholders start."""

    tokens: np.ndarray
    vision_start: int = 0
    vision: Any = None  # vision.families.VisionTokens of a video or image
    video: bytes | None = None
    image: bytes | None = None
    targets: np.ndarray | None = None  # vision path: which tokens a label may predict
    layout: Any = None  # vision path: fcp_data.vision.template.MediaLayout
    mrope: np.ndarray | None = None  # vision path: [3, L] M-RoPE ids of the whole sample
    media_size: tuple[int, int] | None = None  # (height, width) the index counted media at


def _member_table(source: Any, pos: int) -> dict[str, Any] | None:
    """Sample `pos`'s members (extension -> (offset, size)) from the source's index, or None
    when the source keeps no member table (it must be read to know)."""
    members = getattr(source, "members", None)
    return members(pos) if callable(members) else None


def _decode_text(v: Any) -> str:
    return v.decode("utf-8") if isinstance(v, bytes) else str(v)


@dataclass(kw_only=True, slots=True)
class SampleEncoder:
    """Picklable: runs in DataLoader workers. `rule` is a VisionTokenRule (media only);
    `vision_encoder` the vision path (`LoaderOptions.vision`), None for the placeholder path."""

    tokenizer: Tokenizer | None = None
    rule: VisionTokenRule | None = None
    text_field: str = "text"
    caption_field: str = "caption"
    eod_id: int = 0
    special_token_id: int = 0
    vision_token_id: int = 0
    decode_backend: str = "auto"  # fcp_data.vision.decode.BACKENDS, resolved by the loader
    decode_device: str = "cpu"
    vision_encoder: VisionEncoder | None = None
    store: Any = None  # readers.token_store.TokenStore: text ids sliced, never re-tokenized
    chat_loss_roles: tuple[str, ...] = ("assistant",)  # text chat samples (readers.chat_text)
    tokenizer_hint: str = ""  # the index's own tokenizer, named by the "no tokenizer=" error

    def for_source(self, source: Any, pos: int) -> SampleEncoder:
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
        vision = self.vision_encoder
        if vision is not None:
            vision = dataclasses.replace(vision, caption_field=caption_field)
        return dataclasses.replace(
            self, text_field=text_field, caption_field=caption_field, vision_encoder=vision
        )

    def media_tokens(self, source: SampleSource, pos: int, modality: int) -> VisionTokens:
        """The rule's tokens of media sample `pos` from the index columns (no pixel read)."""
        if self.rule is None:
            raise ConfigError("a media sample needs vision_rule= on the loader (the index's rule)")
        return media_tokens(self.rule, source, pos, modality)

    def loss_tokens(
        self,
        source: SampleSource,
        pos: int,
        seqlen: int,
        time_limit: Callable[[str, Callable[[], Any]], Any] | None = None,
    ) -> int:
        """Loss tokens of sample `pos` (planned length `seqlen`); a text chat is read (under
        `time_limit`, the loader's sample time limit) to count its targets."""
        other = self.for_source(source, pos)
        if other is not self:
            return other.loss_tokens(source, pos, seqlen, time_limit)
        modality = int(source.modality[pos])
        if modality == Modality.TEXT:  # a text chat's targets, else seqlen - 1
            if time_limit is None:
                return self.text_loss_tokens(source, pos, seqlen)
            return self.text_loss_tokens(source, pos, seqlen, time_limit)
        if self.vision_encoder is None:
            return seqlen - 1
        return self.vision_encoder.loss_tokens(source, pos, seqlen, modality, text_ids=self._ids)

    def _no_tokenizer(self, what: str) -> ConfigError:
        hint = self.tokenizer_hint or "the tokenizer the index was counted with"
        return ConfigError(
            f"the sample holds {what} but the loader has no tokenizer= and no token store "
            f"holds its ids; pass {hint}"
        )

    def _ids(self, text: str) -> np.ndarray:
        if self.tokenizer is None:
            raise self._no_tokenizer("text")
        ids = np.asarray(self.tokenizer(text), dtype=np.int64)
        if ids.ndim != 1:  # a `py:` counter that returns a count: no ids to train on
            spec = getattr(self.tokenizer, "spec", type(self.tokenizer).__name__)
            raise ConfigError(
                f"the tokenizer {spec!r} returned {ids.ndim}-d {ids.dtype} for a text, not a "
                "list of token ids; the loader needs a callable str -> ids"
            )
        return ids

    def text_ids(self, sample: Mapping[str, Any]) -> np.ndarray:
        if "npy" in sample:
            from ..readers.index_format import NPY_ERRORS
            from ..readers.token_store import check_ids, vocab_size_of

            try:
                arr = np.load(io.BytesIO(sample["npy"]), allow_pickle=False)
            except NPY_ERRORS as exc:  # a bad sample, named as one (not tokenize.TokenError)
                raise MemberError(
                    f".npy token ids do not load ({type(exc).__name__}: {exc})"
                ) from exc
            if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
                raise MemberError(
                    f".npy token ids must be a 1-D integer array, got {arr.dtype} with shape "
                    f"{arr.shape}"
                )
            ids = arr.astype(np.int64)
            check_ids(ids, vocab_size_of(self.tokenizer))  # a bad sample, never wrong ids
            return ids
        if "txt" in sample:
            return self._ids(_decode_text(sample["txt"]))
        if "json" in sample:
            obj = json.loads(sample["json"])
            if isinstance(obj, dict) and isinstance(obj.get(self.text_field), str):
                return self._ids(obj[self.text_field])
        raise MemberError(
            f"no text member: members are {sorted(sample)}; expected .txt, .npy, or .json with "
            f"a {self.text_field!r} field (LoaderOptions.text_field)"
        )

    def _chat(self, sample: Mapping[str, Any], special: int) -> EncodedSample | None:
        """A text chat sample (its text field holds {role, content} turns): ChatML ids, loss
        on `chat_loss_roles` and the EOD ids (readers.chat_text); None for any other sample."""
        if "json" not in sample or "txt" in sample or "npy" in sample:
            return None
        raw = sample["json"]
        if b'"role"' not in raw and b'"from"' not in raw:  # no turn: skip the second parse
            return None
        obj = json.loads(raw)
        turns = obj.get(self.text_field) if isinstance(obj, dict) else None
        if not isinstance(turns, list) or not turns or not isinstance(turns[0], dict):
            return None
        from ..readers.chat_text import encode_text_chat

        if self.tokenizer is None:
            raise self._no_tokenizer("a chat")
        ids, targets = encode_text_chat(turns, self._ids, self.chat_loss_roles)
        return EncodedSample(
            tokens=np.concatenate([ids, np.full(special, self.eod_id, dtype=np.int64)]),
            targets=np.concatenate([targets, np.ones(special, dtype=bool)]),
        )

    def text_loss_tokens(
        self,
        source: SampleSource,
        pos: int,
        seqlen: int,
        time_limit: Callable[[str, Callable[[], Any]], Any] = lambda _what, fn: fn(),
    ) -> int:
        """Loss tokens of text sample `pos`: seqlen - 1, or a chat's targets (its
        `chat_loss_roles` turns and EOD ids) when it is one.

        Every replica needs the whole global batch's count (`global_num_loss_tokens`) from
        samples it does not hold, so a sample that may be a chat (a `.json` member and no
        `.txt`/`.npy`, per the index's member table) is read and rendered here; plain text and
        JSON without turns cost no tokenizing. Without this a chat's loss would be divided by
        every token, not its targets.
        """
        if self.store is not None and self.store.has(pos):
            return seqlen - 1  # a token store holds no chats (the build refuses them)
        table = _member_table(source, pos)
        if table is None:  # no table: no read (a replica reads only what it holds); a chat from
            return seqlen - 1  # such a source is refused where it is encoded (`__call__`)
        exts = set(effective_exts(table))  # a `.json.gz` member is read as its `.json`
        if "json" not in exts or "txt" in exts or "npy" in exts:
            return seqlen - 1
        try:  # bounded like every read: a stuck read costs sample_timeout_s, never a hang
            sample = time_limit(
                f"counting the loss tokens of sample {pos}", lambda: source.read(pos)
            )
            chat = self._chat(sample, int(source.special_tokens[pos]))
        except ConfigError:
            raise  # the setup's fault (no tokenizer, a missing package): never a bad sample
        except (ValueError, OSError, FCPError):
            # unreadable here, integrity errors included (a changed byte, a wrong range answer,
            # a changed pipe: output): the replica that holds it reports it by key, as a
            # counted skip under on_error="skip" (a ChecksumMismatchError escaped here before)
            return seqlen - 1
        if chat is None or chat.targets is None:
            return seqlen - 1
        return int(chat.targets[1:].sum())

    def caption_ids(self, sample: Mapping[str, Any]) -> np.ndarray:
        if "txt" in sample:
            return self._ids(_decode_text(sample["txt"]))
        if "json" in sample:
            obj = json.loads(sample["json"])
            if isinstance(obj, dict) and isinstance(obj.get(self.caption_field), str):
                return self._ids(obj[self.caption_field])
        return np.zeros(0, dtype=np.int64)

    def __call__(self, source: SampleSource, pos: int) -> EncodedSample:
        other = self.for_source(source, pos)  # a Blend source's own text/caption fields
        if other is not self:
            return other(source, pos)
        modality = int(source.modality[pos])
        special = int(source.special_tokens[pos])
        # a text sample whose ids the token store holds: no read, no tokenizer
        if modality == Modality.TEXT and self.store is not None and self.store.has(pos):
            return EncodedSample(tokens=self.store.tokens(pos, eod=special, eod_id=self.eod_id))
        sample = source.read(pos)
        if modality == Modality.TEXT:
            chat = self._chat(sample, special)
            if chat is not None:
                if _member_table(source, pos) is None:
                    raise ConfigError(
                        f"sample {str(source.keys[pos])!r} is a chat from a source without a "
                        f"member table ({type(source).__name__}): every replica's "
                        "global_num_loss_tokens must count its targets without reading it; "
                        "index the corpus with `fcp index` (a LengthIndex, or a Blend of them)"
                    )
                return chat
            ids = self.text_ids(sample)
            return EncodedSample(tokens=np.concatenate([ids, np.full(special, self.eod_id)]))
        if modality not in (Modality.VIDEO, Modality.IMAGE):
            raise MemberError(f"modality code {modality} is not text (0), video (1) or image (2)")
        vt = self.media_tokens(source, pos, modality)  # ConfigError without a rule
        exts = Modality(modality).exts  # in the scanner's lookup order
        ext = next((e for e in exts if e in sample), None)
        if ext is None:
            raise MemberError(f"media sample has no {'/'.join(exts)} member ({sorted(sample)})")
        eod = max(0, special - vt.special)
        if self.vision_encoder is not None:
            fields = self.vision_encoder.encode(
                source,
                pos,
                sample,
                vt,
                modality,
                eod=eod,
                eod_id=self.eod_id,
                media=sample[ext],
                text_ids=self._ids,
                caption_ids=self.caption_ids,
            )
            return EncodedSample(**fields)
        tokens = np.concatenate(
            [
                np.full(vt.special, self.special_token_id),
                np.full(vt.vision, self.vision_token_id),
                self.caption_ids(sample),
                np.full(eod, self.eod_id),
            ]
        ).astype(np.int64)
        media = sample[ext]
        return EncodedSample(
            tokens=tokens,
            vision_start=vt.special,
            vision=vt,
            video=media if modality == Modality.VIDEO else None,
            image=media if modality == Modality.IMAGE else None,
            media_size=(int(source.height[pos]), int(source.width[pos])),
        )

    def vision_input(
        self, enc: EncodedSample, *, sample_id: int, key: str, held: np.ndarray, offset: int
    ) -> VisionInput | None:
        """Frames for the placeholders among global positions `held` (local order, at `offset`)."""
        vt = enc.vision
        if self.vision_encoder is not None:  # the vision path sends its payload instead
            return None
        if vt is None or vt.vision == 0 or (enc.video is None and enc.image is None):
            return None
        k = held - enc.vision_start
        mine = np.flatnonzero((k >= 0) & (k < vt.vision))
        if mine.size == 0:
            return None
        if enc.image is not None:  # one image: decoded whole by every owner of a placeholder
            return VisionInput(
                sample_id=sample_id,
                key=key,
                groups=torch.zeros(1, dtype=torch.int64),
                frame_indices=torch.zeros(1, dtype=torch.int64),
                pixels=_decode_image(enc.image, vt.resized, enc.media_size),
                token_positions=torch.from_numpy(offset + mine),
                token_group=torch.zeros(mine.size, dtype=torch.int64),
                meta={"grid": tuple(vt.grid), "resized": tuple(vt.resized), "frames_per_group": 1},
            )
        from ..vision.decode import decode_frames

        groups_total = max(1, int(vt.grid[0]))
        per_group = vt.vision // groups_total
        frames_per_group = max(1, len(vt.frame_indices) // groups_total)
        token_group = k[mine] // per_group
        groups = np.unique(token_group)
        frames = [
            vt.frame_indices[g * frames_per_group + j]
            for g in groups
            for j in range(frames_per_group)
            if g * frames_per_group + j < len(vt.frame_indices)
        ]
        pixels = decode_frames(
            enc.video,
            frames,
            vt.resized,
            backend=self.decode_backend,
            device=self.decode_device,
            key=key,
            native=enc.media_size,
        )
        if pixels.shape[0] != len(frames):  # a backend must not drop or repeat frames
            raise MemberError(
                f"decoded {pixels.shape[0]} frames where the index's frame count asks for "
                f"{len(frames)} (frames {frames[:4]}...); the video's metadata is wrong: re-index"
            )
        return VisionInput(
            sample_id=sample_id,
            key=key,
            groups=torch.from_numpy(groups),
            frame_indices=torch.tensor(frames, dtype=torch.int64),
            pixels=pixels,
            token_positions=torch.from_numpy(offset + mine),
            token_group=torch.from_numpy(np.searchsorted(groups, token_group)),
            meta={
                "grid": tuple(vt.grid),
                "resized": tuple(vt.resized),
                "frames_per_group": frames_per_group,
            },
        )


def _decode_image(
    data: bytes, resized: tuple[int, int], size: tuple[int, int] | None = None
) -> torch.Tensor:
    """uint8 (1, H, W, 3) resized bicubically to the rule's (H, W) (Pillow, imported lazily).

    The vision path's image rule (fcp_data.vision.media.load_image): 16-bit and float modes
    refused, not clipped to 255; other modes composited over white; the size checked against
    the index's (`size`, height x width).
    """
    from ..vision.media import load_image, resize_image

    rgb = resize_image(load_image(data, size), resized)
    return torch.from_numpy(np.asarray(rgb).copy()).unsqueeze(0)


@dataclass(kw_only=True, slots=True)
class CustomEncoder:
    """Adapts a user's `encode(sample) -> token ids` (LoaderOptions.encode) to the loader."""

    fn: Callable[[Mapping[str, Any]], np.ndarray]

    def __call__(self, source: SampleSource, pos: int) -> EncodedSample:
        return EncodedSample(tokens=np.asarray(self.fn(source.read(pos)), dtype=np.int64))

    def vision_input(self, enc: EncodedSample, **_: Any) -> VisionInput | None:
        return None
