"""Megatron indexed datasets (`preprocess_data.py`'s PREFIX.bin + PREFIX.idx): token ids, no
tokenizer.

The `.idx` layout (megatron-core `indexed_dataset`, version 1, little-endian): the 9-byte magic
`MMIDIDX\\x00\\x00`, a u64 version (1), a u8 dtype code (1 uint8, 2 int8, 3 int16, 4 int32,
5 int64, 6 float64, 7 float32, 8 uint16), a u64 sequence count S, a u64 document count D, then
S int32 sequence lengths (tokens), S int64 sequence pointers (byte offsets into the .bin), D
int64 document indices (sequence boundaries: 0, ..., S), and for multimodal sets S int8 modes.

A sample here is a document (with `--split-sentences` its sentences are consecutive sequences,
contiguous in the .bin): its length comes from the .idx alone, and its one member `npy` is the
byte range of its ids in the .bin, read by `pread` or one HTTP range and handed to the loader
as a `.npy` (the loader's pre-tokenized path). Indexing reads the .idx and checks the .bin's
size against it (a short .bin, or one written with another dtype, is an error naming both
sizes); the .bin is read once only for the per-document crc32 of the index. The ids are
whatever preprocess_data wrote: with `--append-eod` each document already ends in EOD, so
index with `text_special_tokens=0` (`--text-special-tokens 0`) to not add a second one.
"""

from __future__ import annotations

import io
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import numpy as np

from ...errors import ConfigError
from ...vision.modality import Modality
from .format import CorpusFormat, SplitPiece

__all__ = [
    "FORMATS",
    "MegatronIndex",
    "as_npy",
    "megatron_idx",
    "megatron_prefix",
    "read_idx",
    "read_idx_file",
]

MAGIC = b"MMIDIDX\x00\x00"
HEAD = struct.Struct("<9sQBQQ")  # magic, version, dtype code, sequences, documents: 34 bytes
DTYPES = {1: "uint8", 2: "int8", 3: "int16", 4: "int32", 5: "int64", 8: "uint16"}
FLOAT_CODES = {6: "float64", 7: "float32"}


class MegatronFormatError(ConfigError):
    """A .idx that is not megatron's layout, or a .bin that does not match it."""


@dataclass(frozen=True, slots=True)
class MegatronIndex:
    """Per-document token counts and .bin byte ranges of one indexed dataset."""

    where: str
    dtype: np.dtype
    doc_tokens: np.ndarray  # int64 per document
    doc_offset: np.ndarray  # int64 byte offset of each document's ids in the .bin
    bin_bytes: int  # how many bytes the .bin must hold

    def __len__(self) -> int:
        return int(self.doc_tokens.shape[0])

    def check_bin(self, size: int, bin_url: str) -> None:
        """MegatronFormatError unless the .bin holds exactly the bytes the .idx addresses."""
        if size == self.bin_bytes:
            return
        item = self.dtype.itemsize
        tokens = self.bin_bytes // item if item else 0
        other = [
            name
            for name in sorted({*DTYPES.values()})
            if tokens and size == tokens * np.dtype(name).itemsize and name != self.dtype.name
        ]
        why = (
            f"as if written with another dtype ({' or '.join(other)}): the .idx and .bin come "
            "from different preprocess_data runs"
            if other
            else "short: a cut or partial copy"
            if size < self.bin_bytes
            else "longer than its .idx addresses: the pair does not belong together"
        )
        raise MegatronFormatError(
            f"{bin_url} is {size} bytes but {self.where} addresses {self.bin_bytes} "
            f"({tokens} {self.dtype.name} ids): the .bin is {why}; re-run preprocess_data or "
            "copy the matching pair"
        )

    def spans(self) -> Iterator[tuple[int, int, int]]:
        """(document, byte offset, tokens) in order."""
        yield from zip(
            range(len(self)), self.doc_offset.tolist(), self.doc_tokens.tolist(), strict=True
        )


