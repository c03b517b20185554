"""Damaged tars: real shards written by webdataset, then corrupted at exact byte offsets.

Every sample of the intact shard must come back either unchanged (same key, same member
offsets) or named in a skip record; nothing may vanish. The intact shard read by `tarfile`
(webdataset's reader) is the oracle for what a correct scan returns.
"""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from webdataset import TarWriter

from fcp_data.errors import SampleError
from fcp_data.readers.build import build_index
from fcp_data.readers.scan import ScanConfig
from fcp_data.readers.shards import BadMember, RawSample, iter_raw_samples
from fcp_data.readers.stream import stream_records

N = 8


def _intact(path: Path, n: int = N) -> bytes:
    with TarWriter(str(path)) as w:
        for i in range(n):
            w.write({"__key__": f"s{i:02d}", "txt": b"x" * (300 + 97 * i), "cls": b"%d" % i})
    return path.read_bytes()


def _headers(data: bytes) -> list[tuple[str, int]]:
    """(member name, header offset) as tarfile reads the intact bytes: the oracle."""
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        return [(m.name, m.offset) for m in tf.getmembers()]


def _scan(data: bytes, path: Path) -> tuple[dict[str, RawSample], list[BadMember]]:
    path.write_bytes(data)
    out = list(iter_raw_samples(str(path), lambda ext: ext == "txt"))
    good = {r.key: r for r in out if isinstance(r, RawSample)}
    return good, [r for r in out if isinstance(r, BadMember)]


def _regions(bad: list[BadMember]) -> list[tuple[int, float]]:
    """Reported damaged byte ranges; "..end" reaches past the cut, to whatever followed."""
    out: list[tuple[int, float]] = []
    for b in bad:
        if b.key.startswith("(bytes "):
            start, stop = b.key[7:-1].split("..")
            out.append((int(start), float("inf") if stop == "end" else int(stop)))
    return out


def _assert_nothing_lost(intact: bytes, data: bytes, tmp: Path) -> list[BadMember]:
    want, _ = _scan(intact, tmp / "intact.tar")
    got, bad = _scan(data, tmp / "damaged.tar")
    named = {b.key for b in bad}
    regions = _regions(bad)
    assert regions, "damage was not reported"
    headers = _headers(intact)
    for key, sample in want.items():
        if key in got:
            assert got[key].members == sample.members  # survivors are exact
            assert got[key].payload == sample.payload
        elif key not in named:  # lost only if every member header lies in a reported region
            mine = [off for name, off in headers if name.startswith(key + ".")]
            assert all(any(a <= off < b for a, b in regions) for off in mine), (key, regions)
    return bad


def _second_header(intact: bytes, k: int = 4) -> int:
    return _headers(intact)[k][1]


def test_garbage_header_resyncs_and_counts_only_its_region(tmp_path: Path) -> None:
    intact = _intact(tmp_path / "a.tar")
    off = _second_header(intact)  # s02.cls: the first member of the third sample
    data = bytearray(intact)
    data[off : off + 512] = bytes((i * 131 + 7) % 256 for i in range(512))
    bad = _assert_nothing_lost(intact, bytes(data), tmp_path)
    got, _ = _scan(bytes(data), tmp_path / "d.tar")
    assert sorted(got) == [f"s{i:02d}" for i in range(N) if i not in (1, 2)]
    region = next(b for b in bad if b.key.startswith("(bytes"))
    assert region.key == f"(bytes {off}..{off + 1024})"  # header + one data block
    assert "bad checksum" in region.reason and f"byte {off}" in region.reason
    # tarfile, the usual reader, stops at that header as if the archive had ended
    with tarfile.open(fileobj=io.BytesIO(bytes(data))) as tf:
        assert len(tf.getmembers()) == 4


def test_zeroed_header_is_not_an_end_of_archive(tmp_path: Path) -> None:
    intact = _intact(tmp_path / "a.tar")
    off = _second_header(intact, 6)
    data = intact[:off] + bytes(512) + intact[off + 512 :]
    bad = _assert_nothing_lost(intact, data, tmp_path)
    assert any("zero block" in b.reason for b in bad)
    got, _ = _scan(data, tmp_path / "d.tar")
    assert "s07" in got  # read on past the zero block


