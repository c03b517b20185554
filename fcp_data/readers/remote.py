"""Remote shards: http(s):// and s3:// (gs:// with gcsfs) read through fsspec.

Why fsspec: one interface over HTTP (aiohttp: one pooled keep-alive session per process, so
range requests reuse connections), S3 (s3fs over aiobotocore: credentials, regions, custom
endpoints such as MinIO) and GCS, with concurrent range reads (`cat_ranges`) for read-ahead;
it is what pandas, dask and Hugging Face datasets use for the same job. Install the `remote`
extra (`pip install 'fcp[remote]'`: fsspec, aiohttp, s3fs).

* Index time: a shard is streamed once (`RemoteStream`, 1 MiB reads) and fingerprinted by its
  size and ETag, which the index header records.
* Load time: `RemoteReader.read` fetches only a sample's members, as one byte range spanning
  them (members of a sample are adjacent in a tar); `prefetch` fetches a micro-batch's ranges
  concurrently before they are read. The first read of each shard in a process compares its
  size/ETag with the index and raises `StaleIndexError` when the shard was replaced.
* Every range answer is verified against the request before a byte is used (`_verified`):
  status 206 (a 200 is "server ignores Range requests", never sliced as if it were the
  range), Content-Range start, end and total (the index's shard size), body length, and the
  answer's own ETag against the index's, so an object overwritten mid-epoch is caught at the
  next read, not only at the first read of the process. Range GETs go through fsspec's own
  pooled session (aiohttp) or s3fs's client, so the answer's headers are visible; every
  socket read waits at most `RemoteOptions.stall_timeout_s` (index time: stream_timeout_s).
* Faults: 5xx answers, resets, timeouts and bodies cut short are retried with exponential
  backoff (`RemoteOptions.retries`, `backoff_s`); 4xx and credential failures raise
  `RemoteAccessError` naming the URL at once, since retrying cannot fix them.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..errors import DataError, MissingDependencyError, StaleIndexError
from ..optional import require
from .abandon import abandoned, on_abandon
from .byte_source import READ_CHUNK, ByteSource

__all__ = [
    "RemoteAccessError",
    "RemoteOptions",
    "RemoteReader",
    "RemoteStream",
    "is_remote",
    "merge_ranges",
    "remote_filesystem",
    "remote_fingerprint",
]

PACKAGES = {"http": "aiohttp", "https": "aiohttp", "s3": "s3fs", "gs": "gcsfs", "gcs": "gcsfs"}
T = TypeVar("T")


class RemoteAccessError(DataError):
    """A remote shard answered with a client error (4xx) or refused the credentials."""


class RangeAnswerError(RemoteAccessError):
    """A range answer that is not the bytes asked for: a 200 (Range ignored), a Content-Range
    with another start or end, or none; never retried (the server does it every time)."""


class _ShortBody(DataError):
    """A range answer whose body is shorter than its Content-Range: a cut connection, retried."""


@dataclass(kw_only=True, slots=True)
class RemoteOptions:
    """How remote shards are read; `storage_options` go to `fsspec.filesystem` (e.g. an S3
    `endpoint_url` under `client_kwargs`, `anon=True`). Defaults: 5 retries starting at 0.1 s
    (0.1 + 0.2 + ... + 1.6 = 3.1 s of backoff before giving up); up to 1,024 prefetched
    ranges held (a replica's samples of one global batch, read soon after); ranges of one shard
    less than 64 KiB apart are fetched as one request (the gap costs less than a round trip); a
    connection or body that sends nothing for 60 s (`stall_timeout_s`, as the index's
    stream_timeout_s) fails that attempt, so no read waits unbounded: at most
    (retries + 1) x stall_timeout_s plus the backoff."""

    retries: int = 5
    backoff_s: float = 0.1
    prefetch_ranges: int = 1024
    merge_gap: int = 1 << 16
    stall_timeout_s: float = 60.0
    storage_options: dict[str, Any] = field(default_factory=dict)


def is_remote(url: str) -> bool:
    """True for URLs with a remote scheme (http, https, s3, gs)."""
    scheme, sep, _ = url.partition("://")
    return bool(sep) and scheme.lower() in PACKAGES


def remote_filesystem(url: str, options: RemoteOptions | None = None) -> Any:
    """The fsspec filesystem of `url`'s scheme (cached per process by fsspec: one session)."""
    scheme = url.partition("://")[0].lower()
    try:
        fsspec = require("fsspec", f"reading {scheme}:// shards ({url})")
        return fsspec.filesystem(scheme, **(options.storage_options if options else {}))
    except ImportError as exc:
        pkg = PACKAGES.get(scheme, "fsspec")
        raise MissingDependencyError(
            f"{url}: {scheme}:// shards need the {pkg} package ({exc}); install it with "
            f"`pip install {pkg}` or `pip install 'fcp[remote]'`"
        ) from exc


def _status(exc: BaseException | None) -> int | None:
    """The HTTP status behind an exception or its causes (fsspec's HTTP `info` turns a 403
    into FileNotFoundError raised from the aiohttp error)."""
    seen = 0
    while exc is not None and seen < 8:
        for name in ("status", "status_code"):
            v = getattr(exc, name, None)
            if isinstance(v, int):
                return v
        resp = getattr(exc, "response", None)
        meta = resp.get("ResponseMetadata", {}) if isinstance(resp, dict) else {}
        if isinstance(meta.get("HTTPStatusCode"), int):
            return int(meta["HTTPStatusCode"])
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


def _fatal(exc: BaseException, url: str) -> RemoteAccessError | None:
    """A RemoteAccessError when retrying cannot help (4xx, missing, denied), else None."""
    status = _status(exc)
    if status == 404 or (status is None and isinstance(exc, FileNotFoundError)):
        return RemoteAccessError(f"{url}: not found (HTTP 404); check the URL or rebuild the index")
    if isinstance(exc, PermissionError) or status in (401, 403):
        return RemoteAccessError(
            f"{url}: access denied ({status or type(exc).__name__}: {exc}); check the "
            "credentials (AWS_* variables, storage_options) and the bucket's permissions"
        )
    if status is not None and 400 <= status < 500 and status not in (408, 429):
        return RemoteAccessError(f"{url}: HTTP {status} ({exc}); the request is refused")
    return None


def _on_loop(loop: Any, fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)` awaited on fsspec's event loop from this thread (as fsspec's `sync`), but
    cancelled, which closes its connections, when the thread is abandoned by a sample's time
    limit (`readers.abandon`): a stalled request no longer outlives the sample that gave up."""
    future = asyncio.run_coroutine_threadsafe(fn(*args), loop)
    unhook = on_abandon(lambda _why: future.cancel())
    try:
        return future.result()
    finally:
        unhook()


def _given_up(url: str) -> DataError | None:
    """The error for a read on a thread its caller abandoned (no retry, no new request)."""
    why = abandoned()
    if why is None:
        return None
    return DataError(f"{url}: the read was ended: {why}")


def with_retries(fn: Callable[[], T], url: str, options: RemoteOptions) -> T:
    """`fn()` retried on transient failures with exponential backoff; 4xx raise at once; a
    thread abandoned by its sample's time limit stops at once instead of retrying."""
    delay = options.backoff_s
    for attempt in range(options.retries + 1):
        if (stop := _given_up(url)) is not None:
            raise stop
        try:
            return fn()
        except (MissingDependencyError, StaleIndexError, RemoteAccessError):
            raise  # RangeAnswerError too: a server that ignores or misanswers ranges does it again
        except Exception as exc:  # aiohttp, botocore and OSError faults all land here
            if (stop := _given_up(url)) is not None:
                raise stop from exc
            fatal = _fatal(exc, url)
            if fatal is not None:
                raise fatal from exc
            if attempt == options.retries:
                raise DataError(
                    f"{url}: still failing after {options.retries} retries "
                    f"({type(exc).__name__}: {exc}); check the server or raise "
                    "RemoteOptions.retries"
                ) from exc
            time.sleep(delay)
            delay *= 2
    raise AssertionError("unreachable")


def remote_fingerprint(url: str, options: RemoteOptions | None = None) -> str:
    """ "remote:size=N:etag=E" from one HEAD (or S3 HeadObject); E is "" when not served."""
    opts = options or RemoteOptions()
    fs = remote_filesystem(url, opts)
    return _fingerprint(with_retries(lambda: fs.info(url), url, opts))


def _fingerprint(info: dict[str, Any]) -> str:
    """The fingerprint of a filesystem `info` answer (HEAD / HeadObject)."""
    etag = _etag(info.get("ETag") or info.get("etag"))
    return f"remote:size={int(info.get('size') or 0)}:etag={etag}"


def parse_fingerprint(fingerprint: str) -> tuple[int, str]:
    """(size, etag) of a "remote:size=N:etag=E" fingerprint; (0, "") when it is not one."""
    m = re.fullmatch(r"remote:size=(\d+):etag=(.*)", fingerprint or "")
    return (int(m.group(1)), m.group(2)) if m else (0, "")


def _etag(value: Any) -> str:
    """An ETag without quotes or the weak-validator prefix (HEAD and GET spell it alike)."""
    text = str(value or "").strip()
    return text[2:].strip('"') if text.startswith("W/") else text.strip('"')


_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)")


class _Answer:
    """One range answer: status, Content-Range, ETag, Content-Length and (206 only) body."""

    __slots__ = ("body", "content_range", "etag", "length", "status", "strict")

    def __init__(
        self,
        status: int,
        content_range: str | None,
        etag: str,
        length: int | None,
        body: bytes | None,
        *,
        strict: bool = True,
    ) -> None:
        self.status, self.content_range, self.etag = status, content_range, etag
        self.length, self.body, self.strict = length, body, strict


async def _http_range(fs: Any, url: str, a: int, b: int, stall_s: float) -> _Answer:
    """One GET with Range on fsspec's pooled aiohttp session; the body is not read unless the
    answer is a 206 (a server ignoring Range would send the whole shard)."""
    aiohttp = require("aiohttp", "range requests over http(s)")

    kw = {k: v for k, v in fs.kwargs.items() if k != "timeout"}
    headers = dict(kw.pop("headers", None) or {})
    headers["Range"] = f"bytes={a}-{b - 1}"
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=stall_s, sock_read=stall_s)
    session = await fs.set_session()
    async with session.get(fs.encode_url(url), headers=headers, timeout=timeout, **kw) as r:
        if r.status >= 400:
            r.raise_for_status()  # ClientResponseError(status=...): 4xx fatal, 5xx retried
        etag = _etag(r.headers.get("ETag"))
        cr = r.headers.get("Content-Range")
        body = await r.read() if r.status == 206 else None
        return _Answer(r.status, cr, etag, r.content_length, body)


async def _s3_range(fs: Any, url: str, a: int, b: int, stall_s: float) -> _Answer:
    """One GetObject with Range through s3fs's client; the body is read 1 MiB at a time, each
    read bounded by `stall_s` (aiobotocore's own read timeout is per socket read too)."""
    bucket, key, version = fs.split_path(url)
    extra = {"VersionId": version} if version else {}
    resp = await asyncio.wait_for(
        fs._call_s3("get_object", Bucket=bucket, Key=key, Range=f"bytes={a}-{b - 1}", **extra),
        stall_s,
    )
    status = int(resp.get("ResponseMetadata", {}).get("HTTPStatusCode") or 206)
    stream = resp["Body"]
    chunks: list[bytes] = []
    try:
        while status == 206 and (chunk := await asyncio.wait_for(stream.read(1 << 20), stall_s)):
            chunks.append(chunk)
    finally:
        stream.close()
    body = b"".join(chunks) if status == 206 else None
    return _Answer(
        status, resp.get("ContentRange"), _etag(resp.get("ETag")), resp.get("ContentLength"), body
    )


async def _other_range(fs: Any, url: str, a: int, b: int, stall_s: float) -> _Answer:
    """Schemes without a header-level path (gs://): fsspec's cat_file, length-checked only."""
    body = await asyncio.wait_for(fs._cat_file(url, start=a, end=b), stall_s * 10)
    return _Answer(206, None, "", None, body, strict=False)


def _range_fn(url: str) -> Callable[..., Any]:
    scheme = url.partition("://")[0].lower()
    return {"http": _http_range, "https": _http_range, "s3": _s3_range}.get(scheme, _other_range)


def _verified(url: str, a: int, b: int, ans: _Answer, size: int, etag: str) -> bytes:
    """The body of a range answer once it is known to be bytes a..b of the indexed shard."""
    asked = f"bytes {a}..{b} (Range: bytes={a}-{b - 1})"
    if ans.status == 200:
        raise RangeAnswerError(
            f"{url}: the server ignores Range requests: asked for {asked}, it answered 200 "
            f"with the whole body ({ans.length if ans.length is not None else '?'} bytes) "
            "instead of 206 and those bytes; serve the shards from a server that honours "
            "Range (HTTP 206), or copy them locally and index the copies"
        )
    if ans.status != 206:
        raise RangeAnswerError(f"{url}: asked for {asked}, the server answered HTTP {ans.status}")
    if ans.strict:
        m = _CONTENT_RANGE.fullmatch((ans.content_range or "").strip())
        if m is None:
            raise RangeAnswerError(
                f"{url}: asked for {asked}, the 206 answer has Content-Range "
                f"{ans.content_range!r}, not 'bytes {a}-{b - 1}/TOTAL': which bytes it holds "
                "is unknown, so none is used; fix the server or the proxy in front of it"
            )
        start, end, total = int(m.group(1)), int(m.group(2)), m.group(3)
        if size > 0 and total != "*" and int(total) != size:
            raise StaleIndexError(
                f"remote shard {url} changed since indexing: a range answer says it holds "
                f"{total} bytes (Content-Range {ans.content_range!r}), the index has {size}; "
                "rebuild the index with `fcp index`"
            )
        if (start, end) != (a, b - 1):
            raise RangeAnswerError(
                f"{url}: asked for {asked}, the server answered Content-Range "
                f"{ans.content_range!r}: other bytes than asked for (they would load shifted "
                "samples), so none is used; fix the server or the proxy in front of it"
            )
    if etag and ans.etag and ans.etag != etag:
        raise StaleIndexError(
            f"remote shard {url} changed since indexing: a range answer has ETag "
            f"{ans.etag!r}, the index has {etag!r} (overwritten after this process first "
            "checked it); rebuild the index with `fcp index`"
        )
    body = ans.body or b""
    if len(body) != b - a:
        raise _ShortBody(
            f"{url}: {asked} came back as {len(body)} bytes under Content-Range "
            f"{ans.content_range!r} (the connection was cut)"
        )
    return body


class RemoteStream(ByteSource):
    """A ByteSource over a remote file read front to back (index time); not seekable.

    Read in verified 1 MiB range requests (`_verified`: status, Content-Range, ETag against
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
                    infos = _on_loop(remote_filesystem(group[0], self.options).loop, run, group)
                except Exception:  # the event loop itself: `_check` below asks one at a time
                    continue
                for u, info in zip(group, infos):
                    if isinstance(info, dict) and _fingerprint(info) == self.expected[u]:
                        self._checked.add(u)
        for u in dict.fromkeys(urls):
            self._check(u)

    async def _one(self, url: str, a: int, b: int) -> bytes:
        size, etag = self._want.get(url, (0, ""))
        fs = remote_filesystem(url, self.options)
        ans = await _range_fn(url)(fs, url, a, b, self.options.stall_timeout_s)
        return _verified(url, a, b, ans, size, etag)

    def fetch(self, url: str, a: int, b: int) -> bytes:
        """Bytes a..b of `url`, verified, retried on transient faults (`with_retries`)."""
        fs = remote_filesystem(url, self.options)
        return with_retries(lambda: _on_loop(fs.loop, self._one, url, a, b), url, self.options)

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
        return _on_loop(fs.loop, run)

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
