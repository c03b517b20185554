"""Walk a tar archive block by block and account for every byte: members, or damage.

`tarfile` ends an archive at the first header it cannot parse once past byte 0: a header
overwritten with garbage, a shard cut inside a header, or cut at a member boundary with the
end-of-archive blocks missing all read as a clean end, and every later sample vanishes. This
walker reports each as a `TarDamage` with byte offsets instead:

- a 512-byte header whose checksum fails (`tarfile.TarInfo.frombuf` checks it) starts a
  damaged region; the walker resyncs at the next 512-aligned block that is a valid ustar
  header (checksum and the `ustar` magic) and reads on, so only the region is lost; when the
  bad header still spells a file member's name, the damage carries that name and whether the
  region is exactly that member, so the grouping can blame the one sample it belonged to;
- a zero block is the end-of-archive marker only if nothing but zeros follows it; a zeroed
  header followed by more members is damage, resynced the same way (all-zero gaps, as between
  concatenated archives, lose nothing and are not reported);
- a source that ends without the marker, inside a header or inside a member's data is a cut,
  reported with the offset where reading stopped.

Compressed shards are refused (`CompressedShardError`): a member is later read by seeking to
its byte offset, which needs an uncompressed tar.
"""

from __future__ import annotations

import tarfile
from collections.abc import Callable, Iterator

import msgspec

from ..byte_source import ByteSource, StreamStalled
from ..errors import CompressedShardError

__all__ = ["COMPRESSED_MAGIC", "TarDamage", "TarMember", "compression_of", "walk_tar"]

BLOCK = 512
ZERO_BLOCK = bytes(BLOCK)
SCAN_CHUNK = 128 * BLOCK  # bytes read at a time while looking for the next valid header
# magic bytes -> format, for the refusal message (gzip, bzip2, xz, zstd, lz4 frames).
COMPRESSED_MAGIC = {
    b"\x1f\x8b": "gzip",
    b"BZh": "bzip2",
    b"\xfd7zXZ\x00": "xz",
    b"\x28\xb5\x2f\xfd": "zstd",
    b"\x04\x22\x4d\x18": "lz4",
}
_FILE_TYPES = (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE)
_PAX_TYPES = (tarfile.XHDTYPE, tarfile.SOLARIS_XHDTYPE)


class TarMember(msgspec.Struct, frozen=True):
    """A regular file member: its name, data offset and size; `data` when it was asked for."""

    name: str
    offset: int
    size: int
    data: bytes | None


class TarDamage(msgspec.Struct, frozen=True):
    """Bytes `start..stop` could not be read as tar (`stop` = -1: to the end of the source).

    `name` is the member name a header with a failed checksum still spells ("" when the block
    is no recognisable file header); `exact` says the region is exactly that member (its header
    chain and its data, by the size the header records, with a valid header or the end of the
    archive right after it), so nothing else can be hidden in it. Together they let the grouping
    blame the one sample the lost member belonged to instead of both neighbours.
    """

    start: int
    stop: int
    reason: str
    name: str = ""
    exact: bool = False
    trusted: bool = False
    """`name` was read from a header whose checksum held (a source cut inside that member's
    data): no neighbour has to confirm it, and the sample before it is whole."""


def compression_of(head: bytes) -> str | None:
    """The compression format whose magic bytes start `head`, or None."""
    return next((fmt for magic, fmt in COMPRESSED_MAGIC.items() if head.startswith(magic)), None)


def _header(block: bytes) -> tarfile.TarInfo | None:
    try:
        return tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
    except tarfile.HeaderError:
        return None


def _is_resync_header(block: bytes) -> bool:
    """A block a resync may trust: ustar magic (cheap test first) and a valid checksum."""
    return block[257:262] == b"ustar" and _header(block) is not None


