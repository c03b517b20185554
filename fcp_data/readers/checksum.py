"""Per-member checksums: written at index build, verified whenever a member's bytes are read.

A shard's fingerprint (size plus three 1 MiB blocks, or a remote size/ETag) misses a byte
changed in place in the middle of a 64 MiB shard, a server without ETags, an object
overwritten after the process checked it, a proxy that answers other bytes, or a stale local
copy of a `pipe:` shard. A crc32 of every member's bytes (`zlib.crc32`: ~1 GB/s, 4 bytes a
member) catches all of them at the read that would have used the wrong bytes, local or remote.

Index time: text and image members are hashed from the bytes the scanner already read (pipe
streams keep every member); members it skipped (videos in local or remote shards) are read
once more: `pread` for local shards, one verified range request each for remote ones.
"""

from __future__ import annotations

import hashlib
import os
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import DataError

__all__ = ["MemberHasher", "crc32", "pipe_fingerprint"]


def crc32(data: bytes) -> int:
    """zlib.crc32 of `data` as an unsigned 32-bit int (what the index stores)."""
    return zlib.crc32(data) & 0xFFFFFFFF


class MemberHasher:
    """crc32 of every member of the records of one shard, in the index's member order."""

    def __init__(self, url: str, *, timeout_s: float) -> None:
        self.url, self.timeout_s = url, timeout_s
        self._fd = -1
        self._remote: Any = None

    def record(self, rec: Any) -> list[int]:
        """One crc per member of `rec` (a SampleRecord), in `rec.members` order."""
        payload = rec.payload or {}
        return [
            crc32(payload[ext]) if ext in payload else crc32(self._read(ext, off, size, rec.key))
            for ext, (off, size) in rec.members.items()
        ]

    def _read(self, ext: str, off: int, size: int, key: str) -> bytes:
        from .remote import RemoteOptions, RemoteReader, is_remote

        if is_remote(self.url):
            if self._remote is None:
                opts = RemoteOptions(stall_timeout_s=self.timeout_s)
                self._remote = RemoteReader({}, opts)
            return self._remote.read(self.url, {ext: (off, size)})[ext]
        if self._fd < 0:
            self._fd = os.open(self.url, os.O_RDONLY)
        data = os.pread(self._fd, size, off)
        if len(data) != size:
            raise DataError(
                f"{self.url}: member {key}.{ext} ends past the shard while indexing (read "
                f"{len(data)} of {size} bytes at {off}); the shard changed during the scan"
            )
        return data

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def pipe_fingerprint(members: Sequence[tuple[int, int]], crcs: np.ndarray) -> str:
    """ "pipe:end=E:members=N:blake2b=H" of a `pipe:` shard: where its last member ends and a
    digest of every member's (offset, size, crc32), as indexed. The command's output cannot be
    re-read cheaply, so this is what its cached copy is checked against (`ShardCache`) and
    what a token store binds to; a pipe shard used to get "" and no change was ever seen."""
    arr = np.asarray(members, dtype="<i8").reshape(-1, 2)
    h = hashlib.blake2b(arr.tobytes(), digest_size=16)
    h.update(np.asarray(crcs, dtype="<u4").tobytes())
    end = int((arr[:, 0] + arr[:, 1]).max()) if arr.size else 0
    return f"pipe:end={end}:members={arr.shape[0]}:blake2b={h.hexdigest()}"
