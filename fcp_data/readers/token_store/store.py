"""Token store: every text sample's token ids, written once at index time, memory-mapped after.

Tokenizing in the loader costs every replica of a degree-d CP group the whole sequence to keep
2 of its 2d zigzag chunks. With a store the index workers tokenize each text sample once and the
loader slices only the chunks a replica holds (Megatron's indexed dataset does the same: one flat
array plus offsets). Files beside the length index:

    tokens.bin          the ids of all samples back to back, in the narrowest unsigned dtype that
                        holds the vocabulary (uint16 up to 65,536 ids: 2 bytes/token, not 8)
    token_offsets.npy   int64[n + 1]; sample i's ids are tokens.bin[offsets[i]:offsets[i + 1]]
    tokens.json         format, tokenizer identity, sample and token counts, dtype, vocabulary
                        size and largest id, digest of the per-sample lengths, the index's
                        fingerprint, a blake2b of every 4 MiB chunk of tokens.bin, and a digest
                        of the header itself

`fcp index --tokenizer FILE` writes a store by default (`--no-store` turns it off; a `bytes:R`
estimate gets none, the loader computes those ids itself). Only text samples the loader would
tokenize have ids here; media samples, text chats (their loss targets come from the turns) and,
unless `--store-tokens` asks for them, pre-tokenized `.npy` ids (a megatron `.bin` is not copied)
have an empty span and the loader encodes them as without a store. Opening checks the store
against its index (tokenizer, sample count, file size, every length, the index fingerprint: a
store copied from another index whose lengths happen to agree is refused) and refuses a
mismatch with `TokenStoreMismatchError` naming the file. An edited tokens.json (a dtype changed
by hand reads garbage) fails its own digest; a dtype that is not the one the build chose, or ids
past the recorded vocabulary, are refused.

Content: tokens.bin is hashed in 4 MiB chunks at build time (blake2b, ~1 GB/s); each chunk is
verified the first time a process touches it (`verify_span`, from `tokens` and `ids`), so a
byte swapped inside the file (same size) raises `TokenStoreCorruptError` naming the store, the
chunk and both digests instead of training on wrong ids. Cost: one pass over the chunks a
process reads, once (4 ms a chunk); nothing after.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from ...errors import ArgumentTypeError, ConfigError, IndexMismatchError, MemberError
from ...vision.modality import Modality

__all__ = [
    "CHUNK_BYTES",
    "FLAT_NAME",
    "MAX_TOKEN_ID",
    "OFFSETS_NAME",
    "STORE_HEADER_NAME",
    "STORE_VERSION",
    "StoreHeader",
    "StoredTokens",
    "TokenStore",
    "TokenStoreCorruptError",
    "TokenStoreMismatchError",
    "check_ids",
    "lengths_digest",
    "narrowest_dtype",
    "vocab_size_of",
]

STORE_VERSION = 1
STORE_HEADER_NAME = "tokens.json"
FLAT_NAME = "tokens.bin"
OFFSETS_NAME = "token_offsets.npy"
CHUNK_BYTES = 4 << 20  # tokens.bin bytes per digest: 250k digests (8 MB of JSON) per TB
UNSIGNED = ("|u1", "<u2", "<u4", "<u8")  # what `narrowest_dtype(...).str` can be


class TokenStoreMismatchError(IndexMismatchError):
    """A token store that does not belong to its index (tokenizer, count, size or lengths)."""


class TokenStoreCorruptError(TokenStoreMismatchError):
    """tokens.bin bytes that differ from the digest recorded when the store was written."""


class StoreHeader(msgspec.Struct, kw_only=True, frozen=True):
    """What identifies a store; `lengths_sha256` covers every sample's id count, `chunk_blake2b`
    every `chunk_bytes` of tokens.bin, `header_blake2b` every other field. Stores written before
    the digests existed have the defaults and load with a warning that they are not checked."""

    format_version: int
    tokenizer: str
    num_samples: int
    num_tokens: int
    dtype: str
    vocab_size: int
    lengths_sha256: str
    max_id: int = -1
    index_fingerprint: str = ""
    chunk_bytes: int = 0
    chunk_blake2b: list[str] = []
    header_blake2b: str = ""


def _header_digest(header: StoreHeader) -> str:
    body = msgspec.json.encode(msgspec.structs.replace(header, header_blake2b=""))
    return hashlib.blake2b(body, digest_size=16).hexdigest()


def vocab_size_of(counter: Any) -> int:
    """The vocabulary size of a counter's or tokenizer's HF tokenizer when it says, else 0."""
    fn = getattr(counter, "fn", counter)
    inner = getattr(fn, "tokenizer", None) or getattr(getattr(fn, "fast", None), "tokenizer", None)
    get = getattr(inner, "get_vocab_size", None)
    return int(get(with_added_tokens=True)) if callable(get) else 0


MAX_TOKEN_ID = (1 << 31) - 1
"""The largest id accepted when the tokenizer states no vocabulary (`bytes:R`, a `py:` callable):
no model's vocabulary comes near 2^31 (the largest in use hold ~10^6 ids), megatron stores ids
as int32 at most, and an id past it cannot index any embedding table, so it is damage."""


def check_ids(ids: np.ndarray, vocab_size: int) -> None:
    """ValueError (a counted skip in the scanner, a bad sample in the loader) when pre-tokenized
    ids are negative or not below `vocab_size` (0: unknown, then ids must be <= MAX_TOKEN_ID;
    a 2^40 id passed unchecked before)."""
    if not ids.size:
        return
    low, high = int(ids.min()), int(ids.max())
    if low < 0:
        raise MemberError(f".npy token ids must be >= 0; this sample has {low}")
    if vocab_size > 0 and high >= vocab_size:
        raise MemberError(
            f".npy token id {high} is past the tokenizer's vocabulary of {vocab_size} ids "
            f"(ids must be < {vocab_size}); re-tokenize the sample with the index's tokenizer"
        )
    if vocab_size <= 0 and high > MAX_TOKEN_ID:
        raise MemberError(
            f".npy token id {high} is past {MAX_TOKEN_ID} (2^31 - 1), the largest id fcp takes "
            "when the tokenizer states no vocabulary size (no embedding table is that large); "
            "the sample's ids are damaged: re-tokenize it, or pass a tokenizer with a vocabulary "
            "so ids are checked against it"
        )


def narrowest_dtype(max_id: int) -> np.dtype:
    """uint8 / uint16 / uint32 / uint64: the smallest unsigned type holding `max_id`."""
    for dt in (np.uint8, np.uint16, np.uint32, np.uint64):
        if max_id <= np.iinfo(dt).max:
            return np.dtype(dt)
    raise ConfigError(f"token id {max_id} does not fit in 64 bits")


def lengths_digest(lengths: np.ndarray) -> str:
    """sha256 of the per-sample id counts as little-endian int64 (first 32 hex digits)."""
    return hashlib.sha256(np.ascontiguousarray(lengths, dtype="<i8").tobytes()).hexdigest()[:32]


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
            raise ArgumentTypeError(f"StoredTokens takes a slice [a:b], got {type(s).__name__}")
        a, b, step = s.indices(self.n + self.eod)
        if step != 1:
            raise ConfigError(f"StoredTokens takes contiguous slices (step 1), got step {step}")
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
        # chunks of tokens.bin this process has verified (first touch), one flag a chunk
        self._verified = np.zeros(len(header.chunk_blake2b), dtype=bool)
        self.verify_chunks = bool(header.chunk_blake2b)  # False: bench's "without" side

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
        _check_header(head, header)
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
        from ..index_format import index_fingerprint

        if h.index_fingerprint and h.index_fingerprint != index_fingerprint(index.header):
            raise TokenStoreMismatchError(
                f"{where} was written for the index with fingerprint {h.index_fingerprint}, "
                f"not for {index.path} ({index_fingerprint(index.header)}: other shards or "
                "other shard contents, even if the lengths agree); rebuild with "
                "`fcp index --store-tokens`"
            )
        text = np.asarray(index.modality) == Modality.TEXT
        want = np.where(text, np.asarray(index.text_tokens, dtype=np.int64), 0)
        have = np.diff(np.asarray(self.offsets))
        # an empty span is a sample the store leaves to the loader (a chat, .npy ids)
        fits = have.shape == want.shape and bool(np.all((have == want) | (have == 0)))
        if lengths_digest(have) != h.lengths_sha256 or not fits:
            bad = (
                np.flatnonzero((have != want) & (have != 0))
                if have.shape == want.shape
                else np.arange(1)
            )
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
        """Sample i's ids (a memory-mapped view in the store's dtype), its chunks verified."""
        s, e = int(self.offsets[i]), int(self.offsets[i + 1])
        self.verify_span(s, e)
        return self.flat[s:e]

    def tokens(self, i: int, *, eod: int, eod_id: int) -> StoredTokens:
        """Sample i's ids + `eod` EOD ids, sliced lazily; the chunks holding them are verified
        now (the encoder's call, under the sample time limit and the on_error policy)."""
        s, e = int(self.offsets[i]), int(self.offsets[i + 1])
        self.verify_span(s, e)
        return StoredTokens(self.flat, s, e - s, eod, eod_id)

    def verify_span(self, start: int, end: int) -> None:
        """Verify the chunks of tokens.bin holding ids [start, end) not verified yet in this
        process; TokenStoreCorruptError names the store, the chunk and both digests."""
        if not self.verify_chunks or end <= start:
            return
        size, step = self.flat.dtype.itemsize, self.header.chunk_bytes
        first, last = start * size // step, ((end * size) - 1) // step
        todo = np.flatnonzero(~self._verified[first : last + 1]) + first
        if not todo.size:
            return
        raw = self.flat.view(np.uint8)
        for c in todo.tolist():
            got = hashlib.blake2b(raw[c * step : (c + 1) * step], digest_size=16).hexdigest()
            want = self.header.chunk_blake2b[c]
            if got != want:
                raise TokenStoreCorruptError(
                    f"{self.path / FLAT_NAME}: chunk {c} (bytes {c * step}..{(c + 1) * step}) "
                    f"has blake2b {got}, {STORE_HEADER_NAME} recorded {want}: the token store "
                    "changed after it was written (a copy gone wrong, an edit, bad storage); "
                    "rebuild it with `fcp index --store-tokens`"
                )
            self._verified[c] = True

    def __reduce__(self) -> tuple[Any, ...]:
        # a worker reopens the store and verifies the chunks it touches itself
        return TokenStore.open, (str(self.path),), {"verify_chunks": self.verify_chunks}

    def __repr__(self) -> str:
        h = self.header
        return (
            f"TokenStore({str(self.path)!r}, samples={h.num_samples}, tokens={h.num_tokens}, "
            f"dtype={np.dtype(h.dtype).name}, tokenizer={h.tokenizer!r})"
        )


def _check_header(head: Path, h: StoreHeader) -> None:
    """Refuse a tokens.json that was edited, a dtype the build would not have chosen, ids past
    the vocabulary, or digests that do not cover tokens.bin."""
    rebuild = "rebuild it with `fcp index --store-tokens`"
    if not h.header_blake2b:
        warnings.warn(
            f"{head} has no digests (written before they existed): its ids are not verified; "
            f"{rebuild} to turn the checks on",
            stacklevel=3,
        )
        return
    if _header_digest(h) != h.header_blake2b:
        raise TokenStoreMismatchError(
            f"{head} was edited after it was written (its digest {h.header_blake2b} does not "
            f"match its fields, now tokenizer={h.tokenizer!r}, dtype={h.dtype!r}, "
            f"vocab_size={h.vocab_size}, "
            f"num_tokens={h.num_tokens}); {rebuild}"
        )
    if h.dtype not in UNSIGNED:
        raise TokenStoreMismatchError(
            f"{head}: dtype {h.dtype!r} is not a little-endian unsigned integer type "
            f"({', '.join(UNSIGNED)}); {rebuild}"
        )
    want = narrowest_dtype(max(h.max_id, h.vocab_size - 1)).str
    if h.dtype != want:
        raise TokenStoreMismatchError(
            f"{head}: dtype {h.dtype!r}, but ids up to {max(h.max_id, h.vocab_size - 1)} "
            f"were written as {want!r}; {rebuild}"
        )
    if h.vocab_size > 0 and h.max_id >= h.vocab_size:
        raise TokenStoreMismatchError(
            f"{head}: the largest id {h.max_id} is past the vocabulary of {h.vocab_size}; {rebuild}"
        )
    size = h.num_tokens * np.dtype(h.dtype).itemsize
    if h.chunk_bytes <= 0 or len(h.chunk_blake2b) != -(-size // h.chunk_bytes):
        raise TokenStoreMismatchError(
            f"{head}: {len(h.chunk_blake2b)} chunk digests of {h.chunk_bytes} bytes do not "
            f"cover tokens.bin's {size} bytes; {rebuild}"
        )
