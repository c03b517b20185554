"""Token store: every text sample's token ids, written once at index time, memory-mapped after.

Tokenizing in the loader costs every replica of a degree-d CP group the whole sequence to keep
2 of its 2d zigzag chunks. With a store the index workers tokenize each text sample once and the
loader slices only the chunks a replica holds (Megatron's indexed dataset does the same: one flat
array plus offsets). Files beside the length index:

    tokens.bin          the ids of all samples back to back, in the narrowest unsigned dtype that
                        holds the vocabulary (uint16 up to 65,536 ids: 2 bytes/token, not 8)
    token_offsets.npy   int64[n + 1]; sample i's ids are tokens.bin[offsets[i]:offsets[i + 1]]
    tokens.json         format, tokenizer identity, sample and token counts, dtype, digest of the
                        per-sample lengths

Only text samples (modality 0) have ids here; media samples have an empty span and the loader
encodes them as before. Opening checks the store against its index (tokenizer, sample count,
file size, every length) and refuses a mismatch with `TokenStoreMismatchError` naming the file.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from ..errors import ConfigError, IndexMismatchError
from .text import RatioCounter, TokenCounter

__all__ = [
    "FLAT_NAME",
    "OFFSETS_NAME",
    "STORE_HEADER_NAME",
    "StoreHeader",
    "StoredTokens",
    "TokenRecorder",
    "TokenStore",
    "TokenStoreMismatchError",
    "lengths_digest",
    "narrowest_dtype",
    "pack_ids",
    "write_store",
]

STORE_VERSION = 1
STORE_HEADER_NAME = "tokens.json"
FLAT_NAME = "tokens.bin"
OFFSETS_NAME = "token_offsets.npy"
TEXT = 0


class TokenStoreMismatchError(IndexMismatchError):
    """A token store that does not belong to its index (tokenizer, count, size or lengths)."""


class StoreHeader(msgspec.Struct, kw_only=True, frozen=True):
    """What identifies a store; `lengths_sha256` covers every sample's id count."""

    format_version: int
    tokenizer: str
    num_samples: int
    num_tokens: int
    dtype: str
    vocab_size: int
    lengths_sha256: str


def narrowest_dtype(max_id: int) -> np.dtype:
    """uint8 / uint16 / uint32 / uint64: the smallest unsigned type holding `max_id`."""
    for dt in (np.uint8, np.uint16, np.uint32, np.uint64):
        if max_id <= np.iinfo(dt).max:
            return np.dtype(dt)
    raise ConfigError(f"token id {max_id} does not fit in 64 bits")


def lengths_digest(lengths: np.ndarray) -> str:
    """sha256 of the per-sample id counts as little-endian int64 (first 32 hex digits)."""
    return hashlib.sha256(np.ascontiguousarray(lengths, dtype="<i8").tobytes()).hexdigest()[:32]


class TokenRecorder(TokenCounter):
    """A counter that keeps the ids of the last text it counted (index-time capture).

    The scanner counts each text sample exactly once, so the ids of the record it yields next
    are `last`; `take` hands them over and clears them so a stale capture cannot be reused.
    """

    def __init__(self, counter: TokenCounter) -> None:
        fn = getattr(counter, "fn", None)
        if isinstance(counter, RatioCounter) or fn is None:
            raise ConfigError(
                f"--store-tokens needs a real tokenizer, not {counter.spec!r} (an estimate has "
                "no ids); index with --tokenizer PATH/tokenizer.json or py:module:callable"
            )
        self.fn, self.spec = fn, counter.spec
        self.last: np.ndarray | None = None

    def count(self, text: str) -> int:
        ids = self.fn(text)
        if isinstance(ids, (int, np.integer)):
            raise ConfigError(
                f"the tokenizer {self.spec!r} returns a count, not ids; --store-tokens needs "
                "a callable str -> token ids"
            )
        self.last = np.asarray(ids, dtype=np.int64)
        return int(self.last.shape[0])

    def take(self, record: Any) -> np.ndarray:
        """Ids of a just-scanned record: the captured text ids, .npy ids, or none for media."""
        if record.modality != TEXT:
            return np.zeros(0, dtype=np.int64)
        if "npy" in record.members:
            raw = record.fetch(["npy"])["npy"]
            ids = np.load(io.BytesIO(raw), allow_pickle=False).astype(np.int64).ravel()
        else:
            ids, self.last = self.last, None
            if ids is None:
                raise RuntimeError(f"no ids were captured for text sample {record.key!r}")
        if ids.shape[0] != record.text_tokens:
            raise RuntimeError(
                f"sample {record.key!r}: {ids.shape[0]} ids captured, {record.text_tokens} counted"
            )
        if ids.size and int(ids.min()) < 0:
            raise ConfigError(f"sample {record.key!r} has negative token ids; ids must be >= 0")
        return ids

    def vocab_size(self) -> int:
        """The tokenizer's vocabulary size when it says (HF tokenizers), else 0."""
        inner = getattr(self.fn, "tokenizer", None) or getattr(
            getattr(self.fn, "fast", None), "tokenizer", None
        )
        get = getattr(inner, "get_vocab_size", None)
        return int(get(with_added_tokens=True)) if callable(get) else 0


