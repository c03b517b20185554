"""Reaching a remote store: options, retries with backoff, and the size/ETag fingerprint.

Faults: 5xx answers, resets, timeouts and bodies cut short are retried with exponential
backoff (`RemoteOptions.retries`, `backoff_s`); 4xx and credential failures raise
`RemoteAccessError` naming the URL at once, since retrying cannot fix them. A read on a thread
its sample's time limit abandoned stops at once instead of retrying (`readers.abandon`).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ...errors import DataError, MissingDependencyError, StaleIndexError
from ...optional import require
from ..abandon import abandoned, on_abandon

__all__ = [
    "PACKAGES",
    "RangeAnswerError",
    "RemoteAccessError",
    "RemoteOptions",
    "ShortBody",
    "fingerprint_of",
    "is_remote",
    "on_loop",
    "parse_fingerprint",
    "remote_filesystem",
    "remote_fingerprint",
    "strip_etag",
    "with_retries",
]

PACKAGES = {"http": "aiohttp", "https": "aiohttp", "s3": "s3fs", "gs": "gcsfs", "gcs": "gcsfs"}
T = TypeVar("T")


class RemoteAccessError(DataError):
    """A remote shard answered with a client error (4xx) or refused the credentials."""


class RangeAnswerError(RemoteAccessError):
    """A range answer that is not the bytes asked for: a 200 (Range ignored), a Content-Range
    with another start or end, or none; never retried (the server does it every time)."""


class ShortBody(DataError):
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


def on_loop(loop: Any, fn: Callable[..., Any], *args: Any) -> Any:
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
    return fingerprint_of(with_retries(lambda: fs.info(url), url, opts))


def fingerprint_of(info: dict[str, Any]) -> str:
    """The fingerprint of a filesystem `info` answer (HEAD / HeadObject)."""
    etag = strip_etag(info.get("ETag") or info.get("etag"))
    return f"remote:size={int(info.get('size') or 0)}:etag={etag}"


def parse_fingerprint(fingerprint: str) -> tuple[int, str]:
    """(size, etag) of a "remote:size=N:etag=E" fingerprint; (0, "") when it is not one."""
    m = re.fullmatch(r"remote:size=(\d+):etag=(.*)", fingerprint or "")
    return (int(m.group(1)), m.group(2)) if m else (0, "")


def strip_etag(value: Any) -> str:
    """An ETag without quotes or the weak-validator prefix (HEAD and GET spell it alike)."""
    text = str(value or "").strip()
    return text[2:].strip('"') if text.startswith("W/") else text.strip('"')