CUTS = {  # webdataset writes each member as: pax header, pax data, ustar header, data
    # case: (member whose header chain is cut: 8 = s04.cls, 9 = s04.txt; bytes into it; text)
    "inside_header": (8, 100, "cut inside a member header at byte {cut}"),
    "member_boundary": (8, 0, "cut at a member boundary at byte {cut}"),
    "inside_pax_padding": (8, 600, "cut inside a member's padding at byte {cut}"),
    "inside_data": (9, 1536 + 100, "shard ends at byte {cut}: truncated"),
}


@pytest.mark.parametrize("where", sorted(CUTS))
def test_cut_shards_report_the_offset(tmp_path: Path, where: str) -> None:
    intact = _intact(tmp_path / "a.tar")
    member, into, text = CUTS[where]
    off = _second_header(intact, member)
    cut = off + into
    bad = _assert_nothing_lost(intact, intact[:cut], tmp_path)
    region = next(b for b in bad if b.key.startswith("(bytes"))
    assert region.key == f"(bytes {off}..end)"
    assert text.format(cut=cut) in region.reason
    if where == "inside_data":  # the cut member's header held: its name pins the loss
        got, _ = _scan(intact[:cut], tmp_path / "c.tar")
        assert sorted(got) == [f"s{i:02d}" for i in range(4)]  # s03 is whole: kept
        assert any(b.key == "s04" and "'s04.txt' is lost" in b.reason for b in bad)
        return
    before = "s03" if member == 8 else "s04"  # the sample before the cut may lack members
    assert any(b.key == before and "precedes damaged" in b.reason for b in bad)


@pytest.mark.parametrize("first", [True, False])  # the cut member opens its sample, or not
@pytest.mark.parametrize("stream", [False, True])
def test_a_cut_inside_a_members_data_keeps_the_whole_sample_before_it(
    tmp_path: Path, first: bool, stream: bool
) -> None:
    """Issue: cut inside the data of a sample's first member, the whole sample before it was
    dropped with it ("precedes damaged tar"): 5 of 6 intact samples kept. The member's header
    held (its checksum), so its name says which sample the loss is in."""
    path = tmp_path / "a.tar"
    with TarWriter(str(path)) as w:  # members in order: .txt (600+ bytes), then .xyz
        for i in range(6):
            w.write({"__key__": f"s{i:02d}", "txt": b"x" * (600 + i), "xyz": b"%d" % i})
    intact = path.read_bytes()
    name, off = _headers(intact)[8 if first else 9]
    assert name == ("s04.txt" if first else "s04.xyz")
    size = 604 if first else 1
    cut = off + 1536 + size // 2  # past the pax chain and the ustar header, into the data
    damaged = tmp_path / "cut.tar"
    damaged.write_bytes(intact[:cut])
    url = f"pipe:cat {damaged}" if stream else str(damaged)
    out = list(iter_raw_samples(url, lambda ext: ext == "txt"))
    got = {r.key: r for r in out if isinstance(r, RawSample)}
    bad = [r for r in out if isinstance(r, BadMember)]
    want, _ = _scan(intact, tmp_path / "intact.tar")
    assert sorted(got) == ["s00", "s01", "s02", "s03"]  # was s00..s02: s03 was dropped
    assert all(got[k].payload["txt"] == want[k].payload["txt"] for k in got)
    assert [b.key for b in bad] == [f"(bytes {off}..end)", "s04"]
    assert f"member {name!r} is lost in damaged tar bytes {off}..end" in bad[1].reason


def test_end_of_archive_present_means_complete(tmp_path: Path) -> None:
    intact = _intact(tmp_path / "a.tar")
    got, bad = _scan(intact, tmp_path / "d.tar")
    assert len(got) == N and bad == []
    with tarfile.open(fileobj=io.BytesIO(intact)) as tf:
        tf.getmembers()
        eoa = tf.offset  # where tarfile found the end-of-archive blocks
    assert intact[eoa : eoa + 1024] == bytes(1024)
    got, bad = _scan(intact[: eoa + 512], tmp_path / "e.tar")  # one zero block suffices
    assert len(got) == N and bad == []
    got, bad = _scan(intact + intact, tmp_path / "f.tar")  # concatenated archives: all read
    assert len(bad) == 0 and len(got) == N  # (keys repeat; the dict keeps one of each)


