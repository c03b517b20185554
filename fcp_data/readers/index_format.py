"""On-disk layout of a length index: a directory of .npy arrays plus a msgspec JSON header.

Arrays are loaded with `np.load(mmap_mode="r")`, so opening a 100M-sample index costs page
faults, not a parse. Per-sample arrays share the sample order; members (one row per tar member)
are addressed by `member_start[i] : member_start[i] + member_count[i]`.
"""

from __future__ import annotations

import hashlib
import tokenize
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from ..errors import IndexMismatchError, StaleIndexError
from .errors import SkippedFile, SkippedSample
from .scan import ScanConfig

__all__ = [
    "CHECKSUM_ARRAY",
    "FORMAT_VERSION",
    "HEADER_NAME",
    "MEMBER_ARRAYS",
    "NPY_ERRORS",
    "READ_FORMAT_VERSIONS",
    "SAMPLE_ARRAYS",
    "SOURCES_FORMAT_VERSION",
    "ChecksumMismatchError",
    "IndexHeader",
    "ShardEntry",
    "index_fingerprint",
    "load_arrays",
]

NPY_ERRORS = (ValueError, OSError, EOFError, SyntaxError, TypeError, tokenize.TokenError)
"""What `np.load` raises for bytes that are no .npy: numpy parses the header's dict with the
`tokenize` module, so a flipped byte there raised tokenize.TokenError, past every handler
that expected ValueError (found by the fuzzer: tests/fuzz/corpus/index_arrays)."""

FORMAT_VERSION = 1
# an index with a shard that is not a tar (JSON Lines, Parquet, Arrow, megatron .bin/.idx) is
# written as version 2: a reader that knows only tars (version 1) refuses it instead of taking
# row numbers for byte offsets; this fcp reads both
SOURCES_FORMAT_VERSION = 2
READ_FORMAT_VERSIONS = (FORMAT_VERSION, SOURCES_FORMAT_VERSION)
HEADER_NAME = "header.json"
# name -> dtype of the per-sample arrays (keys are stored as a fixed-width unicode array).
SAMPLE_ARRAYS: dict[str, str] = {
    "shard": "int32",
    "modality": "int8",
    "text_tokens": "int64",
    "vision_tokens": "int64",
    "special_tokens": "int64",
    "seqlens": "int64",
    "causal": "bool",
    "member_start": "int64",
    "member_count": "int32",
    "num_frames": "int32",
    "fps": "float64",
    "width": "int32",
    "height": "int32",
}
MEMBER_ARRAYS: dict[str, str] = {"member_offset": "int64", "member_size": "int64"}
# Optional member column: zlib.crc32 of each member's bytes, written since round 3 of the
# integrity work. An index without it still loads; its reads are then not verified (a warning
# says so once). 4 bytes a member: 40 MB for 10M samples of one member each.
CHECKSUM_ARRAY = "member_crc32"
CHECKSUM_DTYPE = "uint32"


class ChecksumMismatchError(StaleIndexError):
    """A member's bytes, read at load time, differ from the crc32 the index recorded."""


class ShardEntry(msgspec.Struct, frozen=True, kw_only=True):
    """`url` is relative to the index directory when the shard is a local file."""

    url: str
    fingerprint: str
    size: int
    num_samples: int
    # how the shard is read (a `sources.registry` format name); older indexes: tars
    format: str = "tar"
    meta: dict[str, Any] = {}  # megatron: the ids' dtype and the .idx fingerprint


class IndexHeader(msgspec.Struct, frozen=True, kw_only=True):
    """The header.json of an index; see the module docstring."""

    format_version: int
    num_samples: int
    scan: ScanConfig
    rule: dict[str, Any]  # the rule's settings(): name and every constant that changes a count
    tokenizer: str  # the counter's spec, e.g. "bytes:4" or "hf:sha256=..."
    shards: list[ShardEntry]
    skipped: list[SkippedSample]
    fcp_version: str = ""
    # the absolute path of the tokenizer file that counted (""; not part of its identity):
    # what a mismatch names beside the hashes
    tokenizer_file: str = ""
    # files inside data directories that are not data (a tokenizer.json, a README): skipped
    skipped_files: list[SkippedFile] = []


def index_fingerprint(header: IndexHeader) -> str:
    """What a token store binds to: blake2b (32 hex digits) of the sample count, tokenizer,
    rule and every shard's fingerprint and sample count. Two indexes whose per-sample lengths
    happen to agree but whose shards differ (other content, other ETags) get other values;
    the shard URLs are left out so an index moved with its shards keeps its value."""
    ident = [
        header.num_samples,
        header.tokenizer,
        dict(sorted(header.rule.items())),
        [[s.fingerprint, s.num_samples] for s in header.shards],
    ]
    return hashlib.blake2b(msgspec.json.encode(ident), digest_size=16).hexdigest()