def read_idx(data: bytes, where: str) -> MegatronIndex:
    """Parse and check a .idx (see the module docstring); MegatronFormatError names the fault."""
    if len(data) < HEAD.size or data[:9] != MAGIC:
        raise MegatronFormatError(
            f"{where} is not a megatron .idx (no MMIDIDX magic in its first 9 bytes); "
            "pass the PREFIX.bin/.idx pair preprocess_data.py wrote"
        )
    _, version, code, n_seq, n_doc = HEAD.unpack_from(data)
    if version != 1:
        raise MegatronFormatError(f"{where}: .idx version {version}; fcp reads version 1")
    if code in FLOAT_CODES or code not in DTYPES:
        what = FLOAT_CODES.get(code, f"unknown code {code}")
        raise MegatronFormatError(f"{where}: dtype {what}; token ids must be an integer dtype")
    dtype = np.dtype(DTYPES[code]).newbyteorder("<")
    need = HEAD.size + 12 * n_seq + 8 * n_doc
    if len(data) == need + n_seq and n_seq:
        raise MegatronFormatError(
            f"{where} is a multimodal megatron dataset (sequence modes); fcp reads text ones"
        )
    if len(data) != need:
        raise MegatronFormatError(
            f"{where} is {len(data)} bytes but its header ({n_seq} sequences, {n_doc} document "
            f"indices) needs {need}: the .idx is cut or damaged; re-run preprocess_data"
        )
    at = HEAD.size
    lengths = np.frombuffer(data, "<i4", n_seq, at).astype(np.int64)
    pointers = np.frombuffer(data, "<i8", n_seq, at + 4 * n_seq)
    docs = np.frombuffer(data, "<i8", n_doc, at + 12 * n_seq)
    cum = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    item = dtype.itemsize
    if (lengths < 0).any() or not np.array_equal(pointers, cum[:-1] * item):
        raise MegatronFormatError(
            f"{where}: sequence pointers are not the running sum of the lengths x {item} bytes "
            "(sequences must lie back to back in the .bin, as preprocess_data writes them)"
        )
    if n_doc < 1 or docs[0] != 0 or docs[-1] != n_seq or (np.diff(docs) < 0).any():
        raise MegatronFormatError(
            f"{where}: document indices must rise from 0 to the sequence count {n_seq}"
        )
    return MegatronIndex(
        where=where,
        dtype=dtype,
        doc_tokens=cum[docs[1:]] - cum[docs[:-1]],
        doc_offset=cum[docs[:-1]] * item,
        bin_bytes=int(cum[-1]) * item,
    )


def read_idx_file(bin_url: str, *, timeout_s: float) -> MegatronIndex:
    """The .idx beside `bin_url` (a local path or a remote URL), parsed."""
    idx = megatron_idx(bin_url)
    if os.path.isfile(idx):
        with open(idx, "rb") as f:
            return read_idx(f.read(), idx)
    from ..byte_source import open_source

    try:
        src = open_source(idx, timeout_s=timeout_s)
    except OSError as exc:
        raise MegatronFormatError(f"cannot open {idx}, the .idx of {bin_url} ({exc})") from exc
    chunks = []
    try:
        while chunk := src.read(1 << 20):
            chunks.append(chunk)
    finally:
        src.close(drained=True)
    return read_idx(b"".join(chunks), idx)


def as_npy(raw: bytes, dtype: str) -> bytes:
    """A document's raw little-endian ids as `.npy` bytes (what the loader's text path loads)."""
    buf = io.BytesIO()
    np.save(buf, np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder("<")), allow_pickle=False)
    return buf.getvalue()


def iter_documents(
    bin_url: str,
    *,
    timeout_s: float,
    index: MegatronIndex | None = None,
    span: tuple[int, int] | None = None,
) -> Iterator[tuple[str, int, int, bytes | None]]:
    """(key "doc N", byte offset, tokens, raw ids or None) of every document of a .bin, N
    counted from 1 (document N is megatron's `IndexedDataset[N - 1]`); `span` (lo, hi): only
    documents lo..hi-1 (0-based) of a local .bin, a piece split across `fcp index --workers`.

    A local .bin is not read here (the index's checksums pread each document once); a remote
    one is streamed once, front to back, so its checksums need no request per document.
    """
    from ..remote import is_remote

    index = index or read_idx_file(bin_url, timeout_s=timeout_s)
    if is_remote(bin_url):
        from ..remote import RemoteStream, parse_fingerprint, remote_fingerprint

        index.check_bin(parse_fingerprint(remote_fingerprint(bin_url))[0], bin_url)
        stream = RemoteStream(bin_url, timeout_s=timeout_s)
        try:
            for d, off, n in index.spans():
                size = n * index.dtype.itemsize
                raw = stream.read(size)
                if len(raw) != size:
                    raise MegatronFormatError(
                        f"{bin_url} ended at byte {off + len(raw)} inside document {d}"
                    )
                yield f"doc {d + 1}", off, n, raw
        finally:
            stream.close(drained=True)
        return
    index.check_bin(os.path.getsize(bin_url), bin_url)
    lo, hi = span if span is not None else (0, len(index))
    for d, off, n in index.spans():
        if lo <= d < hi:
            yield f"doc {d + 1}", off, n, None


def megatron_idx(url: str) -> str:
    """The `.idx` beside megatron shard `url` (a `.bin`), query string kept."""
    base, sep, query = url.partition("?") if "://" in url else (url, "", "")
    return base[: -len(".bin")] + ".idx" + sep + query