def test_not_a_tar_at_all(tmp_path: Path) -> None:
    got, bad = _scan(b"this is not a tar file at all" * 40, tmp_path / "junk.tar")
    assert got == {} and len(bad) == 1 and "not a tar archive" in bad[0].reason


def test_damage_goes_through_the_failure_policy(tmp_path: Path) -> None:
    intact = _intact(tmp_path / "a.tar")
    off = _second_header(intact)
    path = tmp_path / "d.tar"
    path.write_bytes(intact[:off] + os.urandom(512) + intact[off + 512 :])
    idx = build_index(str(path), tmp_path / "idx")
    assert list(idx.keys) == [f"s{i:02d}" for i in range(N) if i not in (1, 2)]
    assert {s.key for s in idx.skipped} == {"s01", "s02", f"(bytes {off}..{off + 1024})"}
    with pytest.raises(SampleError, match="precedes damaged tar bytes"):
        list(stream_records(str(path), config=ScanConfig(on_error="raise")))


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    block=st.integers(min_value=0, max_value=40),
    mode=st.sampled_from(["garbage", "zero", "cut", "cut+100"]),
)
def test_any_damaged_block_loses_nothing_silently(tmp_path: Path, block: int, mode: str) -> None:
    intact = _intact(tmp_path / "a.tar")
    off = 512 * block
    if mode == "garbage":
        data = (
            intact[:off] + bytes((i * 89 + block) % 256 for i in range(512)) + intact[off + 512 :]
        )
    elif mode == "zero":
        data = intact[:off] + bytes(512) + intact[off + 512 :]
    else:
        data = intact[: off + (100 if mode == "cut+100" else 0)]
    if data == intact or (mode == "zero" and intact[off : off + 512] == bytes(512)):
        return  # a zero block zeroed again, or a cut past the data: nothing to find
    want, _ = _scan(intact, tmp_path / "w.tar")
    got, bad = _scan(data, tmp_path / "g.tar")
    if not bad:
        # only legal when garbage hit data (a member's or a pax record's), not a header
        try:
            tarfile.TarInfo.frombuf(intact[off : off + 512], "utf-8", "strict")
            hit_header = True
        except tarfile.HeaderError:
            hit_header = False
        with tarfile.open(fileobj=io.BytesIO(intact)) as tf:
            tf.getmembers()
            eoa = tf.offset
        if mode.startswith("cut"):
            assert len(data) >= eoa + 512  # a whole end-of-archive block survived the cut
        else:
            assert not hit_header
        assert {k: r.members for k, r in got.items()} == {k: r.members for k, r in want.items()}
        return
    _assert_nothing_lost(intact, data, tmp_path)


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_header_formats_match_tarfile(tmp_path: Path, fmt: int) -> None:
    """Long names (ustar prefix, GNU long-name, pax path), non-ASCII names, a directory."""
    names = [f"{'d' * 60}/{'n' * 80}.txt", "short.txt", "dir/é-clip.json", f"{'k' * 95}.cls"]
    if fmt != tarfile.USTAR_FORMAT:
        names.append(f"{'x' * 180}.txt")  # too long for ustar
    path = tmp_path / "f.tar"
    with tarfile.open(path, "w", format=fmt) as tf:
        info = tarfile.TarInfo("adir")
        info.type = tarfile.DIRTYPE
        tf.addfile(info)
        for k, name in enumerate(names):
            data = bytes([k]) * (10 + 300 * k)
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    with tarfile.open(path) as tf:
        want = {m.name: (m.offset_data, m.size) for m in tf.getmembers() if m.isfile()}
    got, bad = _scan(path.read_bytes(), tmp_path / "g.tar")
    assert bad == []
    seen = {f"{key}.{ext}": span for key, raw in got.items() for ext, span in raw.members.items()}
    assert seen == want
