"""Sources other than WebDataset tars: JSON Lines, Parquet, HF `save_to_disk`, megatron.

Keys count from 1 in every format ("line 1", "row 1", "doc 1"), as an editor, `nl` and SQL's
row_number() do; indexes written before rows and documents did (their shard entries lack
`meta["key_base"]`) named them from 0 and read as they are.

* `.jsonl` / `.ndjson`: a sample per non-blank line ("line N"), member `json` (the line's
  bytes), read by pread; remote: yes (a line is a byte range).
* `.jsonl.gz` / `.jsonl.zst`: the same at offsets in the decompressed stream, read from a
  decompressed copy in the shard cache; remote: refused.
* `.parquet`: a sample per row ("row N") of the `--text-field` column, member `txt` (a string
  column) or `json` (a chat column), read by row group; remote: refused.
* a HF `save_to_disk` directory (its `data-*.arrow`): rows as Parquet, memory-mapped; remote:
  refused.
* megatron `PREFIX.bin` + `PREFIX.idx`: a sample per document ("doc N"), member `npy` (its ids,
  a byte range of the .bin), lengths from the .idx alone; remote: yes (one range a document).

Each format is detected by name (`detect.format_of`); the scanner turns its samples into the
same records as a tar's, so the length index, the loader, resume and blending treat them alike.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ...errors import ConfigError
from ..remote import is_remote
from .detect import (
    BYTE_RANGE_FORMATS,
    FORMATS,
    PAYLOAD_FORMATS,
    READABLE,
    UnreadableSourceError,
    expand_local,
    format_of,
    hf_data_files,
    megatron_idx,
    megatron_prefix,
)

__all__ = [
    "BYTE_RANGE_FORMATS",
    "FORMATS",
    "PAYLOAD_FORMATS",
    "READABLE",
    "UnreadableSourceError",
    "check_remote",
    "expand_local",
    "format_of",
    "hf_data_files",
    "iter_source_samples",
    "megatron_idx",
    "megatron_prefix",
    "present",
    "read_rows",
    "source_meta",
]


def check_remote(url: str) -> None:
    """ConfigError for a remote URL whose format has no byte-range access."""
    fmt = format_of(url)
    if is_remote(url) and fmt == "megatron" and not url.split("?", 1)[0].lower().endswith(".bin"):
        raise ConfigError(
            f"{url}: name a remote megatron dataset by its .bin URL (the .idx beside it is "
            "fetched with it)"
        )
    if is_remote(url) and fmt not in BYTE_RANGE_FORMATS:
        raise ConfigError(
            f"{url}: {fmt} shards are read locally only (a {fmt} sample is not a byte range "
            "fcp can fetch and verify); copy the files locally. Remote shards fcp reads: .tar, "
            ".jsonl and megatron .bin/.idx"
        )


def iter_source_samples(
    url: str, fmt: str, config: Any, span: tuple[int, int] | None = None
) -> Iterable[Any]:
    """RawSample / BadMember of a JSON Lines, Parquet or Arrow shard (a ScanConfig drives it);
    `span`: a piece of one file (byte range of a .jsonl, row groups of a .parquet). The
    iterable has `lines` (lines or rows seen) and `done_fraction()` (progress inside it)."""
    if fmt.startswith("jsonl"):
        from .jsonl import iter_jsonl

        return iter_jsonl(
            url,
            fmt,
            timeout_s=config.stream_timeout_s,
            max_bytes=config.stream_max_bytes,
            span=span,
        )
    if fmt in ("parquet", "arrow"):
        from .tables import iter_table

        return iter_table(url, fmt, config.text_field, span)
    raise ValueError(f"{url}: format {fmt!r} has no sample iterator")


def source_meta(url: str, fmt: str, *, timeout_s: float) -> dict[str, Any]:
    """What reading shard `url` back needs beyond its members (recorded in its ShardEntry)."""
    if fmt != "megatron":
        return {}
    from ..shards import shard_fingerprint
    from .megatron import read_idx_file

    idx = read_idx_file(url, timeout_s=timeout_s)
    return {"dtype": idx.dtype.name, "idx_fingerprint": shard_fingerprint(megatron_idx(url))}


def present(
    fmt: str, meta: dict[str, Any], out: dict[str, bytes], *, limit: int = 0
) -> dict[str, bytes]:
    """The members as the loader reads them (after their crc32 was checked on the raw bytes):
    megatron ids as .npy, gzipped text members (`.txt.gz`) gunzipped to their inner extension
    (at most `limit` bytes each; 0: the scan's default, 16 GiB)."""
    if fmt != "megatron":
        from ..members import GZ_INNER, gunzip_members

        if not any(e in GZ_INNER for e in out):
            return out
        from ..shards import STREAM_MAX_BYTES

        return gunzip_members(out, limit or STREAM_MAX_BYTES)
    from .megatron import as_npy

    return {ext: as_npy(data, str(meta.get("dtype", "int32"))) for ext, data in out.items()}


def read_rows(reader: Any, members: dict[str, tuple[int, int]], exts: Any) -> dict[str, bytes]:
    """Members of one row of a Parquet / Arrow shard through its `tables.TableRows`."""
    return {
        ext: reader.member(row)
        for ext, (row, _size) in members.items()
        if exts is None or ext in exts
    }
