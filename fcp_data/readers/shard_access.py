"""How a LengthIndex reaches shards that are not local files: remote URLs and `pipe:` commands.

Remote shards (http(s)://, s3://) are read by byte range (`remote.RemoteReader`: one range per
sample, prefetched per micro-batch, staleness checked against the index's size/ETag); `pipe:`
shards are copied whole into a bounded local cache (`cache.ShardCache`) and then read like
local files. One `ShardAccess` lives in each process (it is rebuilt after unpickling).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import ConfigError
from .cache import ShardCache, default_cache_dir
from .remote import RemoteOptions, RemoteReader, is_remote

__all__ = ["ShardAccess"]


class ShardAccess:
    """Per-process readers for non-local shards of one index."""

    def __init__(self, index: Any, remote: RemoteOptions | None, cache: ShardCache | None) -> None:
        self.index = index
        expected = {
            url: entry.fingerprint
            for url, entry in zip(index.shard_urls, index.header.shards)
            if is_remote(url)
        }
        self.remote = RemoteReader(expected, remote)
        self.cache = cache or ShardCache(directory=default_cache_dir())

    def read(self, i: int, url: str, exts: Sequence[str] | None) -> dict[str, bytes] | str:
        """Members of remote sample i, or the local path of a pipe shard's cached copy."""
        if is_remote(url):
            return self.remote.read(url, self.index.members(i), exts)
        if url.startswith("pipe:"):  # a copy keyed on, and checked against, the index
            index, shard = self.index, int(self.index.shard[i])
            return str(
                self.cache.get(
                    url,
                    fingerprint=index.header.shards[shard].fingerprint,
                    timeout_s=index.header.scan.stream_timeout_s,
                    verify=lambda path: index.check_shard_copy(shard, path),
                )
            )
        raise ConfigError(
            f"sample {i} lives in {url!r}, a FIFO; random access needs a file: copy the "
            "shards locally and re-index, or stream them"
        )

    def prefetch(self, positions: Sequence[int]) -> None:
        """Fetch the remote samples among `positions` concurrently (read-ahead)."""
        ranges = []
        for i in positions:
            url = self.index.shard_url(int(i))
            if is_remote(url):
                start, end = RemoteReader.span(self.index.members(int(i)), None)
                ranges.append((url, start, end))
        if ranges:
            self.remote.prefetch(ranges)
