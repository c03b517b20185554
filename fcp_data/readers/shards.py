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
from collections.abc import Callable, Iterator, Sequence

import msgspec

from ..errors import ConfigError, MemberError, MissingFileError
from .byte_source import is_stream, open_source
from .errors import SkippedFile
from .remote import is_remote, remote_fingerprint
from .sources.tar_blocks import TarDamage, TarMember, walk_tar

__all__ = [
    "BadMember",
    "RawSample",
    "as_local_path",
    "expand_shards",
    "is_seekable",
    "iter_raw_samples",
    "read_members",
    "shard_fingerprint",
]

FINGERPRINT_BLOCK = 1 << 20  # bytes hashed at the head, middle and tail of a shard
STREAM_TIMEOUT_S = 60.0  # seconds a pipe or FIFO may go without a byte (ScanConfig default)
STREAM_MAX_BYTES = 16 << 30  # bytes one streamed shard may produce (held in memory; ScanConfig)
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
    """False for `pipe:` URLs, FIFOs and remote URLs: only local files are read by seeking."""
    return not is_stream(url) and not is_remote(url)


def expand_shards(
    specs: Sequence[str] | str, *, skipped: list[SkippedFile] | None = None
) -> list[str]:
    """Shard URLs from specs, in order, duplicates removed; a spec matching nothing raises.

    A megatron prefix (`corpus_text_document`, as megatron's `--data-path` names a dataset)
    is its `.bin`; files inside a directory that are not data are appended to `skipped`."""
    try:
        from braceexpand import braceexpand
    except ImportError:  # webdataset always brings it; this keeps a broken env working
        from webdataset.shardlists import braceexpand  # type: ignore[attr-defined,no-redef]

    from .sources.detect import check_remote
    from .sources.registry import prefix_shard

    if isinstance(specs, str):
        specs = [specs]
    out: list[str] = []
    for spec in specs:
        urls: list[str] = []
        for url in (u for part in spec.split("::") for u in braceexpand(part)):
            if url.startswith("pipe:") or is_remote(url):
                if os.path.lexists(url):
                    raise ConfigError(
                        f"shard spec {url!r} is both a local file and a "
                        f"{'pipe: command' if url.startswith('pipe:') else 'remote URL'}; "
                        f"fcp will not guess: write {os.path.join('.', url)!r} for the file, "
                        "or rename it"
                    )
                if is_remote(url):
                    check_remote(url)  # formats without byte ranges are local only
                urls.append(url)  # braces expand inside commands too, as in webdataset
            elif glob.has_magic(url):
                for path in sorted(glob.glob(url)):
                    urls.extend(_local(as_local_path(path), skipped))
            elif os.path.exists(url) or prefix_shard(url):
                urls.extend(_local(as_local_path(url), skipped))
            else:
                half = next((url + e for e in (".bin", ".idx") if os.path.isfile(url + e)), "")
                hint = (
                    f"; {half} exists but a megatron dataset needs both PREFIX.bin and PREFIX.idx"
                    if half
                    else "; check the path or pattern"
                )
                raise MissingFileError(f"shard {url!r} (from spec {spec!r}) does not exist{hint}")
        if not urls:
            raise MissingFileError(f"shard spec {spec!r} matched no files")
        out.extend(urls)
    return list(dict.fromkeys(out))


def as_local_path(path: str) -> str:
    """`path` spelled so that no reader can take it for a command or a URL.

    A file may be named `pipe:touch X;.tar` or sit in a folder named `http:`; a glob result or
    a recorded relative path is data, so it gets a leading "./" rather than being run or
    fetched (only a `pipe:` string the user typed as a spec is a command).
    """
    if (path.startswith("pipe:") or is_remote(path)) and not os.path.isabs(path):
        return os.path.join(".", path)
    return path


def _local(path: str, skipped: list[SkippedFile] | None = None) -> list[str]:
    """The shards of a local path: a file, or a directory's files (`sources.expand_local`:
    JSONL, Parquet, HF save_to_disk, megatron pairs, tars); an unreadable file raises."""
    from .sources.detect import expand_local
    from .sources.registry import format_for

    out = [as_local_path(p) for p in expand_local(path, skipped)]
    for p in out:
        check = format_for(p).check_local  # a compressed tar fails here, before any work
        if check is not None:
            check(p)
    return out


