"""JSON Lines shards: one JSON object a line, a sample per non-blank line.

A sample's one member is its line: `{"json": (byte offset, length)}` without the newline, so
the loader reads it with one `pread` (a local file) or one HTTP range (http(s)://, s3://), and
the scanner's `.json` rules apply to it unchanged (`--text-field`, chat `messages`). Keys are
"line N" (1-based, as an editor shows it), so a skipped sample names its file and line.

`.jsonl.gz` (stdlib gzip) and `.jsonl.zst` (the optional `zstandard` package) are indexed by
offsets in the decompressed stream. Such offsets cannot be seeked, so the loader decompresses
the file once per host into the shard cache directory (`~/.cache/fcp/shards`, one file named
by the shard's fingerprint) and reads lines from that copy; the per-line crc32 of the index
verifies it. Compressed JSON Lines are local only: a remote one is refused at expansion.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from ...errors import ConfigError
from ..byte_source import open_source
from ..optional import require
from ..shards import BadMember, RawSample

__all__ = ["decompressed_copy", "iter_jsonl", "open_decompressed"]

CHUNK = 1 << 20  # bytes read at a time; a line may span any number of chunks
SMALL_CHUNK = 1 << 16  # decompressed bytes read at a time from .gz / .zst


def open_decompressed(path: str, fmt: str) -> IO[bytes]:
    """A binary reader of the decompressed bytes of a .jsonl.gz / .jsonl.zst file."""
    if fmt == "jsonl.gz":
        return gzip.open(path, "rb")
    zstd = require("zstandard", f"reading {path} (a zstd-compressed JSON Lines file)")
    raw = open(path, "rb")  # noqa: SIM115 - the stream reader owns it (closefd) and closes it
    return zstd.ZstdDecompressor().stream_reader(raw, closefd=True)


def _lines(read: Callable[[int], bytes]) -> Iterator[tuple[int, bytes]]:
    """(offset, line without its newline) of every line of a byte stream, in order."""
    buf = bytearray()
    base = 0  # stream offset of buf[0]
    while True:
        chunk = read(CHUNK)
        if not chunk:
            break
        seen = len(buf)
        buf += chunk
        start, nl = 0, buf.find(b"\n", seen)
        while nl >= 0:
            yield base + start, bytes(buf[start:nl])
            start = nl + 1
            nl = buf.find(b"\n", start)
        del buf[:start]
        base += start
    if buf:
        yield base, bytes(buf)


def iter_jsonl(
    url: str, fmt: str, *, timeout_s: float, max_bytes: int
) -> Iterator[RawSample | BadMember]:
    """Samples of one JSON Lines shard: member `json` per non-blank line (blank lines skip)."""
    if fmt == "jsonl":
        try:
            src = open_source(url, timeout_s=timeout_s, max_bytes=max_bytes)
        except OSError as exc:
            yield BadMember("(shard)", f"cannot open the shard ({exc})")
            return
        read, close = src.read, lambda: src.close(drained=True)
    else:
        try:
            stream = open_decompressed(url, fmt)
        except OSError as exc:
            yield BadMember("(shard)", f"cannot open the shard ({exc})")
            return
        # small reads: a cut or corrupt stream raises at the read that reaches the damage,
        # so the lines of every whole 64 KiB before it are still indexed
        read, close = (lambda _n: stream.read(SMALL_CHUNK)), stream.close
    try:
        for n, (off, line) in enumerate(_lines(read), start=1):
            if not line.strip():
                continue
            yield RawSample(
                key=f"line {n}", members={"json": (off, len(line))}, payload={"json": line}
            )
    except (OSError, EOFError) as exc:  # a cut .gz, a corrupt zstd frame: the rest is lost
        yield BadMember("(shard)", f"the file stops decoding ({type(exc).__name__}: {exc})")
    finally:
        status = close()
    if isinstance(status, str):
        yield BadMember("(shard)", status)


def decompressed_copy(url: str, fmt: str, fingerprint: str, directory: Path) -> str:
    """The local path of `url` decompressed (made once; a partial copy is never used).

    Written to `<name>.partial-<pid>` and renamed into place, so DataLoader workers that race
    produce one whole copy each and the last rename wins with identical bytes.
    """
    key = hashlib.sha256(f"{os.path.abspath(url)}\0{fingerprint}".encode()).hexdigest()[:24]
    path = Path(directory) / f"{key}.jsonl"
    if path.is_file():
        return str(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.partial-{os.getpid()}")
    try:
        with open_decompressed(url, fmt) as src, open(tmp, "wb") as dst:
            while True:
                try:
                    chunk = src.read(SMALL_CHUNK)
                except (OSError, EOFError):  # a cut or damaged stream: as far as the scan read
                    break  # (it indexed only whole lines before the damage; crc32s verify them)
                if not chunk:
                    break
                dst.write(chunk)
        os.replace(tmp, path)
    except (OSError, EOFError) as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise ConfigError(f"cannot decompress {url} into {directory} ({exc})") from exc
    return str(path)
