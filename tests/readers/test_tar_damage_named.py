"""A damaged tar header whose name still reads: only the sample it names is lost.

A header with a bad checksum (or a flipped size digit) usually still spells its member's name.
The lost member then belongs to that sample, so the intact sample before it (and the one after
it, when the damaged region is exactly that member) must come back unchanged. Shards are
written by webdataset's TarWriter, then single header fields are overwritten; a scan of the
undamaged shard is the oracle for every survivor's members and bytes.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest
from webdataset import TarWriter

from fcp_data.readers.build import build_index
from fcp_data.readers.shards import BadMember, RawSample, iter_raw_samples

N = 8
KEYS = [f"s{i:02d}" for i in range(N)]


def _intact(path: Path) -> bytes:
    with TarWriter(str(path)) as w:
        for i, key in enumerate(KEYS):
            w.write({"__key__": key, "txt": b"x" * (300 + 97 * i), "cls": b"%d" % i})
    return path.read_bytes()


def _header_at(data: bytes, name: str) -> int:
    """Offset of the member's own ustar header (after webdataset's pax header, if any)."""
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        member = tf.getmember(name)
        return member.offset_data - 512


def _scan(data: bytes, path: Path) -> tuple[dict[str, RawSample], list[BadMember]]:
    path.write_bytes(data)
    out = list(iter_raw_samples(str(path), lambda ext: True))
    good = {r.key: r for r in out if isinstance(r, RawSample)}
    return good, [r for r in out if isinstance(r, BadMember)]


def _bad_checksum(data: bytearray, at: int) -> None:
    data[at + 148 : at + 156] = b"0000001\0"  # never the right sum of a real header


def _bad_size(data: bytearray, at: int) -> None:
    size = tarfile.nti(bytes(data[at + 124 : at + 136]))
    data[at + 124 : at + 136] = b"%011o\0" % (size + 4096)  # parses, but wrong: checksum fails


def _garbled_size(data: bytearray, at: int) -> None:
    data[at + 124 : at + 136] = b"9z9z9z9z9z9\0"  # not octal: the size is unknown


DAMAGE = {"checksum": _bad_checksum, "size": _bad_size, "garbled size": _garbled_size}


def _damaged(tmp: Path, hits: list[tuple[str, str]]) -> tuple[bytes, bytes, list[int]]:
    intact = _intact(tmp / "intact.tar")
    data = bytearray(intact)
    offsets = []
    for member, how in hits:
        at = _header_at(intact, member)
        DAMAGE[how](data, at)
        assert data[at : at + 100].rstrip(b"\0") == member.encode()  # the name still reads
        offsets.append(at)
    return intact, bytes(data), offsets


def _check_survivors(intact: bytes, data: bytes, tmp: Path, lost: set[str]) -> list[BadMember]:
    """Every sample but `lost` is back, byte for byte; every `lost` one is named."""
    want, none = _scan(intact, tmp / "w.tar")
    assert none == [] and sorted(want) == KEYS
    got, bad = _scan(data, tmp / "g.tar")
    assert sorted(got) == sorted(set(KEYS) - lost)
    for key, sample in got.items():
        assert sample.members == want[key].members and sample.payload == want[key].payload
    assert lost <= {b.key for b in bad}
    return bad


@pytest.mark.parametrize("how", ["checksum", "size", "garbled size"])
@pytest.mark.parametrize("member", ["s02.cls", "s00.cls"])  # a sample's first member
def test_first_member_of_a_sample_damaged_loses_only_that_sample(
    tmp_path: Path, member: str, how: str
) -> None:
    """The sample before the damaged header is complete (was: "precedes damaged tar")."""
    intact, data, (at,) = _damaged(tmp_path, [(member, how)])
    key = member.split(".")[0]
    bad = _check_survivors(intact, data, tmp_path, {key})
    assert [b.key for b in bad] == [key]  # no region record, no neighbour
    assert f"member {member!r} is lost in damaged tar bytes" in bad[0].reason
    assert f"bad checksum) still naming {member!r} at byte {at}" in bad[0].reason


@pytest.mark.parametrize("member", ["s03.txt", "s07.txt"])  # a sample's last; the shard's last
def test_last_member_of_a_sample_damaged_loses_only_that_sample(
    tmp_path: Path, member: str
) -> None:
    """The size still matches the layout (the next header, or only zeros, right after its
    data), so the sample after it is complete too."""
    intact, data, _ = _damaged(tmp_path, [(member, "checksum")])
    key = member.split(".")[0]
    bad = _check_survivors(intact, data, tmp_path, {key})
    assert [b.key for b in bad] == [key]


@pytest.mark.parametrize("how", ["size", "garbled size"])
def test_a_wrong_size_on_a_samples_last_member_still_reports_the_next(
    tmp_path: Path, how: str
) -> None:
    """With the size unknown the damaged region may also hide the next sample's first member:
    s03 is blamed by name, the region and s04 are reported, s02 and earlier are kept."""
    intact, data, _ = _damaged(tmp_path, [("s03.txt", how)])
    bad = _check_survivors(intact, data, tmp_path, {"s03", "s04"})
    keys = [b.key for b in bad]
    assert sorted(keys) == sorted(["s03", "s04", next(k for k in keys if k.startswith("(bytes"))])
    assert "follows damaged tar bytes" in next(b.reason for b in bad if b.key == "s04")


@pytest.mark.parametrize(
    "hits, lost",
    [
        ([("s02.cls", "checksum"), ("s02.txt", "checksum")], {"s02"}),  # one sample, both
        ([("s02.txt", "checksum"), ("s03.cls", "size")], {"s02", "s03"}),  # across a boundary
        (
            [("s06.txt", "checksum"), ("s07.cls", "checksum"), ("s07.txt", "checksum")],
            {"s06", "s07"},
        ),
    ],
)
def test_damaged_headers_in_a_row_lose_only_the_samples_they_name(
    tmp_path: Path, hits: list[tuple[str, str]], lost: set[str]
) -> None:
    intact, data, _ = _damaged(tmp_path, hits)
    bad = _check_survivors(intact, data, tmp_path, lost)
    assert sorted(b.key for b in bad) == sorted(lost)  # each counted once


def test_a_name_no_neighbour_confirms_is_not_trusted(tmp_path: Path) -> None:
    """A flipped byte in the name ("s02.txt" read as "s0Z.txt"): the lost member may be s02's or
    s03's, so both are reported with the region, as for an unreadable header."""
    intact = _intact(tmp_path / "intact.tar")
    at = _header_at(intact, "s02.txt")
    data = bytearray(intact)
    data[at + 2 : at + 3] = b"Z"
    bad = _check_survivors(intact, bytes(data), tmp_path, {"s02", "s03"})
    region = next(b for b in bad if b.key.startswith("(bytes "))
    assert "still naming 's0Z.txt'" in region.reason
    assert {b.key: b.reason.split(":")[0] for b in bad if b is not region} == {
        "s02": f"precedes damaged tar {region.key[1:-1]}",
        "s03": f"follows damaged tar {region.key[1:-1]}",
    }