def shard_fingerprint(url: str) -> str:
    """A content hash: blake2b of the size and of 1 MiB at the head, middle and tail.

    Reading three blocks keeps `LengthIndex.open` fast on terabytes of shards while catching
    the usual staleness (a shard rewritten, truncated or appended to). Pipes cannot be verified
    and get "".
    """
    if is_remote(url):
        return remote_fingerprint(url)  # size + ETag from one HEAD
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


def _where(ev: TarDamage) -> str:
    return f"bytes {ev.start}..{'end' if ev.stop < 0 else ev.stop}"


def _damaged_key(ev: TarDamage) -> str | None:
    """The sample key a damaged header still names, or None."""
    split = _split_name(ev.name) if ev.name else None
    return None if split is None else split[0]


def _damaged_ext(ev: TarDamage) -> str:
    split = _split_name(ev.name) if ev.name else None
    return "" if split is None else split[1]


def _group(events: Iterator[TarMember | TarDamage]) -> Iterator[RawSample | BadMember]:
    """Consecutive members with one key form a sample; damage spoils the samples it may touch.

    Members lost in a damaged region may belong to the sample before it or the one after it.
    When the damaged header still names its member (`TarDamage.name`) the loss is pinned to
    that sample, but only once a neighbour confirms the name (a bit flip in the name must not
    clear an incomplete sample): the sample before the region has the same key, or the first
    member after it does. What lies between a member of key K and the next member of key K
    belongs to K; the sample on the other side is kept only when the region is exactly the
    named member (`exact`). Anything unconfirmed falls back to reporting the region and both
    neighbours as possibly incomplete rather than passing a sample on with a member missing.

    A flipped key can spell a neighbour's key ("s00000.txt" damaged into "s00001.txt"), which
    a key alone would take as confirmation and so pass the true owner on without its member
    (found by the fuzzer: tests/fuzz/corpus/tar). A sample holds one member per extension, so
    a confirming sample that holds its own member of the damaged name's extension proves the
    name wrong: the sample before is checked when the damage arrives, the sample after once it
    is complete (the sample before waits for it), and a wrong name falls back to the region.
    """
    current: RawSample | None = None
    bad: str | None = None  # why `current` cannot be used
    after_damage: str | None = None  # why the next sample to start cannot be used
    pending: TarDamage | None = None  # a named damage waiting for the event after it
    held: RawSample | None = None  # the sample before `pending` (another key): kept if confirmed
    held_bad: str | None = None
    # a damage pinned to `current` by its first member: (the sample before, its fault, damage),
    # decided once `current` is complete
    deferred: tuple[RawSample | None, str | None, TarDamage] | None = None

    def lost(ev: TarDamage) -> str:
        return f"member {ev.name!r} is lost in damaged tar {_where(ev)}: {ev.reason}"

    def precedes(ev: TarDamage) -> str:
        return f"precedes damaged tar {_where(ev)}: it may be missing members"

    def follows(ev: TarDamage) -> str:
        return f"follows damaged tar {_where(ev)}: it may be missing members"

    def close(complete: bool) -> Iterator[BadMember | RawSample]:
        """`current` is finished (`complete`: no damage cut it short): settle a deferred pin,
        then yield it."""
        nonlocal current, bad, deferred
        if deferred is not None:
            prev, prev_bad, ev = deferred
            deferred = None
            wrong = current is not None and _damaged_ext(ev) in current.members
            if wrong or not complete:  # the name was not this sample's, or cannot be told
                if prev is not None:
                    yield BadMember(prev.key, prev_bad or precedes(ev))
                yield BadMember(f"({_where(ev)})", ev.reason)
                if current is not None and wrong:
                    bad = follows(ev)
            elif prev is not None:  # confirmed: every lost member is this sample's
                yield prev if prev_bad is None else BadMember(prev.key, prev_bad)
        if current is not None:
            yield current if bad is None else BadMember(current.key, bad)
        current = None

    def settle(confirmed: bool) -> Iterator[BadMember | RawSample]:
        """Decide `pending` now that the event after it is known (`confirmed`: it names K)."""
        nonlocal current, bad, after_damage, pending, held, held_bad, deferred
        ev, pending = pending, None
        assert ev is not None
        key = _damaged_key(ev)
        assert key is not None
        before = current is None or current.key != key  # the region starts a new sample K
        if confirmed and before:  # K's first member confirms: decided once K is complete
            deferred = (held, held_bad, ev)
            current, bad, after_damage = RawSample(key=key, members={}, payload={}), lost(ev), None
        elif not confirmed:
            if before and held is not None:
                yield BadMember(held.key, held_bad or precedes(ev))
            yield BadMember(f"({_where(ev)})", ev.reason)
            after_damage = follows(ev)
        held, held_bad = None, None

    for ev in events:
        if pending is not None:
            if isinstance(ev, TarDamage):
                nxt = _damaged_key(ev)
            else:
                split = _split_name(ev.name)
                nxt = None if split is None or ev.name == pending.name else split[0]
            yield from settle(nxt == _damaged_key(pending))
        if isinstance(ev, TarDamage):
            key = _damaged_key(ev)
            if key is not None and ev.trusted:  # cut inside a member whose header held
                if current is not None and current.key != key:  # whole: all its members came
                    yield from close(True)
                if current is None:
                    current, bad = RawSample(key=key, members={}, payload={}), None
                bad, after_damage = bad or lost(ev), None
                yield BadMember(f"({_where(ev)})", ev.reason)  # what followed the cut is lost
                continue
            if key is not None and current is not None and current.key == key:
                if _damaged_ext(ev) in current.members:  # it holds that member: not its name
                    key = None
                else:
                    bad = bad or lost(ev)  # the sample it belongs to, read up to here
                    if not ev.exact:  # the region may hide more: settled by what follows
                        pending = ev
                    continue
            if key is not None:  # names the next sample: hold the one before until confirmed
                if deferred is not None:  # the sample before is itself undecided: cut short
                    yield from close(False)
                held, held_bad, current, bad, pending = current, bad, None, None, ev
                continue
            if current is not None:
                bad = bad or precedes(ev)
                yield from close(False)
            yield BadMember(f"({_where(ev)})", ev.reason)
            after_damage = follows(ev)
            continue
        split = _split_name(ev.name)
        if split is None:
            yield BadMember(ev.name, "tar member has no key.extension name, not a sample")
            continue
        key, ext = split
        if current is not None and current.key != key:
            yield from close(True)
        if current is None:
            current = RawSample(key=key, members={}, payload={})
            bad, after_damage = after_damage, None
        if ext in current.members and bad is None:
            bad = (
                f"duplicate member {ev.name!r}: two .{ext} members in one sample (webdataset "
                "raises ValueError on this); re-create the shard with one member per extension"
            )
        current.members[ext] = (ev.offset, ev.size)
        if ev.data is not None:
            current.payload[ext] = ev.data
    if pending is not None:
        yield from settle(False)
    yield from close(True)


