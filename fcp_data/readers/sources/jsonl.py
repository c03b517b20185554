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

Limits (`ScanConfig.stream_max_bytes`, `fcp index --stream-max-bytes`) apply to what comes out
of the decompressor, never to the file's own size: a compressed file may decompress to at most
that many bytes (the lines before the limit are kept, the rest is one counted `(shard)` loss),
and a line longer than it is one counted skip that is stepped over without being held (a
1.5 GB `.jsonl.gz` without a newline grew past 900 MB before). The load-time copy stops at the
end of the last indexed line.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import zlib
from collections.abc import Callable, Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

from ...errors import ConfigError
from ...optional import require
from ..byte_source import open_source
from ..shards import BadMember, RawSample
from .format import CorpusFormat, Span, SplitPiece

__all__ = [
    "FORMATS",
    "CompressedCutError",
    "Decompressed",
    "DecompressedTooLong",
    "JsonlLines",
    "decompressed_copy",
    "iter_jsonl",
    "open_decompressed",
]

CHUNK = 1 << 20  # bytes read at a time; a line may span any number of chunks
RAW_CHUNK = 1 << 12  # compressed bytes fed at a time: 4 KiB of zstd holds at most ~128 MiB
# (a run of one byte compresses 32768:1), so one step never holds more than that
OUT_CHUNK = 1 << 16  # gzip output per step (zlib's max_length; zstd has no such bound)


class CompressedCutError(EOFError):
    """A compressed file that ends inside a gzip member or a zstd frame: it was cut."""


class DecompressedTooLong(OSError):
    """A compressed file that decompresses to more than its byte limit."""


class Decompressed:
    """The decompressed bytes of a .gz / .zst file, piece by piece, never past `max_bytes`.

    Why not `gzip.open` / zstandard's `stream_reader`: the zstd reader ends a file cut inside a
    frame as if it were complete (a `.jsonl.zst` cut in half gave 1,548 of 4,000 lines and no
    record of the cut), and neither bounds what a small file decompresses to. Here every gzip
    member and zstd frame must reach its end marker or the file is reported cut
    (`CompressedCutError`); concatenated members and frames (pigz, pzstd) are read through; and
    `read` raises `DecompressedTooLong` once more than `max_bytes` (0: no limit) came out.
    Damaged data raises OSError naming the decoder's error.
    """

    def __init__(self, path: str, fmt: str, max_bytes: int = 0) -> None:
        self.path, self.max_bytes = path, max_bytes
        self._zstd: Any = None
        if fmt == "jsonl.zst":
            self._zstd = require("zstandard", f"reading {path} (a zstd-compressed JSON Lines file)")
        self._raw = open(path, "rb")  # noqa: SIM115 - closed by close()
        self._obj: Any = None
        self._pending = b""
        self.produced = 0  # decompressed bytes returned so far

    def _decompress(self, data: bytes) -> bytes:
        if self._obj is None:
            z = self._zstd
            self._obj = z.ZstdDecompressor().decompressobj() if z else zlib.decompressobj(31)
        errors = (zlib.error,) if self._zstd is None else (self._zstd.ZstdError,)
        try:
            if self._zstd is None:
                out = self._obj.decompress(data, OUT_CHUNK)
                self._pending = self._obj.unconsumed_tail
            else:
                out = self._obj.decompress(data)
        except errors as exc:
            raise OSError(f"the data does not decompress ({type(exc).__name__}: {exc})") from exc
        if self._obj.eof:  # this member / frame is whole: what follows starts the next one
            self._pending = self._obj.unused_data + self._pending
            self._obj = None
        return out

    def raw_position(self) -> int:
        """Compressed bytes read from the file so far (progress inside a compressed file)."""
        try:
            return self._raw.tell() - len(self._pending)
        except (OSError, ValueError):  # closed
            return 0

    def read(self, _n: int = 0) -> bytes:
        """The next piece of decompressed bytes; b"" at a clean end of the file."""
        while True:
            data = self._pending or self._raw.read(RAW_CHUNK)
            self._pending = b""
            if not data:
                if self._obj is not None:
                    what = "frame" if self._zstd is not None else "member"
                    raise CompressedCutError(
                        f"the file ends inside a compressed {what} after {self.produced} "
                        "decompressed bytes: it is cut; re-create or re-copy it"
                    )
                return b""
            if self._obj is None and not data.strip(b"\0"):
                continue  # zero padding after the last member (tape-style writers)
            out = self._decompress(data)
            self.produced += len(out)
            if self.max_bytes and self.produced > self.max_bytes:
                raise DecompressedTooLong(
                    f"it decompresses to more than {self.max_bytes} bytes, the limit "
                    "(stream_max_bytes, `fcp index --stream-max-bytes`); the lines before it "
                    "are kept: split the file or raise the limit"
                )
            if out:
                return out

    def close(self) -> None:
        self._raw.close()

    def __enter__(self) -> Decompressed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_decompressed(path: str, fmt: str, max_bytes: int = 0) -> Decompressed:
    """A reader of the decompressed bytes of a .jsonl.gz / .jsonl.zst file (`Decompressed`)."""
    return Decompressed(path, fmt, max_bytes)


