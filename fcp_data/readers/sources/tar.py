"""WebDataset tars: a sample per run of members sharing a key, members read by byte range.

The first format of the registry: it also reads names no other format claims and `pipe:`
streams (a local file without a known suffix is checked for a tar header at expansion,
`detect`). Member offsets are byte offsets in the tar, so one `pread` or one HTTP range reads a
member; a compressed tar has no such offsets and is refused at expansion, by name or by its
magic bytes, before any work.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from ..errors import CompressedShardError
from .format import CorpusFormat, Span
from .tar_blocks import compression_of

__all__ = ["COMPRESSED_NAMES", "FORMATS", "refuse_compressed"]

COMPRESSED_NAMES = (
    (".tar.gz", "gzip"),
    (".tgz", "gzip"),
    (".tar.bz2", "bzip2"),
    (".tbz2", "bzip2"),
    (".tar.xz", "xz"),
    (".txz", "xz"),
    (".tar.zst", "zstd"),
)


def refuse_compressed(path: str) -> None:
    """CompressedShardError for a compressed tar, by name or by its first bytes."""
    name = path.lower()
    fmt = next((f for ends, f in COMPRESSED_NAMES if name.endswith(ends)), None)
    if fmt is None and os.path.isfile(path):
        with open(path, "rb") as f:
            fmt = compression_of(f.read(8))
    if fmt is not None:
        raise CompressedShardError(path, fmt)


def _magic(head: bytes) -> bool:
    """A tar header (`ustar` at byte 257), or a compressed stream (refused at expansion)."""
    return (len(head) >= 262 and head[257:262] == b"ustar") or compression_of(head[:8]) is not None


def _samples(url: str, config: Any, span: Span | None) -> Iterable[Any]:
    """RawSample / BadMember in tar order (a tar is never split: `span` is always None)."""
    from ..scan import loads_while_scanning
    from ..shards import iter_raw_samples

    return iter_raw_samples(
        url,
        loads_while_scanning,
        timeout_s=config.stream_timeout_s,
        max_bytes=config.stream_max_bytes,
    )


FORMATS = (
    CorpusFormat(
        name="tar",
        title="WebDataset .tar",
        suffixes=(".tar",),
        byte_range=True,
        samples=_samples,
        check_local=refuse_compressed,
        magic=_magic,
        index_version=1,
    ),
)
