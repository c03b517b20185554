"""Writing a token store: the ids the index workers capture while they count, packed and
written beside the length index with their digests (the layout: `token_store.store`).

Writing and reading are apart because they run in different places: the recorder and the
writer run once, inside `build_index` and its workers; the reader runs in every loader
process for the whole of training.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from ...errors import ConfigError, DataError
from ...vision.modality import Modality
from ..text import RatioCounter, TokenCounter
from .store import (
    CHUNK_BYTES,
    FLAT_NAME,
    OFFSETS_NAME,
    STORE_HEADER_NAME,
    STORE_VERSION,
    StoreHeader,
    _header_digest,
    lengths_digest,
    narrowest_dtype,
    vocab_size_of,
)

__all__ = ["TokenRecorder", "pack_ids", "storable", "write_store"]


def storable(counter: Any) -> bool:
    """True when `counter` tokenizes (a tokenizer file, `py:` ids) rather than estimates: what
    `fcp index` writes a token store for by default."""
    return not isinstance(counter, RatioCounter) and getattr(counter, "fn", None) is not None


class TokenRecorder(TokenCounter):
    """A counter that keeps the ids of the last text it counted (index-time capture).

    The scanner counts each text sample exactly once, so the ids of the record it yields next
    are `last`; `take` hands them over and clears them so a stale capture cannot be reused.

    Chats are left out of the store (an empty span: the loader renders them and their loss
    targets from the sample, as without a store), and so are `.npy` ids unless `keep_npy`
    (the loader reads those without tokenizing, and a megatron `.bin` would be copied whole).
    `required=False` is the default store of `fcp index --tokenizer`: a `py:` counter that
    returns counts, not ids, then marks the recorder `unusable` (no store is written) instead
    of stopping the build.
    """

    def __init__(self, counter: TokenCounter, *, required: bool = True, keep_npy: bool = True):
        fn = getattr(counter, "fn", None)
        if isinstance(counter, RatioCounter) or fn is None:
            raise ConfigError(
                f"--store-tokens needs a real tokenizer, not {counter.spec!r} (an estimate has "
                "no ids); index with --tokenizer PATH/tokenizer.json or py:module:callable"
            )
        self.fn, self.spec = fn, counter.spec
        self.required, self.keep_npy = required, keep_npy
        self.last: np.ndarray | None = None
        self.unusable = False  # a count-only counter under required=False
        self._left_out = False

    def count(self, text: str) -> int:
        out = self.fn(text)
        ids = None
        if not isinstance(out, (int, np.integer)):
            try:
                ids = np.asarray(out, dtype=np.int64)
            except (TypeError, ValueError):  # words, say: str.split as a counter
                ids = None
        if ids is None or ids.ndim != 1:
            if not self.required:  # the default store: this counter has no ids to keep
                self.unusable = True
                return int(out) if isinstance(out, (int, np.integer)) else len(out)
            raise ConfigError(
                f"the tokenizer {self.spec!r} returns {type(out).__name__}, not token ids; "
                "--store-tokens needs a callable str -> token ids"
            )
        self.last = ids
        return int(ids.shape[0])

    def leave_out(self) -> None:
        """The sample just counted (a chat) gets an empty span in the store."""
        self.last, self._left_out = None, True

    def take(self, record: Any) -> np.ndarray:
        """Ids of a just-scanned record: the captured text ids, .npy ids (with `keep_npy`), or
        none for media, chats and a count-only counter."""
        left_out, self._left_out = self._left_out, False
        if record.modality != Modality.TEXT or left_out or self.unusable:
            self.last = None
            return np.zeros(0, dtype=np.int64)
        if "npy" in record.members and not self.keep_npy:
            return np.zeros(0, dtype=np.int64)
        if "npy" in record.members:
            raw = record.fetch(["npy"])["npy"]
            ids = np.load(io.BytesIO(raw), allow_pickle=False).astype(np.int64).ravel()
        else:
            ids, self.last = self.last, None
            if ids is None:
                raise DataError(f"no ids were captured for text sample {record.key!r}")
        if ids.shape[0] != record.text_tokens:
            raise DataError(
                f"sample {record.key!r}: {ids.shape[0]} ids captured, {record.text_tokens} counted"
            )
        if ids.size and int(ids.min()) < 0:
            raise ConfigError(f"sample {record.key!r} has negative token ids; ids must be >= 0")
        return ids

    def vocab_size(self) -> int:
        """The tokenizer's vocabulary size when it says (HF tokenizers), else 0."""
        return vocab_size_of(self.fn)


def pack_ids(ids: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """One shard's captured ids as (flat ids, lengths), narrowed to uint32 when they fit, so
    a worker hands the parent 4 bytes a token instead of 8."""
    lengths = np.array([a.shape[0] for a in ids], dtype=np.int64)
    flat = np.concatenate(ids) if ids else np.zeros(0, dtype=np.int64)
    if not flat.size or int(flat.max()) <= np.iinfo(np.uint32).max:
        flat = flat.astype(np.uint32)
    return flat, lengths


def write_store(
    out: Path,
    *,
    tokenizer: str,
    vocab_size: int,
    pieces: Iterable[tuple[np.ndarray, np.ndarray]],
    index_fingerprint: str = "",
) -> StoreHeader:
    """Write tokens.bin, token_offsets.npy and tokens.json into directory `out`.

    `pieces` yields (flat ids, per-sample lengths) in sample order (one per shard); the dtype
    is chosen from the vocabulary size or, when unknown, the largest id seen. tokens.bin is
    hashed in `CHUNK_BYTES` chunks while it is written; `index_fingerprint` (the index's
    `index_format.index_fingerprint`) binds the store to its index.
    """
    pieces = list(pieces)
    lengths = np.concatenate([ln for _, ln in pieces] or [np.zeros(0, np.int64)]).astype(np.int64)
    max_id = max((int(f.max()) for f, _ in pieces if f.size), default=0)
    if vocab_size > 0 and max_id >= vocab_size:
        raise ConfigError(
            f"token id {max_id} is past the tokenizer's vocabulary of {vocab_size} ids; the "
            "tokenizer and its reported vocabulary disagree"
        )
    dtype = narrowest_dtype(max(max_id, vocab_size - 1))
    chunks: list[str] = []
    pending = bytearray()
    with open(out / FLAT_NAME, "wb") as fh:
        for flat, _ in pieces:
            raw = np.ascontiguousarray(flat, dtype=dtype).tobytes()
            fh.write(raw)
            pending += raw
            while len(pending) >= CHUNK_BYTES:
                chunks.append(hashlib.blake2b(pending[:CHUNK_BYTES], digest_size=16).hexdigest())
                del pending[:CHUNK_BYTES]
        if pending:
            chunks.append(hashlib.blake2b(pending, digest_size=16).hexdigest())
    offsets = np.zeros(lengths.shape[0] + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    np.save(out / OFFSETS_NAME, offsets)
    header = StoreHeader(
        format_version=STORE_VERSION,
        tokenizer=tokenizer,
        num_samples=int(lengths.shape[0]),
        num_tokens=int(offsets[-1]),
        dtype=dtype.str,
        vocab_size=int(vocab_size),
        lengths_sha256=lengths_digest(lengths),
        max_id=int(max_id),
        index_fingerprint=index_fingerprint,
        chunk_bytes=CHUNK_BYTES,
        chunk_blake2b=chunks,
    )
    header = msgspec.structs.replace(header, header_blake2b=_header_digest(header))
    (out / STORE_HEADER_NAME).write_bytes(msgspec.json.format(msgspec.json.encode(header)))
    return header