def _lines(read: Callable[[int], bytes], max_line: int) -> Iterator[tuple[int, bytes | int]]:
    """(offset, line without its newline) of every line of a byte stream, in order; a line
    longer than `max_line` bytes comes as (offset, its length) and is never held whole."""
    buf = bytearray()
    base = 0  # stream offset of buf[0]
    long_at = -1  # offset of the line being stepped over, -1 when none
    while True:
        chunk = read(CHUNK)
        if not chunk:
            break
        seen = len(buf)
        buf += chunk
        start, nl = 0, buf.find(b"\n", seen)
        while nl >= 0:
            if long_at >= 0:
                yield long_at, base + nl - long_at
                long_at = -1
            else:
                yield base + start, bytes(buf[start:nl])
            start = nl + 1
            nl = buf.find(b"\n", start)
        del buf[:start]
        base += start
        if len(buf) > max_line:  # no newline within the limit: step over, keep nothing
            long_at = base if long_at < 0 else long_at
            base += len(buf)
            buf.clear()
    if long_at >= 0:
        yield long_at, base + len(buf) - long_at
    elif buf:
        yield base, bytes(buf)


class JsonlLines:
    """The samples of one JSON Lines shard, or of the lines starting in bytes [lo, hi) of a
    plain local one (a piece of a file split across `fcp index --workers`).

    Iterating yields RawSample / BadMember; afterwards `lines` is how many lines (blank ones
    included) the span held, so the builder can number the lines of later pieces, and
    `done_fraction()` says how much of the span has been read, for progress inside a file. A
    piece starts one byte early: the line that byte ends belongs to the piece before, so
    every line is read by exactly one piece whatever the cut points.
    """

    def __init__(
        self, url: str, fmt: str, *, timeout_s: float, max_bytes: int, span: tuple[int, int] | None
    ) -> None:
        self.url, self.fmt, self.timeout_s, self.max_bytes = url, fmt, timeout_s, max_bytes
        self.lo, self.hi = span if span is not None else (0, -1)
        if self.lo and fmt != "jsonl":
            raise ConfigError(f"{url}: only plain .jsonl files are read in byte ranges")
        self.lines = 0
        self._at = self.lo  # end of the last line read (plain) or compressed bytes consumed
        self._size = 0
        self._stream: Decompressed | None = None

    def done_fraction(self) -> float:
        """Share of the span read so far (compressed bytes for .gz / .zst), 0..1."""
        if self._stream is not None:
            tell = self._stream.raw_position()
            return min(1.0, tell / self._size) if self._size else 0.0
        end = self.hi if self.hi >= 0 else self._size
        width = end - self.lo
        return min(1.0, max(0.0, (self._at - self.lo) / width)) if width > 0 else 1.0

    def __iter__(self) -> Iterator[RawSample | BadMember]:
        url, fmt, max_bytes = self.url, self.fmt, self.max_bytes
        base = max(0, self.lo - 1)  # one byte early: is a line starting at lo?
        with contextlib.suppress(OSError):
            self._size = os.path.getsize(url) if os.path.isfile(url) else 0
        if fmt == "jsonl":
            try:
                src = open_source(url, timeout_s=self.timeout_s, max_bytes=max_bytes)
            except OSError as exc:
                yield BadMember("(shard)", f"cannot open the shard ({exc})")
                return
            if base:
                src.skip(base)
            read, close = src.read, lambda: src.close(drained=not self.lo and self.hi < 0)
        else:
            try:
                self._stream = open_decompressed(url, fmt, max_bytes)
            except OSError as exc:
                yield BadMember("(shard)", f"cannot open the shard ({exc})")
                return
            # small reads: a cut or corrupt stream raises at the read that reaches the damage,
            # so the lines of every whole piece before it are still indexed
            read, close = self._stream.read, self._stream.close
        mine = not self.lo  # lines before the first that starts at lo belong to the piece before
        try:
            for at, line in _lines(read, max_bytes or 1 << 62):
                off = base + at
                if not mine:
                    mine = True
                    continue  # the byte before lo ended this line (or it is cut by lo)
                if 0 <= self.hi <= off:
                    break  # the next piece's first line
                self.lines += 1
                n = self.lines
                self._at = off + (line if isinstance(line, int) else len(line)) + 1
                if isinstance(line, int):
                    yield BadMember(
                        f"line {n}",
                        f"the line is {line} bytes or longer, past the {max_bytes}-byte limit "
                        "of one line (stream_max_bytes, `fcp index --stream-max-bytes`); split "
                        "it or raise the limit",
                    )
                    continue
                if not line.strip():
                    continue
                yield RawSample(
                    key=f"line {n}", members={"json": (off, len(line))}, payload={"json": line}
                )
        except DecompressedTooLong as exc:
            yield BadMember("(shard)", f"the rest of the file is not read: {exc}")
        except (OSError, EOFError) as exc:  # a cut .gz / .zst, a corrupt frame: the rest is lost
            yield BadMember("(shard)", f"the file stops decoding ({type(exc).__name__}: {exc})")
        finally:
            status = close()
        if isinstance(status, str):
            yield BadMember("(shard)", status)