def _resync(src: ByteSource) -> tuple[bytes | None, int]:
    """Read on to the next valid header block: (that block or None at the end, dirty end).

    The dirty end is the offset just past the last non-zero byte read on the way (-1 when all
    were zeros): it tells an all-zero gap from lost data, and whether only zeros follow a
    damaged member's data. Reads in chunks so scanning a damaged 1 GB video costs one Python
    step per 512 bytes of a buffer, not one read() each.
    """
    dirty_end = -1
    while True:
        at = src.pos
        chunk = src.read(SCAN_CHUNK)
        usable = len(chunk) - len(chunk) % BLOCK
        for k in range(0, usable, BLOCK):
            block = chunk[k : k + BLOCK]
            if _is_resync_header(block):
                src.unread(chunk[k + BLOCK :])  # the next read starts after the header
                return block, dirty_end
            if block != ZERO_BLOCK:
                dirty_end = at + k + BLOCK
        if len(chunk) < SCAN_CHUNK:
            if any(chunk[usable:]):
                dirty_end = at + len(chunk)
            return None, dirty_end


def _named(block: bytes) -> tuple[str, int | None] | None:
    """(name, size or None) a file header whose checksum failed still spells, else None.

    Only a block that is plainly a regular-file header (the `ustar` magic, a file type flag, a
    printable name) qualifies: the name then most likely survived the damage (a flipped size
    or checksum byte), and the grouping still checks it against the neighbouring members.
    """
    if block[257:262] != b"ustar" or block[156:157] not in (b"0", b"\0", b"7"):
        return None
    name = tarfile.nts(block[0:100], "utf-8", "surrogateescape")
    if block[257:265] == b"ustar\x0000":  # POSIX ustar: a long name's head is in the prefix
        prefix = tarfile.nts(block[345:500], "utf-8", "surrogateescape")
        name = f"{prefix}/{name}" if prefix else name
    if not name or not name.isprintable():
        return None
    try:
        size: int | None = tarfile.nti(block[124:136])
    except tarfile.InvalidHeaderError:  # the size field itself is damaged
        size = None
    return name, size


def _pax_fields(data: bytes) -> dict[str, str]:
    """`path` and `size` of a pax extended header ("%d key=value\\n" records)."""
    out: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        space = data.find(b" ", pos)
        if space < 0:
            break
        try:
            length = int(data[pos:space])
        except ValueError:
            break
        if length <= 0:
            break
        key, _, value = data[space + 1 : pos + length - 1].partition(b"=")
        if key == b"path" or (key == b"size" and value.isdigit()):
            out[key.decode()] = value.decode("utf-8", "surrogateescape")
        pos += length
    return out


def _cut(chain: int, at: int, got: int) -> TarDamage:
    if at == 0 and got == 0:
        return TarDamage(0, -1, "empty: not one byte, not even the end-of-archive blocks")
    where = (
        "at a member boundary"
        if got == 0 and at % BLOCK == 0
        else "inside a member header"
        if got
        else "inside a member's padding"
    )
    return TarDamage(
        chain,
        -1,
        f"cut {where} at byte {at + got}: no end-of-archive blocks, so any member after it "
        "is lost; re-create or re-copy the shard",
    )


def _damage(
    block: bytes, start: int, chain: int, stop: int, name: str = "", exact: bool = False
) -> TarDamage:
    what = (
        "a zero block (end-of-archive marker)"
        if block == ZERO_BLOCK
        else "a corrupt member header (bad checksum)" + (f" still naming {name!r}" if name else "")
    )
    if chain == 0 and stop < 0 and not name:
        why = "not a tar archive: no valid member header anywhere"
    elif stop < 0:
        why = f"{what} at byte {start} and no valid header after it"
    else:
        why = f"{what} at byte {start}; reading resumed at byte {stop}"
    return TarDamage(chain, stop, f"{why}; re-create the shard", name, exact)


