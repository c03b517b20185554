"""One range request and its verification: the bytes asked for, or an error saying why not.

Every range answer is verified against the request before a byte is used (`verified`): status
206 (a 200 is "server ignores Range requests", never sliced as if it were the range),
Content-Range start, end and total (the index's shard size), body length, and the answer's own
ETag against the index's, so an object overwritten mid-epoch is caught at the next read, not
only at the first read of the process. Range GETs go through fsspec's own pooled session
(aiohttp) or s3fs's client, so the answer's headers are visible; every socket read waits at
most `RemoteOptions.stall_timeout_s`.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Any

from ...errors import StaleIndexError
from ...optional import require
from .access import RangeAnswerError, ShortBody, strip_etag

__all__ = ["Answer", "range_fn", "verified"]

_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)")


class Answer:
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


async def _http_range(fs: Any, url: str, a: int, b: int, stall_s: float) -> Answer:
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
        etag = strip_etag(r.headers.get("ETag"))
        cr = r.headers.get("Content-Range")
        body = await r.read() if r.status == 206 else None
        return Answer(r.status, cr, etag, r.content_length, body)


async def _s3_range(fs: Any, url: str, a: int, b: int, stall_s: float) -> Answer:
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
    return Answer(
        status,
        resp.get("ContentRange"),
        strip_etag(resp.get("ETag")),
        resp.get("ContentLength"),
        body,
    )


async def _other_range(fs: Any, url: str, a: int, b: int, stall_s: float) -> Answer:
    """Schemes without a header-level path (gs://): fsspec's cat_file, length-checked only."""
    body = await asyncio.wait_for(fs._cat_file(url, start=a, end=b), stall_s * 10)
    return Answer(206, None, "", None, body, strict=False)


def range_fn(url: str) -> Callable[..., Any]:
    scheme = url.partition("://")[0].lower()
    return {"http": _http_range, "https": _http_range, "s3": _s3_range}.get(scheme, _other_range)


def verified(url: str, a: int, b: int, ans: Answer, size: int, etag: str) -> bytes:
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
        raise ShortBody(
            f"{url}: {asked} came back as {len(body)} bytes under Content-Range "
            f"{ans.content_range!r} (the connection was cut)"
        )
    return body