def pack_ids(ids: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """One shard's captured ids as (flat ids, lengths), narrowed to uint32 when they fit, so
    a worker hands the parent 4 bytes a token instead of 8."""
    lengths = np.array([a.shape[0] for a in ids], dtype=np.int64)
    flat = np.concatenate(ids) if ids else np.zeros(0, dtype=np.int64)
    if not flat.size or int(flat.max()) <= np.iinfo(np.uint32).max:
        flat = flat.astype(np.uint32)
    return flat, lengths


def write_store(
    out: Path, *, tokenizer: str, vocab_size: int, pieces: Iterable[tuple[np.ndarray, np.ndarray]]
) -> StoreHeader:
    """Write tokens.bin, token_offsets.npy and tokens.json into directory `out`.

    `pieces` yields (flat ids, per-sample lengths) in sample order (one per shard); the dtype
    is chosen from the vocabulary size or, when unknown, the largest id seen.
    """
    pieces = list(pieces)
    lengths = np.concatenate([ln for _, ln in pieces] or [np.zeros(0, np.int64)]).astype(np.int64)
    max_id = max((int(f.max()) for f, _ in pieces if f.size), default=0)
    dtype = narrowest_dtype(max(max_id, vocab_size - 1))
    with open(out / FLAT_NAME, "wb") as fh:
        for flat, _ in pieces:
            fh.write(np.ascontiguousarray(flat, dtype=dtype).tobytes())
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
    )
    (out / STORE_HEADER_NAME).write_bytes(msgspec.json.format(msgspec.json.encode(header)))
    return header


class StoredTokens:
    """A text sample's ids + `eod` end-of-document ids, sliced lazily from the memory map.

    `pack_shard` slices only the zigzag chunks a replica holds (`lazy_slices`), so a member of
    a degree-d group touches 2/(2d) of the sequence's pages instead of all of them.
    """

    __slots__ = ("eod", "eod_id", "flat", "n", "start")
    lazy_slices = True

    def __init__(self, flat: np.ndarray, start: int, n: int, eod: int, eod_id: int) -> None:
        self.flat, self.start, self.n, self.eod, self.eod_id = flat, start, n, eod, eod_id

    def __len__(self) -> int:
        return self.n + self.eod

    def __getitem__(self, s: slice) -> np.ndarray:
        if not isinstance(s, slice):
            raise TypeError("StoredTokens supports slices only")
        a, b, step = s.indices(self.n + self.eod)
        if step != 1:
            raise ValueError("StoredTokens supports contiguous slices only")
        out = np.empty(max(0, b - a), dtype=np.int64)
        k = max(0, min(b, self.n) - a)
        if k:
            out[:k] = self.flat[self.start + a : self.start + a + k]
        out[k:] = self.eod_id
        return out

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        arr = self[0 : len(self)]
        return arr if dtype is None else arr.astype(dtype)