def walk_tar(src: ByteSource, want: Callable[[str], bool]) -> Iterator[TarMember | TarDamage]:
    """Members of the tar in `src` in order, with their data when `want(name)`; damage inline.

    A damaged region starts at the first header of the lost member's chain (a pax or GNU
    long-name header comes before the member's own header). A stream that stalls ends the walk
    with a damage record (its `stalled` flag is set). Raises CompressedShardError when the
    source starts with a compression format's magic bytes.
    """
    long_name: str | None = None
    pax: dict[str, str] = {}
    chain = -1  # offset of the first header of the member being read, -1 between members
    reading = ""  # the file member whose data is being read (its header held)
    try:
        while True:
            start = src.pos
            chain = start if chain < 0 else chain
            block = src.read(BLOCK)
            if start == 0 and (fmt := compression_of(block)) is not None:
                raise CompressedShardError(src.url, fmt)
            if len(block) < BLOCK:
                yield _cut(chain, start, len(block))
                return
            if start == 0 and not src.seekable and block != ZERO_BLOCK and not _header(block):
                # a stream cannot be re-read and may never end (`pipe:yes`): resyncing through
                # it would read forever, so a first block that is no header refuses the stream
                src.stalled = True  # abandoned: close() kills the command, status unreported
                yield TarDamage(
                    0,
                    -1,
                    f"not a tar stream: its first 512 bytes are no tar header (they start "
                    f"{block[:16]!r}); the source must write an uncompressed tar",
                )
                return
            info = None if block == ZERO_BLOCK else _header(block)
            if info is None:
                named = None if block == ZERO_BLOCK else _named(block)
                found, dirty_end = _resync(src)
                stop = src.pos - BLOCK if found is not None else -1
                # zeros up to a valid header: a gap between concatenated archives (two
                # end-of-archive blocks at least) loses nothing; one zero block alone is a
                # zeroed header of an empty member (found by the fuzzer: it vanished unsaid)
                gap = found is None or stop - start >= 2 * BLOCK
                if block == ZERO_BLOCK and dirty_end < 0 and chain == start and gap:
                    if found is None:
                        return  # the end-of-archive marker, then only zeros
                else:  # a lost member: its pending pax / long-name headers go with it
                    name, exact = "", False
                    if named is not None:
                        name = pax.get("path") or long_name or named[0]
                        size = int(pax["size"]) if "size" in pax else named[1]
                        if size is not None:  # where its data ends, if the size is right
                            end = start + BLOCK + size + (-size % BLOCK)
                            exact = (
                                stop == end
                                if found is not None
                                else dirty_end <= end and src.pos >= end + BLOCK
                            )
                    yield _damage(block, start, chain, stop, name, exact)
                    if found is None:
                        return
                    long_name, pax = None, {}
                assert found is not None
                start = chain = stop  # an all-zero gap (concatenated archives) loses nothing
                info = _header(found)
                assert info is not None
            size = int(pax["size"]) if "size" in pax else info.size
            data_at = start + BLOCK
            is_file = info.type in _FILE_TYPES
            full = (pax.get("path") or long_name or info.name) if is_file else ""
            if src.seekable and data_at + size > src.size:
                yield TarDamage(
                    chain,
                    -1,
                    f"member {info.name!r} at byte {start} needs {size} data bytes but the shard "
                    f"ends at byte {src.size}: truncated; re-create or re-copy the shard",
                    full,
                    trusted=is_file,
                )
                return
            meta = b""
            if info.type == tarfile.GNUTYPE_LONGNAME or info.type in _PAX_TYPES:
                meta = src.read(size)
                got = len(meta)
            elif info.type in _FILE_TYPES:
                name = reading = full
                if want(name):
                    data: bytes | None = src.read(size)
                    got = len(data)
                else:
                    data, got = None, src.skip(size)
                reading = ""
                if got == size:
                    yield TarMember(name, data_at, size, data)
            else:  # directories, links, global pax headers: nothing to index
                got = src.skip(size)
            if got < size:
                yield TarDamage(
                    chain,
                    -1,
                    f"cut inside member {info.name!r} at byte {data_at + got} (read {got} of "
                    f"{size} data bytes); re-create or re-copy the shard",
                    full,
                    trusted=is_file,
                )
                return
            if info.type == tarfile.GNUTYPE_LONGNAME:
                long_name = meta.rstrip(b"\0").decode("utf-8", "surrogateescape")
            elif info.type in _PAX_TYPES:
                pax = _pax_fields(meta)
            else:
                long_name, pax, chain = None, {}, -1
            src.skip(-size % BLOCK)
    except StreamStalled as exc:  # the member being read, and all after it, are unknown
        yield TarDamage(
            chain if chain >= 0 else src.pos, -1, str(exc), reading, trusted=bool(reading)
        )