def megatron_prefix(path: str) -> str:
    """`path` + ".bin" when `path` is a megatron prefix (as `--data-path corpus_text_document`
    names a dataset) with both PREFIX.bin and PREFIX.idx beside it, else ""."""
    if os.path.exists(path) or not path or path.endswith(("/", os.sep)):
        return ""
    bin_path, idx_path = path + ".bin", path + ".idx"
    return bin_path if os.path.isfile(bin_path) and os.path.isfile(idx_path) else ""


def _resolve_local(path: str) -> str:
    """The .bin of a local .bin or .idx; UnreadableSourceError when its pair is missing."""
    stem = path[: -len(".bin")] if path.lower().endswith(".bin") else path[: -len(".idx")]
    bin_path, idx_path = stem + ".bin", stem + ".idx"
    if not (os.path.isfile(bin_path) and os.path.isfile(idx_path)):
        from .detect import refuse

        missing = idx_path if os.path.isfile(bin_path) else bin_path
        raise refuse(path, f"a megatron indexed dataset needs {missing} beside it")
    return bin_path


def _check_remote(url: str) -> None:
    if not url.split("?", 1)[0].lower().endswith(".bin"):
        raise ConfigError(
            f"{url}: name a remote megatron dataset by its .bin URL (the .idx beside it is "
            "fetched with it)"
        )


def _records(url: str, config: Any, span: tuple[int, int] | None) -> Iterator[Any]:
    """A SampleRecord per document of a .bin, lengths from its .idx (no tokenizer); an empty
    document is a BadMember."""
    from ..scan import SampleRecord
    from ..shards import BadMember

    index = read_idx_file(url, timeout_s=config.stream_timeout_s)
    dtype, item = index.dtype.name, index.dtype.itemsize
    docs = iter_documents(url, timeout_s=config.stream_timeout_s, index=index, span=span)
    for key, off, n, raw in docs:
        if n == 0:
            yield BadMember(key, "empty document (0 tokens)")
            continue
        yield SampleRecord(
            key=key,
            url=url,
            modality=Modality.TEXT.value,
            text_tokens=n,
            vision_tokens=0,
            special_tokens=config.text_special_tokens,
            causal=True,
            members={"npy": (off, n * item)},
            payload=None if raw is None else {"npy": raw},
            dtype=dtype,
        )


def _split(url: str, size: int, n: int) -> list[SplitPiece]:
    """About `n` runs of whole documents of a local .bin, cut near equal byte shares."""
    idx = read_idx_file(url, timeout_s=60.0)
    offsets = np.append(idx.doc_offset, idx.bin_bytes)
    wanted = [size * k // n for k in range(n + 1)]
    docs = sorted({int(np.searchsorted(offsets, w)) for w in wanted} | {0, len(idx)})
    docs = [d for d in docs if d <= len(idx)]
    return [((a, b), int(offsets[a]), int(offsets[b])) for a, b in pairwise(docs)]


def _present(meta: dict[str, Any], members: dict[str, bytes], limit: int) -> dict[str, bytes]:
    """Raw ids as `.npy`, what the loader's pre-tokenized path reads."""
    return {ext: as_npy(data, str(meta.get("dtype", "int32"))) for ext, data in members.items()}


def _meta(url: str, timeout_s: float) -> dict[str, Any]:
    from ..shards import shard_fingerprint

    idx = read_idx_file(url, timeout_s=timeout_s)
    return {
        "dtype": idx.dtype.name,
        "idx_fingerprint": shard_fingerprint(megatron_idx(url)),
        "key_base": 1,  # "doc 1": counted from 1 (older indexes named documents from 0)
    }


def _stale(url: str, meta: dict[str, Any]) -> str:
    """Why the lengths of local shard `url` changed since indexing: its .idx differs."""
    from ..shards import shard_fingerprint

    idx = megatron_idx(url)
    if shard_fingerprint(idx) != meta.get("idx_fingerprint"):
        return f"{idx} (the lengths of shard {url}) changed"
    return ""


FORMATS = (
    CorpusFormat(
        name="megatron",
        title="megatron .bin/.idx pairs",
        suffixes=(".bin", ".idx"),
        byte_range=True,
        samples=_records,
        split=_split,
        present=_present,
        meta=_meta,
        stale=_stale,
        resolve_local=_resolve_local,
        prefix=megatron_prefix,
        check_remote=_check_remote,
        magic=lambda head: head[:9] == MAGIC,
        hint="a megatron .idx: name it PREFIX.idx beside PREFIX.bin",
    ),
)
