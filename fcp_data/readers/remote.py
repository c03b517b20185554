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
* Faults: 5xx answers, resets, timeouts and bodies cut short are retried with exponential
  backoff (`RemoteOptions.retries`, `backoff_s`); 4xx and credential failures raise
  `RemoteAccessError` naming the URL at once, since retrying cannot fix them.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..errors import DataError, MissingDependencyError, StaleIndexError
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


@dataclass(kw_only=True, slots=True)
class RemoteOptions:
    """How remote shards are read; `storage_options` go to `fsspec.filesystem` (e.g. an S3
    `endpoint_url` under `client_kwargs`, `anon=True`). Defaults: 5 retries starting at 0.1 s
    (0.1 + 0.2 + ... + 1.6 = 3.1 s of backoff before giving up); up to 1,024 prefetched
    ranges held (a replica's samples of one global batch, read soon after); ranges of one shard
    less than 64 KiB apart are fetched as one request (the gap costs less than a round trip)."""

    retries: int = 5
    backoff_s: float = 0.1
    prefetch_ranges: int = 1024
    merge_gap: int = 1 << 16
    storage_options: dict[str, Any] = field(default_factory=dict)


def is_remote(url: str) -> bool:
    """True for URLs with a remote scheme (http, https, s3, gs)."""
    scheme, sep, _ = url.partition("://")
    return bool(sep) and scheme.lower() in PACKAGES


def remote_filesystem(url: str, options: RemoteOptions | None = None) -> Any:
    """The fsspec filesystem of `url`'s scheme (cached per process by fsspec: one session)."""
    scheme = url.partition("://")[0].lower()
    try:
        import fsspec

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


def with_retries(fn: Callable[[], T], url: str, options: RemoteOptions) -> T:
    """`fn()` retried on transient failures with exponential backoff; 4xx raise at once."""
    delay = options.backoff_s
    for attempt in range(options.retries + 1):
        try:
            return fn()
        except (MissingDependencyError, StaleIndexError, RemoteAccessError):
            raise
        except Exception as exc:  # aiohttp, botocore and OSError faults all land here
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
    info = with_retries(lambda: fs.info(url), url, opts)
    etag = str(info.get("ETag") or info.get("etag") or "").strip('"')
    return f"remote:size={int(info.get('size') or 0)}:etag={etag}"


class RemoteStream(ByteSource):
    """A ByteSource over a remote file read front to back (index time); not seekable."""

    def __init__(self, url: str, *, timeout_s: float, options: RemoteOptions | None = None):
        super().__init__(url, fd=-1, timeout_s=timeout_s)
        self.options = options or RemoteOptions()
        fs = remote_filesystem(url, self.options)
        self._remote = with_retries(
            lambda: fs.open(url, "rb", block_size=READ_CHUNK, cache_type="none"), url, self.options
        )

    def _fill(self, want: int) -> None:
        while len(self._buf) < want and not self._eof:
            at = self.pos + len(self._buf)

            def chunk(at: int = at) -> bytes:
                self._remote.seek(at)
                return self._remote.read(READ_CHUNK)

            data = with_retries(chunk, self.url, self.options)
            if data:
                self._buf += data
            else:
                self._eof = True

    def close(self, *, drained: bool) -> str | None:
        self._remote.close()
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

    `expected[url]` is the shard's fingerprint from the index ("" skips the check).
    """

    def __init__(self, expected: dict[str, str], options: RemoteOptions | None = None) -> None:
        self.expected, self.options = expected, options or RemoteOptions()
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

    @staticmethod
    def span(members: dict[str, tuple[int, int]], exts: Sequence[str] | None) -> tuple[int, int]:
        wanted = [(o, z) for e, (o, z) in members.items() if exts is None or e in exts]
        if not wanted:
            return 0, 0
        return min(o for o, _ in wanted), max(o + z for o, z in wanted)

    def prefetch(self, ranges: Sequence[tuple[str, int, int]]) -> None:
        """Fetch (url, start, end) ranges concurrently (one `cat_ranges` per filesystem)."""
        todo = [r for r in dict.fromkeys(ranges) if r not in self._ahead and r[2] > r[1]]
        if not todo:
            return
        for url in {u for u, _, _ in todo}:
            self._check(url)
        spans = merge_ranges(todo, self.options.merge_gap)
        for scheme in {u.partition("://")[0] for u, _, _ in spans}:
            mine = [r for r in spans if r[0].partition("://")[0] == scheme]
            fs = remote_filesystem(mine[0][0], self.options)
            paths, starts, ends = (list(x) for x in zip(*mine))
            out = with_retries(
                lambda fs=fs, p=paths, s=starts, e=ends: fs.cat_ranges(p, s, e, on_error="raise"),
                mine[0][0],
                self.options,
            )
            for (url, a, b), data in zip(mine, out):
                if len(data) != b - a:  # short: leave it to `read`, which names the shard
                    continue
                for key in todo:
                    if key[0] == url and a <= key[1] and key[2] <= b:
                        self._ahead[key] = data[key[1] - a : key[2] - a]
        while len(self._ahead) > self.options.prefetch_ranges:
            self._ahead.popitem(last=False)

    def read(
        self, url: str, members: dict[str, tuple[int, int]], exts: Sequence[str] | None = None
    ) -> dict[str, bytes]:
        """The wanted members of one sample, from one range read (or the prefetched one)."""
        self._check(url)
        start, end = self.span(members, exts)
        data = self._ahead.pop((url, start, end), None)
        if data is None and end > start:
            fs = remote_filesystem(url, self.options)
            data = with_retries(lambda: fs.cat_file(url, start=start, end=end), url, self.options)
        data = data or b""
        if len(data) != end - start:
            raise StaleIndexError(
                f"{url}: bytes {start}..{end} came back as {len(data)} bytes; the shard is "
                "shorter than the index says, rebuild it with `fcp index`"
            )
        return {
            e: data[o - start : o - start + z]
            for e, (o, z) in members.items()
            if exts is None or e in exts
        }