class TokenStore:
    """Read-only view of a token store (see the module docstring); pickles as its path."""

    def __init__(self, path: Path, header: StoreHeader, flat: np.ndarray, offsets: np.ndarray):
        self.path, self.header, self.flat, self.offsets = path, header, flat, offsets

    @staticmethod
    def exists(index_dir: str | os.PathLike[str]) -> bool:
        return (Path(index_dir) / STORE_HEADER_NAME).is_file()

    @classmethod
    def open(cls, index_dir: str | os.PathLike[str], *, index: Any = None) -> TokenStore:
        """Memory-map the store in `index_dir`; with `index` (its LengthIndex) check it fits."""
        path = Path(index_dir)
        head = path / STORE_HEADER_NAME
        try:
            header = msgspec.json.decode(head.read_bytes(), type=StoreHeader)
        except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise TokenStoreMismatchError(
                f"{head} is not a readable token store header ({exc}); rebuild the index "
                "with `fcp index --store-tokens`"
            ) from exc
        if header.format_version != STORE_VERSION:
            raise TokenStoreMismatchError(
                f"{head}: store format {header.format_version}, this fcp reads "
                f"{STORE_VERSION}; rebuild with `fcp index --store-tokens`"
            )
        flat_path, off_path = path / FLAT_NAME, path / OFFSETS_NAME
        dtype = np.dtype(header.dtype)
        want = header.num_tokens * dtype.itemsize
        size = flat_path.stat().st_size if flat_path.is_file() else -1
        if size != want:
            raise TokenStoreMismatchError(
                f"{flat_path} holds {size} bytes, its header says {header.num_tokens} "
                f"{dtype.name} ids ({want} bytes): the file is truncated or replaced; rebuild "
                "with `fcp index --store-tokens`"
            )
        try:
            offsets = np.load(off_path)  # 8 bytes a sample: in memory
        except (OSError, ValueError) as exc:
            raise TokenStoreMismatchError(f"{off_path} does not load ({exc})") from exc
        if offsets.shape != (header.num_samples + 1,) or (
            header.num_samples and int(offsets[-1]) != header.num_tokens
        ):
            raise TokenStoreMismatchError(
                f"{off_path} has shape {offsets.shape} ending at "
                f"{int(offsets[-1]) if offsets.size else None}; the header says "
                f"{header.num_samples} samples, {header.num_tokens} ids"
            )
        flat = (
            # a plain ndarray view of the map: slicing it is ~10x cheaper than a memmap's
            np.memmap(flat_path, dtype=dtype, mode="r").view(np.ndarray)
            if want
            else np.zeros(0, dtype=dtype)  # mmap of an empty file is an error
        )
        store = cls(path, header, flat, offsets)
        if index is not None:
            store.check(index)
        return store

    def check(self, index: Any) -> None:
        """Refuse a store built for another index: tokenizer, sample count, every length."""
        h, where = self.header, self.path / STORE_HEADER_NAME
        if h.tokenizer != index.header.tokenizer:
            raise TokenStoreMismatchError(
                f"{where} was tokenized with {h.tokenizer!r} but its index counted with "
                f"{index.header.tokenizer!r}; rebuild with `fcp index --store-tokens`"
            )
        if h.num_samples != len(index):
            raise TokenStoreMismatchError(
                f"{where} holds {h.num_samples} samples, its index {len(index)}; rebuild "
                "with `fcp index --store-tokens`"
            )
        text = np.asarray(index.modality) == TEXT
        want = np.where(text, np.asarray(index.text_tokens, dtype=np.int64), 0)
        have = np.diff(np.asarray(self.offsets))
        if lengths_digest(have) != h.lengths_sha256 or not np.array_equal(have, want):
            bad = np.flatnonzero(have != want) if have.shape == want.shape else np.arange(1)
            i = int(bad[0]) if bad.size else 0
            raise TokenStoreMismatchError(
                f"{self.path / OFFSETS_NAME}: sample {i} has "
                f"{int(have[i]) if i < have.size else None} ids, the index counts "
                f"{int(want[i]) if i < want.size else None} (digest {h.lengths_sha256}); the "
                "store belongs to another index, rebuild with `fcp index --store-tokens`"
            )

    def __len__(self) -> int:
        return self.header.num_samples

    def has(self, i: int) -> bool:
        return int(self.offsets[i + 1]) > int(self.offsets[i])

    def ids(self, i: int) -> np.ndarray:
        """Sample i's ids (a memory-mapped view in the store's dtype)."""
        return self.flat[int(self.offsets[i]) : int(self.offsets[i + 1])]

    def tokens(self, i: int, *, eod: int, eod_id: int) -> StoredTokens:
        s, e = int(self.offsets[i]), int(self.offsets[i + 1])
        return StoredTokens(self.flat, s, e - s, eod, eod_id)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return TokenStore.open, (str(self.path),)

    def __repr__(self) -> str:
        h = self.header
        return (
            f"TokenStore({str(self.path)!r}, samples={h.num_samples}, tokens={h.num_tokens}, "
            f"dtype={np.dtype(h.dtype).name}, tokenizer={h.tokenizer!r})"
        )