def load_arrays(path: Path, header: IndexHeader, *, full: bool = True) -> dict[str, np.ndarray]:
    """Memory-map every array of index `path` and cross-check them against `header`.

    Always (cheap, no data read): each file exists and maps (a truncated file names itself
    instead of numpy's "mmap length is greater than file size"), has its dtype, is 1-D and has
    `header.num_samples` rows (members: as many as the samples' `member_count` sum to).
    With `full` (one vectorised pass, ~1 s per 10M samples): lengths are non-negative and
    `seqlens` is their sum, shard numbers exist, member ranges tile the member table, and every
    member lies inside its shard. Any failure raises IndexMismatchError naming the file to
    rebuild.
    """
    rebuild = f"rebuild the index with `fcp index` (or delete {path})"
    arrays: dict[str, np.ndarray] = {}
    for name in ("keys", "member_ext", *MEMBER_ARRAYS, *SAMPLE_ARRAYS):
        f = path / f"{name}.npy"
        try:
            a = np.load(f, mmap_mode="r", allow_pickle=False)
        except FileNotFoundError as exc:
            raise IndexMismatchError(f"{f} is missing from the index; {rebuild}") from exc
        except NPY_ERRORS as exc:  # truncated or not a .npy file
            raise IndexMismatchError(f"{f} is truncated or corrupt ({exc}); {rebuild}") from exc
        want = SAMPLE_ARRAYS.get(name) or MEMBER_ARRAYS.get(name)
        kind_ok = a.dtype == np.dtype(want) if want else a.dtype.kind == "U"
        if not kind_ok or a.ndim != 1:
            raise IndexMismatchError(
                f"{f} holds {a.dtype} of shape {a.shape}, expected a 1-D "
                f"{want or 'unicode'} array; {rebuild}"
            )
        arrays[name] = a
    crc_file = path / f"{CHECKSUM_ARRAY}.npy"
    if crc_file.is_file():  # optional: indexes built before it load without checks
        try:
            crc = np.load(crc_file, mmap_mode="r", allow_pickle=False)
        except NPY_ERRORS as exc:
            raise IndexMismatchError(
                f"{crc_file} is truncated or corrupt ({exc}); {rebuild}"
            ) from exc
        if crc.dtype != np.dtype(CHECKSUM_DTYPE) or crc.ndim != 1:
            raise IndexMismatchError(
                f"{crc_file} holds {crc.dtype} of shape {crc.shape}, expected a 1-D "
                f"{CHECKSUM_DTYPE} array; {rebuild}"
            )
        arrays[CHECKSUM_ARRAY] = crc
    n = header.num_samples
    for name in ("keys", *SAMPLE_ARRAYS):
        if arrays[name].shape[0] != n:
            raise IndexMismatchError(
                f"{path / (name + '.npy')} has {arrays[name].shape[0]} rows but the header "
                f"says {n} samples; {rebuild}"
            )
    count = arrays["member_count"]
    if not n:
        members = 0
    elif full:
        members = int(count.sum(dtype=np.int64))
    else:  # the last sample's range: right when the table is well formed, reads two values
        members = int(arrays["member_start"][-1]) + int(count[-1])
    per_member = ("member_ext", *MEMBER_ARRAYS, *(a for a in [CHECKSUM_ARRAY] if a in arrays))
    for name in per_member:
        if arrays[name].shape[0] != members:
            raise IndexMismatchError(
                f"{path / (name + '.npy')} has {arrays[name].shape[0]} rows but the samples "
                f"address {members} members; {rebuild}"
            )
    if full and n:
        _check_values(path, header, arrays, rebuild)
    return arrays


def _check_values(path: Path, header: IndexHeader, a: dict[str, np.ndarray], rebuild: str) -> None:
    def bad(name: str, what: str, rows: np.ndarray) -> None:
        if rows.size:
            i = int(rows[0])
            raise IndexMismatchError(
                f"{path / (name + '.npy')}: {rows.size} row(s) {what} (first: row {i}, key "
                f"{str(a['keys'][i]) if name in SAMPLE_ARRAYS else '-'}); {rebuild}"
            )

    for name in ("text_tokens", "vision_tokens", "special_tokens", "seqlens", "member_count"):
        bad(name, "are negative", np.flatnonzero(a[name] < 0))
    total = a["text_tokens"] + a["vision_tokens"] + a["special_tokens"]
    bad(
        "seqlens",
        "differ from text + vision + special tokens",
        np.flatnonzero(a["seqlens"] != total),
    )
    shard = a["shard"]
    bad(
        "shard",
        f"name no shard of the {len(header.shards)} listed",
        np.flatnonzero((shard < 0) | (shard >= len(header.shards))),
    )
    start, count = a["member_start"], a["member_count"].astype(np.int64)
    expect = np.concatenate([[0], np.cumsum(count)[:-1]])
    bad("member_start", "do not tile the member table", np.flatnonzero(start != expect))
    off, size = a["member_offset"], a["member_size"]
    bad("member_offset", "are negative", np.flatnonzero((off < 0) | (size < 0)))
    from .sources.registry import formats  # rows and decompressed offsets are not bytes

    ranged = {f.name for f in formats() if f.byte_range}
    shard_size = np.array(
        [s.size if s.format in ranged else 0 for s in header.shards], dtype=np.int64
    )
    limit = np.repeat(shard_size[shard], count)  # 0 = unknown (a pipe): not checked
    outside = np.flatnonzero((limit > 0) & (off + size > limit))
    if outside.size:
        owner = int(np.searchsorted(start, outside[0], side="right") - 1)
        raise IndexMismatchError(
            f"{path / 'member_offset.npy'}: {outside.size} member(s) end past their shard (first: "
            f"sample {str(a['keys'][owner])!r}, bytes {int(off[outside[0]])}+"
            f"{int(size[outside[0]])} of a {int(limit[outside[0]])}-byte shard); {rebuild}"
        )
