"""Turn raw tar samples into metadata records: modality, token counts, member offsets.

This is the one place that decides what a sample is. Video (`.mp4/.mkv/.webm/.mov/.avi`) wins
over image (`.jpg/.jpeg/.png/.webp`), which wins over text (`.txt`, `.json` text field,
`.npy` token ids). A video's `.json` is its sidecar; its caption is `.txt` or the sidecar's
`caption_field`. Only text, json, npy and image members are read while scanning; video bytes are
read only when there is no sidecar and the video must be probed.
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterator
from typing import Any

import msgspec
import numpy as np

from ..errors import ConfigError, MemberError, MissingDependencyError
from ..vision.families import VisionTokenRule, get_rule
from ..vision.media_meta import VideoMeta, decode_json_object, image_size, video_meta_from_fields
from ..vision.modality import IMAGE_EXTS, MODALITIES, VIDEO_EXTS, Modality
from ..vision.probe import BACKENDS, Prober, ProbeTimeout
from .errors import ErrorPolicy, FailureLog
from .members import GZ_INNER, gunzip_members
from .shards import (
    STREAM_MAX_BYTES,
    STREAM_TIMEOUT_S,
    BadMember,
    RawSample,
    is_seekable,
    read_members,
)
from .text import RatioCounter, TokenCounter, as_counter, load_counter

__all__ = [
    "IMAGE_EXTS",
    "MODALITIES",
    "TEXT_EXTS",
    "VIDEO_EXTS",
    "SampleRecord",
    "ScanConfig",
    "Scanner",
    "check_scan_config",
    "loads_while_scanning",
]

TEXT_EXTS = ("txt", "json", "npy")  # VIDEO_EXTS, IMAGE_EXTS, MODALITIES: fcp_data.vision.modality


class ScanConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Everything that changes a count; stored in the index header and compared on open.

    `text_special_tokens` = 1: one BOS/EOS-style document separator per sample (text, video
    and image alike), as Megatron's pretraining appends an EOD token. `video_causal`: MLLMs
    (Qwen-VL, InternVL) run their LLM with causal attention over text and vision tokens alike,
    so video and images default to causal; set False for full-attention video models (the
    planner then costs their attention at 2x). `stream_timeout_s`: seconds a `pipe:` command
    or a FIFO may go without producing a byte before its shard is abandoned (a counted loss,
    or SampleError under on_error="raise"); 60 s covers a slow object store's first byte.
    """

    vision_rule: str = "qwen2.5-vl"
    rule_overrides: dict[str, Any] = {}
    tokenizer: str = "bytes:4"
    text_field: str = "text"
    caption_field: str = "caption"
    text_special_tokens: int = 1
    video_causal: bool = True
    image_causal: bool = True
    probe_backend: str = "auto"
    probe_timeout_s: float = 20.0
    stream_timeout_s: float = STREAM_TIMEOUT_S
    stream_max_bytes: int = STREAM_MAX_BYTES
    on_error: str = "skip"
    max_consecutive_failures: int = 100


class SampleRecord(msgspec.Struct, kw_only=True):
    """Metadata of one sample; `members[ext] = (offset, size)` in shard `url`."""

    key: str
    url: str
    modality: int
    text_tokens: int
    vision_tokens: int
    special_tokens: int
    causal: bool
    members: dict[str, tuple[int, int]]
    num_frames: int = 0
    fps: float = 0.0
    width: int = 0
    height: int = 0
    payload: dict[str, bytes] | None = None  # kept only for unseekable (pipe) shards
    dtype: str = ""  # megatron shards: the .bin's id dtype (its `npy` member is raw ids)

    @property
    def seqlen(self) -> int:
        return self.text_tokens + self.vision_tokens + self.special_tokens

    def fetch(self, exts: list[str] | None = None) -> dict[str, bytes]:
        """The sample's member bytes (all, or `exts`), read by seeking into the shard."""
        if self.payload is not None:
            out = {k: v for k, v in self.payload.items() if exts is None or k in exts}
        else:
            out = read_members(self.url, self.members, exts)
        from .sources.registry import format_for

        # megatron: raw ids -> .npy, what the loader's pre-tokenized path reads
        return format_for(self.url).present_members({"dtype": self.dtype}, out, STREAM_MAX_BYTES)


