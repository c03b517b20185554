"""Gzipped members (`.txt.gz`, `.json.gz`, `.npy.gz`): read as webdataset's decoder reads them.

webdataset's `gzfilter` gunzips any member whose extension ends in `.gz` and hands the inner
extension on, so shards written for it may hold `s01.txt.gz`. fcp indexed such samples as
"no text" before. Now the scanner and every read path see the inner member (`txt`, `json`,
`npy`) with its bytes gunzipped, while the index keeps the member as stored (`txt.gz`, its
offset, size and crc32 of the compressed bytes, so reads are verified as before).

A member may gunzip to at most `limit` bytes (`ScanConfig.stream_max_bytes`, 16 GiB by
default; the index's own setting at load time): a 1 KB member that expands to 16 GB is one bad
sample naming the limit, not a process that runs out of memory.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping

from ..errors import MemberError

__all__ = ["GZ_INNER", "effective_exts", "gunzip_members"]

GZ_INNER = {"txt.gz": "txt", "json.gz": "json", "npy.gz": "npy"}
"""Stored extension -> the extension the scanner and the encoder see."""

_STEP = 1 << 20  # bytes of output per decompression step


def effective_exts(exts: Iterable[str]) -> list[str]:
    """The extensions of a sample as the readers see them (`txt.gz` -> `txt`)."""
    return [GZ_INNER.get(e, e) for e in exts]


def _gunzip(data: bytes, ext: str, limit: int) -> bytes:
    """`data` gunzipped (concatenated members too), at most `limit` bytes; ValueError else."""
    out = bytearray()
    pending = data
    while pending:
        obj = zlib.decompressobj(31)
        try:
            while True:
                out += obj.decompress(pending, _STEP)
                pending = obj.unconsumed_tail
                if len(out) > limit:
                    raise MemberError(
                        f"member .{ext} gunzips to more than {limit} bytes, the limit "
                        "(stream_max_bytes, `fcp index --stream-max-bytes`); re-create the "
                        "sample or raise the limit"
                    )
                if obj.eof or not pending:
                    break
        except zlib.error as exc:
            raise MemberError(f"member .{ext} does not gunzip ({exc}); re-create it") from exc
        if not obj.eof:
            raise MemberError(f"member .{ext} is cut: its gzip stream has no end; re-create it")
        pending = obj.unused_data
        if not pending.strip(b"\0"):
            break
    return bytes(out)


def gunzip_members(members: Mapping[str, bytes], limit: int) -> dict[str, bytes]:
    """`members` with each `X.gz` of GZ_INNER replaced by `X` gunzipped; the others as they
    are. ValueError (one bad sample) for a member that does not gunzip, is past `limit`, or
    whose inner extension the sample also holds plainly (two texts: which one counts?)."""
    if not any(e in GZ_INNER for e in members):
        return dict(members)
    out = {e: v for e, v in members.items() if e not in GZ_INNER}
    for ext, data in members.items():
        inner = GZ_INNER.get(ext)
        if inner is None:
            continue
        if inner in out:
            raise MemberError(
                f"the sample holds both .{inner} and .{ext}; keep one of them in the shard"
            )
        out[inner] = _gunzip(data, ext, limit)
    return out