def test_without_pax_headers_two_lost_members_in_one_region_spoil_both_neighbours(
    tmp_path: Path,
) -> None:
    """Plain ustar (no pax header per member): two damaged headers fall into one region, which
    then holds more than the named member, so s01 and s03 cannot be proven complete."""
    path = tmp_path / "u.tar"
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
        for i, key in enumerate(KEYS):
            for ext, body in (("cls", b"%d" % i), ("txt", b"x" * (300 + 97 * i))):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(body)
                tf.addfile(info, io.BytesIO(body))
    intact = path.read_bytes()
    data = bytearray(intact)
    for member in ("s02.cls", "s02.txt"):
        _bad_checksum(data, _header_at(intact, member))
    got, bad = _scan(bytes(data), tmp_path / "g.tar")
    assert sorted(got) == [k for k in KEYS if k not in ("s01", "s02", "s03")]
    (region,) = [b for b in bad if b.key.startswith("(bytes ")]  # s02 lies inside it
    assert "still naming 's02.cls'" in region.reason
    assert sorted(b.key for b in bad if b is not region) == ["s01", "s03"]


def test_build_index_and_a_pipe_count_only_the_damaged_sample(tmp_path: Path) -> None:
    _, data, _ = _damaged(tmp_path, [("s04.cls", "checksum")])
    path = tmp_path / "d.tar"
    path.write_bytes(data)
    idx = build_index(str(path), tmp_path / "idx")
    assert list(idx.keys) == [k for k in KEYS if k != "s04"]
    assert [s.key for s in idx.skipped] == ["s04"]
    piped = list(iter_raw_samples(f"pipe:cat {path}", lambda ext: True))
    assert [r.key for r in piped if isinstance(r, BadMember)] == ["s04"]
    assert [r.key for r in piped if isinstance(r, RawSample)] == list(idx.keys)