def _column_limits() -> dict[str, tuple[int, int]]:
    """(min, max) of the index column of each integer field a record carries."""
    from .index_format import SAMPLE_ARRAYS  # index_format imports this module

    fields = ("num_frames", "width", "height", "text_tokens", "vision_tokens", "special_tokens")
    return {
        name: (int(np.iinfo(SAMPLE_ARRAYS[name]).min), int(np.iinfo(SAMPLE_ARRAYS[name]).max))
        for name in fields
    }


def _check_columns(record: SampleRecord, limits: dict[str, tuple[int, int]]) -> None:
    """ValueError naming the field when a value does not fit its index column's dtype.

    A sidecar may claim 2**31 frames or a 100000x100000 picture; written into an int32
    column that would raise OverflowError and end the whole build, so it is one bad sample.
    """
    for name, (low, high) in limits.items():
        value = getattr(record, name)
        if not low <= value <= high:
            raise MemberError(
                f"{name}={value} does not fit the index column ({low}..{high}); fix the "
                "sample's metadata"
            )


def _seconds(name: str, value: object, default: float) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (ok and math.isfinite(value) and value > 0):  # type: ignore[arg-type]
        raise ConfigError(
            f"{name}={value!r} must be a finite number of seconds > 0 (default {default:g})"
        )


def check_scan_config(config: ScanConfig) -> None:
    """ConfigError naming the field of a ScanConfig value that cannot be right.

    Checked before any shard is read: the config is written into the index header as JSON,
    where nan or inf become null (an index that cannot be opened), and an empty text field or
    a negative timeout would silently skip every sample or never bound a stall.
    """
    if config.probe_backend not in BACKENDS:
        raise ConfigError(f"probe_backend={config.probe_backend!r}; allowed: {', '.join(BACKENDS)}")
    _seconds("probe_timeout_s", config.probe_timeout_s, 20.0)
    _seconds("stream_timeout_s", config.stream_timeout_s, STREAM_TIMEOUT_S)
    for name in ("text_field", "caption_field", "tokenizer", "vision_rule"):
        value = getattr(config, name)
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(f"{name}={value!r} must be a non-empty string")
    for name in ("video_causal", "image_causal"):
        if not isinstance(getattr(config, name), bool):
            raise ConfigError(f"{name}={getattr(config, name)!r} must be True or False")
    if config.on_error not in ("skip", "raise"):
        raise ConfigError(f"on_error={config.on_error!r}; allowed: 'skip', 'raise'")
    for name, low, high in (
        ("text_special_tokens", 0, 1 << 20),
        ("max_consecutive_failures", 1, 1 << 62),
        ("stream_max_bytes", 1 << 20, 1 << 50),
    ):
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ConfigError(f"{name}={value!r} must be an integer in [{low}, {high}]")


def loads_while_scanning(ext: str) -> bool:
    """True for a member the scanner reads while indexing (text, json, npy, images, gzipped
    text); video bytes are read only to probe a video without a sidecar."""
    return ext in TEXT_EXTS or ext in IMAGE_EXTS or ext in GZ_INNER