def iter_jsonl(
    url: str, fmt: str, *, timeout_s: float, max_bytes: int, span: tuple[int, int] | None = None
) -> JsonlLines:
    """Samples of one JSON Lines shard: member `json` per non-blank line (blank lines skip),
    keyed "line N" counted from 1 (as an editor shows it); `span` (lo, hi): only the lines
    that start in bytes [lo, hi) of a plain local file, numbered from 1 within it.

    `max_bytes` bounds a line (any format) and what a compressed file decompresses to."""
    return JsonlLines(url, fmt, timeout_s=timeout_s, max_bytes=max_bytes, span=span)


def decompressed_copy(
    url: str, fmt: str, fingerprint: str, directory: Path, *, end: int = 0
) -> str:
    """The local path of `url` decompressed (made once; a partial copy is never used).

    Only the first `end` decompressed bytes are written (0: all): the end of the last line the
    index holds, so a file that decompresses past what was indexed costs no more. Written to
    `<name>.partial-<pid>` and renamed into place, so DataLoader workers that race produce one
    whole copy each and the last rename wins with identical bytes.
    """
    key = hashlib.sha256(f"{os.path.abspath(url)}\0{fingerprint}".encode()).hexdigest()[:24]
    path = Path(directory) / f"{key}.jsonl"
    if path.is_file():
        return str(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.partial-{os.getpid()}")
    try:
        with open_decompressed(url, fmt) as src, open(tmp, "wb") as dst:
            left = end if end > 0 else -1
            while left != 0:
                try:
                    chunk = src.read()
                except (OSError, EOFError):  # a cut or damaged stream: as far as the scan read
                    break  # (it indexed only whole lines before the damage; crc32s verify them)
                if not chunk:
                    break
                if left > 0:
                    chunk, left = chunk[:left], max(0, left - len(chunk))
                dst.write(chunk)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise ConfigError(f"cannot decompress {url} into {directory} ({exc})") from exc
    return str(path)


def _samples(fmt: str) -> Callable[[str, Any, Span | None], JsonlLines]:
    """The registry's sample iterator of JSON Lines variant `fmt` (a ScanConfig drives it)."""

    def samples(url: str, config: Any, span: Span | None) -> JsonlLines:
        return iter_jsonl(
            url,
            fmt,
            timeout_s=config.stream_timeout_s,
            max_bytes=config.stream_max_bytes,
            span=span,
        )

    return samples


def _split(url: str, size: int, n: int) -> list[SplitPiece]:
    """`n` byte ranges of a plain local file: a piece owns the lines that start inside it."""
    cuts = sorted({size * k // n for k in range(n + 1)})
    return [((a, b), a, b) for a, b in pairwise(cuts)]


def _copy(fmt: str) -> Callable[[str, str, Path, int], str]:
    def copy(url: str, fingerprint: str, directory: Path, end: int) -> str:
        return decompressed_copy(url, fmt, fingerprint, directory, end=end)

    return copy


def _json_lines(path: str) -> bool:
    """True when the first two non-blank lines of `path` (within 64 KiB) are JSON objects: JSON
    Lines under another name. A pretty-printed or one-line JSON document (tokenizer.json,
    config.json) is not."""
    try:
        with open(path, "rb") as f:
            head = f.read(1 << 16)
    except OSError:
        return False
    lines = [ln for ln in head.split(b"\n")[:-1] if ln.strip()][:2]  # whole lines only
    if len(lines) < 2:
        return False
    try:
        return all(isinstance(json.loads(ln), dict) for ln in lines)
    except ValueError:
        return False


def _magic(head: bytes) -> bool:
    return head.lstrip()[:1] == b"{"


def _confirm(path: str) -> str:
    """ "" for JSON Lines under another name (refused by name), else why it is not data."""
    return "" if _json_lines(path) else "JSON, not JSON Lines: a config or tokenizer file"


FORMATS = (
    CorpusFormat(
        name="jsonl",
        title="JSON Lines (.jsonl/.ndjson, also .gz/.zst)",
        suffixes=(".jsonl", ".ndjson"),
        byte_range=True,
        samples=_samples("jsonl"),
        split=_split,
        magic=_magic,
        hint="JSON Lines: name it *.jsonl",
        confirm=_confirm,
    ),
    CorpusFormat(
        name="jsonl.gz",
        title="",
        suffixes=(".jsonl.gz", ".ndjson.gz"),
        byte_range=False,
        samples=_samples("jsonl.gz"),
        local_copy=_copy("jsonl.gz"),
    ),
    CorpusFormat(
        name="jsonl.zst",
        title="",
        suffixes=(".jsonl.zst", ".jsonl.zstd", ".ndjson.zst"),
        byte_range=False,
        samples=_samples("jsonl.zst"),
        local_copy=_copy("jsonl.zst"),
    ),
)