def iter_raw_samples(
    url: str,
    load: Callable[[str], bool],
    *,
    timeout_s: float = STREAM_TIMEOUT_S,
    max_bytes: int = STREAM_MAX_BYTES,
) -> Iterator[RawSample | BadMember]:
    """Samples of one shard in tar order; members whose extension `load(ext)` accepts are read.

    Nothing is lost without a record: a damaged region of the tar (bad header, cut, missing
    end-of-archive blocks) yields a `BadMember` keyed "(bytes START..STOP)" and reading resumes
    at the next valid header; a stream that stalls for `timeout_s` is such a region from the
    member being read on; a `pipe:` command that exits non-zero yields a `BadMember` keyed
    "(shard)". Streams (pipes, FIFOs) are read fully. Raises CompressedShardError for a
    compressed shard.
    """
    stream = is_stream(url)
    try:
        src = open_source(url, timeout_s=timeout_s, max_bytes=max_bytes)
    except OSError as exc:
        yield BadMember("(shard)", f"cannot open the shard ({exc})")
        return

    def want(name: str) -> bool:
        split = _split_name(name)
        return stream or (split is not None and load(split[1]))

    drained = False
    try:
        yield from _group(walk_tar(src, want))
        drained = not src.stalled
    finally:
        status = src.close(drained=drained)  # also on GeneratorExit: kills a pipe's command
    if status is not None:
        yield BadMember("(shard)", status)


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
                raise MemberError(
                    f"{path}: member .{ext} at {offset} truncated ({len(data)} "
                    f"of {size} bytes); the shard changed, re-run fcp index"
                )
            out[ext] = data
    return out