class Scanner:
    """Scans shards under a ScanConfig; `counter` overrides the config's tokenizer spec."""

    def __init__(
        self,
        config: ScanConfig,
        counter: TokenCounter | Any = None,
        rule: VisionTokenRule | None = None,
    ) -> None:
        self.config = config
        self.counter = (
            as_counter(counter) if counter is not None else load_counter(config.tokenizer)
        )
        # A real tokenizer also counts template text (Qwen3-VL timestamps, InternVL frame
        # labels); a bytes ratio is too coarse for 6-token strings, so the rule's default stays.
        exact = None if isinstance(self.counter, RatioCounter) else self.counter
        self.rule = rule or get_rule(
            config.vision_rule, text_counter=exact, **config.rule_overrides
        )
        self.log = FailureLog(
            ErrorPolicy(
                on_error=config.on_error,  # type: ignore[arg-type]
                max_consecutive_failures=config.max_consecutive_failures,
            )
        )
        self._prober: Prober | None = None
        self.cursor: Any = None  # the sample iterable of the shard being scanned (`scan`)
        self._limits = _column_limits()
        check_scan_config(config)

    def close(self) -> None:
        if self._prober is not None:
            self._prober.close()
            self._prober = None

    def __enter__(self) -> Scanner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def scan(self, url: str, span: tuple[int, int] | None = None) -> Iterator[SampleRecord]:
        """Records of one shard in order; bad samples go through the failure policy.

        `span`: one piece of a big file split across index workers (a .jsonl's byte range, a
        .parquet's row groups, a megatron .bin's documents). While it runs, `self.cursor` is
        the format's sample iterable when it reports progress itself (`done_fraction()`) and
        None when a record's member offsets do."""
        from .chat_text import ChatNotStorableError
        from .sources.registry import format_for

        fmt = format_for(url)
        raws = fmt.samples(url, self.config, span)
        self.cursor = raws if hasattr(raws, "done_fraction") else None
        keep = fmt.keeps_payload  # offsets are rows or decompressed: keep the bytes
        for raw in raws:
            if isinstance(raw, BadMember):
                self.log.fail(url, raw.key, raw.reason)
                continue
            if isinstance(raw, SampleRecord):  # counted by the format itself (megatron ids)
                self.log.ok()
                yield raw
                continue
            try:
                record = self.record(url, raw)
                _check_columns(record, self._limits)
            except (MissingDependencyError, ChatNotStorableError):
                raise  # a configuration error (PyAV, tokenizers missing): not a bad sample
            except (ValueError, ProbeTimeout) as exc:
                self.log.fail(url, raw.key, str(exc))
                continue
            if keep:
                record.payload = raw.payload
            self.log.ok()
            yield record

    def _text(self, data: bytes, what: str) -> str:
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MemberError(f"{what} is not UTF-8 ({exc}); re-encode it") from exc

    def _json(self, data: bytes) -> dict[str, Any]:
        return decode_json_object(data, ".json")

    def _sidecar(self, data: bytes) -> dict[str, Any]:
        try:
            return self._json(data)
        except ValueError as exc:
            raise MemberError(f"sidecar {exc}") from exc

    def _caption(self, raw: RawSample, fields: dict[str, Any] | None) -> int:
        if "txt" in raw.payload:
            return self.counter(self._text(raw.payload["txt"], ".txt caption"))
        if fields is not None and isinstance(fields.get(self.config.caption_field), str):
            return self.counter(fields[self.config.caption_field])
        if fields is not None and isinstance(fields.get(self.config.caption_field), list):
            from ..vision import count_chat, is_chat  # a conversation (chat-style sample)

            turns = fields[self.config.caption_field]
            if is_chat(turns):
                return count_chat(turns, self.counter)
        return 0

    def _video_meta(
        self, url: str, raw: RawSample, vext: str, fields: dict[str, Any] | None
    ) -> VideoMeta:
        if fields is not None:
            return video_meta_from_fields(fields)
        data = raw.payload.get(vext)
        if data is None:
            data = read_members(url, raw.members, [vext])[vext]
        if self._prober is None:
            self._prober = Prober(
                self.config.probe_backend,  # type: ignore[arg-type]
                self.config.probe_timeout_s,
            )
        return self._prober.probe(data)

    def record(self, url: str, stored: RawSample) -> SampleRecord:
        """One raw sample to a record; ValueError says why the sample is unusable.

        Gzipped text members (`.txt.gz`, ...) are counted from their gunzipped bytes, as
        webdataset decodes them; the record keeps the members as stored (members.py)."""
        c = self.config
        keep = stored.payload if not is_seekable(url) else None
        common = {"key": stored.key, "url": url, "members": dict(stored.members), "payload": keep}
        raw = stored
        if any(e in GZ_INNER for e in stored.members):
            raw = RawSample(
                key=stored.key,
                members={GZ_INNER.get(e, e): v for e, v in stored.members.items()},
                payload=gunzip_members(stored.payload, c.stream_max_bytes),
            )
        exts = raw.members
        vext = next((e for e in VIDEO_EXTS if e in exts), None)
        if vext is not None:
            fields = self._sidecar(raw.payload["json"]) if "json" in raw.payload else None
            meta = self._video_meta(url, raw, vext, fields)
            vt = self.rule.video(
                num_frames=meta.num_frames, fps=meta.fps, height=meta.height, width=meta.width
            )
            return SampleRecord(
                modality=Modality.VIDEO.value,
                text_tokens=self._caption(raw, fields),
                vision_tokens=vt.vision,
                special_tokens=vt.special + c.text_special_tokens,
                causal=c.video_causal,
                num_frames=meta.num_frames,
                fps=meta.fps,
                width=meta.width,
                height=meta.height,
                **common,
            )
        iext = next((e for e in IMAGE_EXTS if e in exts), None)
        if iext is not None:
            height, width = image_size(raw.payload[iext])
            fields = self._json(raw.payload["json"]) if "json" in raw.payload else None
            vt = self.rule.image(height=height, width=width)
            return SampleRecord(
                modality=Modality.IMAGE.value,
                text_tokens=self._caption(raw, fields),
                vision_tokens=vt.vision,
                special_tokens=vt.special + c.text_special_tokens,
                causal=c.image_causal,
                width=width,
                height=height,
                **common,
            )
        if "npy" in exts:
            from .index_format import NPY_ERRORS  # index_format imports this module

            try:
                ids = np.load(io.BytesIO(raw.payload["npy"]), allow_pickle=False)
            except NPY_ERRORS as exc:  # a damaged header raised tokenize.TokenError
                raise MemberError(
                    f".npy token ids do not load ({type(exc).__name__}: {exc})"
                ) from exc
            if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
                raise MemberError(
                    f".npy token ids must be a 1-D integer array, got "
                    f"{ids.dtype} with shape {ids.shape}"
                )
            from .token_store import check_ids, vocab_size_of

            check_ids(ids, vocab_size_of(self.counter))  # negative or past the vocabulary
            n = int(ids.shape[0])
        elif "txt" in exts:
            n = self.counter(self._text(raw.payload["txt"], ".txt"))
        elif "json" in exts:
            fields = self._json(raw.payload["json"])
            text = fields.get(c.text_field)
            from ..vision import is_chat

            if is_chat(text):  # a conversation: ChatML-rendered, counted piece by piece
                from .chat_text import count_text_chat

                n = count_text_chat(text, self.counter)
                leave_out = getattr(self.counter, "leave_out", None)
                if leave_out is not None:  # a TokenRecorder: the store holds no chat (its
                    leave_out()  # loss targets come from the turns, rendered by the loader)
            elif not isinstance(text, str):
                raise MemberError(
                    f".json has no string field {c.text_field!r} (fields: "
                    f"{sorted(fields)[:8]}); set text_field / --text-field (a chat's "
                    "{role, content} list counts too: --text-field messages)"
                )
            else:
                n = self.counter(text)
        else:
            raise MemberError(
                f"no payload: members {sorted(stored.members)} include no text "
                f"({', '.join(TEXT_EXTS)}, also gzipped as .txt.gz / .json.gz / .npy.gz), "
                "image or video"
            )
        if n == 0:
            raise MemberError("empty text (0 tokens); drop the sample from the shard")
        return SampleRecord(
            modality=Modality.TEXT.value,
            text_tokens=n,
            vision_tokens=0,
            special_tokens=c.text_special_tokens,
            causal=True,
            **common,
        )
