"""Shard specs and tar scanning with member offsets.

A spec is a path, a glob (`data/*.tar`), a brace pattern (`shard-{000..099}.tar`), a
`::`-separated list of those, or a `pipe:CMD` URL (read from CMD's stdout, not seekable): the
grammar of webdataset's `expand_urls`, expanded with `braceexpand` (webdataset's own dependency)
because importing webdataset pulls in torch (about 5 s, paid again in every worker process).
Scanning groups consecutive tar members by webdataset's key rule (`base_plus_ext`: the key is
the path up to the first dot of the basename, the extension the rest, lower-cased) and records
each member's data offset and size, so a sample can later be read with one seek per member.
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
import subprocess
import tarfile
from collections.abc import Callable, Iterator, Sequence
from typing import IO

import msgspec

__all__ = [
    "BadMember",
    "RawSample",
    "expand_shards",
    "is_seekable",
    "iter_raw_samples",
    "read_members",
    "shard_fingerprint",
]

FINGERPRINT_BLOCK = 1 << 20  # bytes hashed at the head, middle and tail of a shard
_KEY_EXT = r"^((?:.*/|)[^.]+)[.]([^/]*)$"  # webdataset.tariterators.base_plus_ext's pattern


class RawSample(msgspec.Struct, kw_only=True):
    """One sample's members: `members[ext] = (data_offset, size)`; `payload` holds loaded bytes."""

    key: str
    members: dict[str, tuple[int, int]]
    payload: dict[str, bytes]


class BadMember(msgspec.Struct, frozen=True):
    """A problem found while scanning: `key` is the sample key, or the member name."""

    key: str
    reason: str


def is_seekable(url: str) -> bool:
    return not url.startswith("pipe:")


def expand_shards(specs: Sequence[str] | str) -> list[str]:
    """Shard URLs from specs, in order, duplicates removed; a spec matching nothing raises."""
    try:
        from braceexpand import braceexpand
    except ImportError:  # webdataset always brings it; this keeps a broken env working
        from webdataset.shardlists import braceexpand  # type: ignore[attr-defined,no-redef]

    if isinstance(specs, str):
        specs = [specs]
    out: list[str] = []
    for spec in specs:
        urls: list[str] = []
        for url in (u for part in spec.split("::") for u in braceexpand(part)):
            if url.startswith("pipe:"):
                urls.append(url)  # braces expand inside commands too, as in webdataset
            elif glob.has_magic(url):
                urls.extend(sorted(glob.glob(url)))
            elif os.path.exists(url):
                urls.append(url)
            else:
                raise FileNotFoundError(
                    f"shard {url!r} (from spec {spec!r}) does not exist; check the path or pattern"
                )
        if not urls:
            raise FileNotFoundError(f"shard spec {spec!r} matched no files")
        out.extend(urls)
    return list(dict.fromkeys(out))


def shard_fingerprint(url: str) -> str:
    """A content hash: blake2b of the size and of 1 MiB at the head, middle and tail.

    Reading three blocks keeps `LengthIndex.open` fast on terabytes of shards while catching
    the usual staleness (a shard rewritten, truncated or appended to). Pipes cannot be verified
    and get "".
    """
    if not is_seekable(url):
        return ""
    size = os.path.getsize(url)
    h = hashlib.blake2b(str(size).encode(), digest_size=16)
    with open(url, "rb") as f:
        for start in sorted(
            {0, max(0, size // 2 - FINGERPRINT_BLOCK // 2), max(0, size - FINGERPRINT_BLOCK)}
        ):
            f.seek(start)
            h.update(f.read(FINGERPRINT_BLOCK))
    return h.hexdigest()


def _split_name(name: str) -> tuple[str, str] | None:
    match = re.match(_KEY_EXT, name)
    if match is None or not match.group(2):
        return None
    return match.group(1), match.group(2).lower()


def _open_tar(url: str) -> tuple[tarfile.TarFile, IO[bytes], subprocess.Popen[bytes] | None]:
    if is_seekable(url):
        f: IO[bytes] = open(url, "rb")  # noqa: SIM115 - closed by the caller
        return tarfile.open(fileobj=f, mode="r:"), f, None
    proc = subprocess.Popen(url[5:], shell=True, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    return tarfile.open(fileobj=proc.stdout, mode="r|"), proc.stdout, proc


def iter_raw_samples(url: str, load: Callable[[str], bool]) -> Iterator[RawSample | BadMember]:
    """Samples of one shard in tar order; members whose extension `load(ext)` accepts are read.

    Shard-level corruption (a bad header, truncated data) yields a `BadMember` and ends the
    shard; the samples before it are still yielded. Unseekable (pipe) shards are read fully.
    """
    seekable = is_seekable(url)
    size = os.path.getsize(url) if seekable else -1
    try:
        tf, fobj, proc = _open_tar(url)
    except (tarfile.TarError, OSError, EOFError) as exc:
        yield BadMember(os.path.basename(url), f"not a readable tar ({exc}); re-create the shard")
        return
    current: RawSample | None = None
    try:
        while True:
            try:
                info = tf.next()
            except (tarfile.TarError, OSError, EOFError) as exc:
                if current is not None:
                    yield current
                    current = None
                yield BadMember(
                    os.path.basename(url),
                    f"corrupt or truncated tar after byte {tf.offset} ({exc})",
                )
                return
            if info is None:
                break
            if not info.isfile():
                continue
            split = _split_name(info.name)
            if split is None:
                yield BadMember(info.name, "tar member has no key.extension name, not a sample")
                continue
            key, ext = split
            if current is not None and current.key != key:
                yield current
                current = None
            if seekable and info.offset_data + info.size > size:
                yield BadMember(
                    key,
                    f"member {info.name} truncated: needs "
                    f"{info.offset_data + info.size} bytes, shard has {size}",
                )
                return
            if current is None:
                current = RawSample(key=key, members={}, payload={})
            current.members[ext] = (info.offset_data, info.size)
            if not seekable or load(ext):
                member = tf.extractfile(info)
                data = member.read() if member is not None else b""
                if len(data) != info.size:
                    yield BadMember(
                        key, f"member {info.name} truncated: read {len(data)} of {info.size} bytes"
                    )
                    return
                current.payload[ext] = data
        if current is not None:
            yield current
    finally:
        tf.close()
        fobj.close()
        if proc is not None:
            proc.wait()


def read_members(
    path: str, members: dict[str, tuple[int, int]], exts: Sequence[str] | None = None
) -> dict[str, bytes]:
    """Read members by seeking to their data offsets (no tar parsing)."""
    out: dict[str, bytes] = {}
    with open(path, "rb") as f:
        for ext, (offset, size) in members.items():
            if exts is not None and ext not in exts:
                continue
            f.seek(offset)
            data = f.read(size)
            if len(data) != size:
                raise ValueError(
                    f"{path}: member .{ext} at {offset} truncated ({len(data)} "
                    f"of {size} bytes); the shard changed, re-run fcp index"
                )
            out[ext] = data
    return out
