"""Reading remote shards: streamed once at index time, by byte range at load time.

* Index time: a shard is streamed once (`RemoteStream`, 1 MiB reads) and fingerprinted by its
  size and ETag, which the index header records.
* Load time: `RemoteReader.read` fetches only a sample's members, as one byte range spanning
  them (members of a sample are adjacent in a tar); `prefetch` fetches a micro-batch's ranges
  concurrently before they are read. The first read of each shard in a process compares its
  size/ETag with the index and raises `StaleIndexError` when the shard was replaced.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from ...errors import StaleIndexError
from ..byte_source import READ_CHUNK, ByteSource
from .access import (
    RemoteOptions,
    fingerprint_of,
    on_loop,
    parse_fingerprint,
    remote_filesystem,
    remote_fingerprint,
    with_retries,
)
from .ranges import range_fn, verified

__all__ = ["RemoteReader", "RemoteStream", "merge_ranges"]


class RemoteStream(ByteSource):
    """A ByteSource over a remote file read front to back (index time); not seekable.

    Read in verified 1 MiB range requests (`verified`: status, Content-Range, ETag against
    the HEAD's), each socket read bounded by the index's `stream_timeout_s`.
    """

    def __init__(self, url: str, *, timeout_s: float, options: RemoteOptions | None = None):
        super().__init__(url, fd=-1, timeout_s=timeout_s)
        base = options or RemoteOptions()
        self.options = RemoteOptions(
            retries=base.retries,
            backoff_s=base.backoff_s,
            merge_gap=base.merge_gap,
            stall_timeout_s=timeout_s,
            storage_options=base.storage_options,
        )
        fingerprint = remote_fingerprint(url, self.options)
        self._size = parse_fingerprint(fingerprint)[0]
        self._reader = RemoteReader({url: fingerprint}, self.options)

    def _fill(self, want: int) -> None:
        while len(self._buf) < want and not self._eof:
            at = self.pos + len(self._buf)
            if at >= self._size:
                self._eof = True
                break
            self._buf += self._reader.fetch(self.url, at, min(self._size, at + READ_CHUNK))

    def close(self, *, drained: bool) -> str | None:
        return None


def merge_ranges(ranges: Sequence[tuple[str, int, int]], gap: int) -> list[tuple[str, int, int]]:
    """(url, start, end) ranges with those of one URL less than `gap` bytes apart joined:
    neighbouring samples of a shard become one request (fsspec's parquet reader does the same).
    """
    out: list[tuple[str, int, int]] = []
    for url, a, b in sorted(ranges):
        if out and out[-1][0] == url and a - out[-1][2] <= gap:
            out[-1] = (url, out[-1][1], max(out[-1][2], b))
        else:
            out.append((url, a, b))
    return out


class RemoteReader:
    """Byte-range reads of members of remote shards, per process (see the module docstring).

    `expected[url]` is the shard's fingerprint from the index ("" skips the size/ETag checks;
    the range checks always apply).
    """

    def __init__(self, expected: dict[str, str], options: RemoteOptions | None = None) -> None:
        self.expected, self.options = expected, options or RemoteOptions()
        self._want = {u: parse_fingerprint(f) for u, f in expected.items()}
        self._checked: set[str] = set()
        self._ahead: OrderedDict[tuple[str, int, int], bytes] = OrderedDict()

    def _check(self, url: str) -> None:
        if url in self._checked:
            return
        want = self.expected.get(url, "")
        if want:
            have = remote_fingerprint(url, self.options)
            if have != want:
                raise StaleIndexError(
                    f"remote shard {url} changed since indexing ({have}, the index has "
                    f"{want}); rebuild the index with `fcp index`"
                )
        self._checked.add(url)

    def _check_many(self, urls: Sequence[str]) -> None:
        """`_check` every URL of `urls`, their HEADs in flight together: a batch's samples span
        many shards, and one HEAD at a time costs a round trip each per process (8 shards at
        50 ms: 0.4 s before the first sample). A HEAD that fails or disagrees here is asked
        again by `_check`, which retries it and raises the error naming the shard."""
        todo = [u for u in dict.fromkeys(urls) if u not in self._checked and self.expected.get(u)]
        if len(todo) > 1:
            stall = self.options.stall_timeout_s

            async def run(group: list[str]) -> list[Any]:
                async def one(u: str) -> Any:
                    fs = remote_filesystem(u, self.options)
                    return await asyncio.wait_for(fs._info(u), stall)

                return await asyncio.gather(*(one(u) for u in group), return_exceptions=True)

            by_scheme: dict[str, list[str]] = {}
            for u in todo:
                by_scheme.setdefault(u.partition("://")[0].lower(), []).append(u)
            for group in by_scheme.values():
                try:
                    infos = on_loop(remote_filesystem(group[0], self.options).loop, run, group)
                except Exception:  # the event loop itself: `_check` below asks one at a time
                    continue
                for u, info in zip(group, infos):
                    if isinstance(info, dict) and fingerprint_of(info) == self.expected[u]:
                        self._checked.add(u)
        for u in dict.fromkeys(urls):
            self._check(u)

    async def _one(self, url: str, a: int, b: int) -> bytes:
        size, etag = self._want.get(url, (0, ""))
        fs = remote_filesystem(url, self.options)
        ans = await range_fn(url)(fs, url, a, b, self.options.stall_timeout_s)
        return verified(url, a, b, ans, size, etag)

    def fetch(self, url: str, a: int, b: int) -> bytes:
        """Bytes a..b of `url`, verified, retried on transient faults (`with_retries`)."""
        fs = remote_filesystem(url, self.options)
        return with_retries(lambda: on_loop(fs.loop, self._one, url, a, b), url, self.options)

    def _fetch_many(self, spans: list[tuple[str, int, int]]) -> list[bytes | BaseException]:
        """Spans fetched concurrently (32 at a time), once each: a failure comes back as the
        exception, for `read` to retry and name."""

        async def run() -> list[bytes | BaseException]:
            gate = asyncio.Semaphore(32)

            async def one(url: str, a: int, b: int) -> bytes:
                async with gate:
                    return await self._one(url, a, b)

            return await asyncio.gather(*(one(*s) for s in spans), return_exceptions=True)

        fs = remote_filesystem(spans[0][0], self.options)
        return on_loop(fs.loop, run)

    @staticmethod
    def span(members: dict[str, tuple[int, int]], exts: Sequence[str] | None) -> tuple[int, int]:
        wanted = [(o, z) for e, (o, z) in members.items() if exts is None or e in exts]
        if not wanted:
            return 0, 0
        return min(o for o, _ in wanted), max(o + z for o, z in wanted)

    def prefetch(self, ranges: Sequence[tuple[str, int, int]]) -> None:
        """Fetch (url, start, end) ranges concurrently, best effort: a range that fails here
        is fetched again by `read`, which retries it and names the fault."""
        todo = [r for r in dict.fromkeys(ranges) if r not in self._ahead and r[2] > r[1]]
        if not todo:
            return
        self._check_many([u for u, _, _ in todo])
        spans = merge_ranges(todo, self.options.merge_gap)
        try:
            out = self._fetch_many(spans)
        except Exception:  # the event loop itself failed: `read` fetches and reports
            return
        got: dict[tuple[str, int, int], bytes] = {}
        for (url, a, b), data in zip(spans, out):
            if isinstance(data, BaseException):
                continue
            for key in todo:
                if key[0] == url and a <= key[1] and key[2] <= b:
                    got[key] = data[key[1] - a : key[2] - a]
        self._ahead.update(got)  # one step: a prefetch abandoned by the time limit may land late
        while len(self._ahead) > self.options.prefetch_ranges:
            self._ahead.popitem(last=False)

    def read(
        self, url: str, members: dict[str, tuple[int, int]], exts: Sequence[str] | None = None
    ) -> dict[str, bytes]:
        """The wanted members of one sample, from one verified range read (or a prefetched
        one, verified the same way when it was fetched)."""
        self._check(url)
        start, end = self.span(members, exts)
        data = self._ahead.pop((url, start, end), None)
        if data is None:
            data = self.fetch(url, start, end) if end > start else b""
        return {
            e: data[o - start : o - start + z]
            for e, (o, z) in members.items()
            if exts is None or e in exts
        }
