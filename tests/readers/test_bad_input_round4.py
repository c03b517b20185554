"""Bad input, round 4: the new sources and surfaces, each case handled and proven for real.

Every file here is written for real (zstd and gzip streams cut at a byte, a HF save_to_disk
folder whose state.json points outside it, tars whose members are gzipped, a 0-byte tar) and
read through the same entry points a user has (`build_index`, `fcp index`, `stream_records`,
the loader). Each test names the behaviour it replaces; each fails on that behaviour.
"""

from __future__ import annotations

import gzip
import io
import json
import shutil
import tarfile
import tracemalloc
import warnings
from pathlib import Path

import numpy as np
import pytest
from sources_helpers import assert_same_batches, epoch_fields, make_loader, train_bpe, write_tar

from fcp.cli import main
from fcp_data.loader.global_batch import SampleReadError
from fcp_data.readers import LengthIndex, build_index
from fcp_data.readers.cache import ShardCache
from fcp_data.readers.errors import EmptyIndexError, TooManyFailures
from fcp_data.readers.scan import ScanConfig
from fcp_data.readers.sources import UnreadableSourceError
from fcp_data.readers.stream import SkippedSamplesWarning, stream_records
from fcp_data.readers.token_store import MAX_TOKEN_ID

MIB = 1 << 20
LINES = [json.dumps({"text": f"line {i}: " + "some words " * (i % 7 + 1)}) for i in range(4000)]


def _jsonl_bytes(lines: list[str]) -> bytes:
    return "".join(x + "\n" for x in lines).encode()


def _texts(index: LengthIndex) -> list[str]:
    return [json.loads(index.read(i)["json"])["text"] for i in range(len(index))]


# ---- compressed JSON Lines -----------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["gz", "zst"])
def test_a_compressed_jsonl_cut_in_half_is_a_counted_cut(tmp_path: Path, fmt: str) -> None:
    """Was (.zst): 1,548 of 4,000 lines indexed and one "malformed line" skip for the torn
    last line; the cut itself was never said. Now: the whole lines before the cut, and one
    `(shard)` skip that says the file is cut (as .gz did)."""
    raw = _jsonl_bytes(LINES * 10)  # 1.1 MB: several 128 KiB zstd blocks before the cut
    if fmt == "zst":
        zstandard = pytest.importorskip("zstandard")
        packed = zstandard.ZstdCompressor().compress(raw)
    else:
        packed = gzip.compress(raw)
    path = tmp_path / f"cut.jsonl.{fmt}"
    path.write_bytes(packed[: len(packed) // 2])
    index = build_index(str(path), tmp_path / "i")
    texts = _texts(index)
    assert 0 < len(texts) < 10 * len(LINES)
    assert texts == [json.loads(x)["text"] for x in (LINES * 10)[: len(texts)]]  # whole, in order
    assert [s.key for s in index.skipped] == ["(shard)"]  # no "malformed line" for the torn one
    reason = index.skipped[0].reason
    what = "frame" if fmt == "zst" else "member"
    assert f"the file ends inside a compressed {what}" in reason and "it is cut" in reason


def test_a_gz_line_without_a_newline_stops_at_the_limit(tmp_path: Path) -> None:
    """Was: a .jsonl.gz holding 1.5 GB without a newline grew past 900 MB of memory under
    stream_max_bytes=64 MiB (compressed JSON Lines ignored the limit). Now the limit bounds
    what the file decompresses to: the lines before it are kept and the rest is one counted
    `(shard)` loss. Memory is measured by tracemalloc around the build: a 48 MiB line behind
    three short ones, a 1 MiB limit."""
    path = tmp_path / "long.jsonl.gz"
    with gzip.open(path, "wb", compresslevel=1) as f:
        f.write(_jsonl_bytes(LINES[:3]))
        f.write(b'{"text": "' + b"a" * (48 * MIB))  # never closed by a newline
    config = ScanConfig(stream_max_bytes=MIB)
    tracemalloc.start()
    try:
        index = build_index(str(path), tmp_path / "i", config=config)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 * MIB, peak  # the 48 MiB line was never held (was: all of it, and more)
    assert _texts(index) == [json.loads(x)["text"] for x in LINES[:3]]
    [skip] = index.skipped
    assert skip.key == "(shard)" and f"decompresses to more than {MIB} bytes" in skip.reason


def test_a_compressed_jsonl_stops_at_the_decompressed_limit(tmp_path: Path) -> None:
    """The limit applies after decompression: 1.1 MB of lines behind ~150 KB of gzip, a 1 MiB
    limit: the lines within the first MiB are kept, the rest is one counted loss. The load-time
    copy stops at the end of the last indexed line, not at the file's end."""
    raw = _jsonl_bytes(LINES * 10)
    assert len(raw) > MIB
    path = tmp_path / "big.jsonl.gz"
    path.write_bytes(gzip.compress(raw))
    index = build_index(str(path), tmp_path / "i", config=ScanConfig(stream_max_bytes=MIB))
    kept = len(index)
    assert 0 < kept < 10 * len(LINES)
    assert [s.key for s in index.skipped] == ["(shard)"]
    assert f"decompresses to more than {MIB} bytes" in index.skipped[0].reason
    index.shard_cache = ShardCache(directory=tmp_path / "cache")
    assert (
        json.loads(index.read(kept - 1)["json"])["text"]
        == json.loads(LINES[(kept - 1) % 4000])["text"]
    )
    [copy] = (tmp_path / "cache").glob("*.jsonl")
    members = index.members(kept - 1)["json"]
    assert copy.stat().st_size == members[0] + members[1] <= MIB  # not the whole 3 MiB


def test_a_plain_jsonl_line_past_the_limit_is_a_counted_skip(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_bytes(_jsonl_bytes(LINES[:2]) + b"x" * (2 * MIB) + b"\n" + _jsonl_bytes(LINES[2:4]))
    index = build_index(str(path), tmp_path / "i", config=ScanConfig(stream_max_bytes=MIB))
    assert _texts(index) == [json.loads(x)["text"] for x in LINES[:4]]
    assert [s.key for s in index.skipped] == ["line 3"]  # stepped over, never held whole
    assert f"past the {MIB}-byte limit of one line" in index.skipped[0].reason


# ---- HF save_to_disk metadata --------------------------------------------------------------
def test_a_hf_state_json_naming_a_file_outside_its_folder_is_refused(
    tmp_path: Path, capsys
) -> None:
    """Was: state.json naming ../other/data-*.arrow indexed rows from outside the dataset
    folder, exit 0. Paths inside a dataset's own metadata never leave its folder."""
    datasets = pytest.importorskip("datasets")
    pytest.importorskip("pyarrow")
    ds = datasets.Dataset.from_dict({"text": ["inside one", "inside two"]})
    ds.save_to_disk(str(tmp_path / "mine"))
    other = datasets.Dataset.from_dict({"text": ["someone else's row"]})
    other.save_to_disk(str(tmp_path / "other"))
    [outside] = [p.name for p in (tmp_path / "other").glob("data-*.arrow")]
    state_path = tmp_path / "mine" / "state.json"
    state = json.loads(state_path.read_text())
    for bad in (f"../other/{outside}", str(tmp_path / "other" / outside)):
        state["_data_files"] = [{"filename": bad}]
        state_path.write_text(json.dumps(state))
        with pytest.raises(UnreadableSourceError, match="outside the dataset folder") as err:
            build_index(str(tmp_path / "mine"), tmp_path / "i")
        assert repr(bad) in str(err.value) and not (tmp_path / "i").exists()
        assert main(["index", str(tmp_path / "mine"), "-o", str(tmp_path / "i")]) == 2
        assert "outside the dataset folder" in capsys.readouterr().err


# ---- pre-tokenized ids without a vocabulary ------------------------------------------------
def _npy_tar(path: Path, rows: dict[str, np.ndarray]) -> str:
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as t:
        for key, ids in rows.items():
            buf = io.BytesIO()
            np.save(buf, ids)
            info = tarfile.TarInfo(f"{key}.npy")
            info.size = len(buf.getvalue())
            t.addfile(info, io.BytesIO(buf.getvalue()))
    return str(path)


def test_npy_ids_past_2_31_are_refused_without_a_vocabulary(tmp_path: Path) -> None:
    """Was: with a tokenizer that states no vocabulary (bytes:4), an id of 2^40 passed. Now the
    bound is 2^31 - 1: a counted skip at index time, a bad sample at load time."""
    shard = _npy_tar(
        tmp_path / "ids.tar",
        {
            "ok": np.array([1, 2, MAX_TOKEN_ID], dtype=np.int64),
            "huge": np.array([1, 1 << 40, 3], dtype=np.int64),
            "ok2": np.array([4, 5, 6], dtype=np.int64),
        },
    )
    index = build_index(shard, tmp_path / "i")  # bytes:4: no vocabulary
    assert list(map(str, index.keys)) == ["ok", "ok2"]
    [skip] = index.skipped
    assert skip.key == "huge" and f"{1 << 40} is past {MAX_TOKEN_ID} (2^31 - 1)" in skip.reason
    # load time: the same ids written over "ok2" in place (checksums off, to reach the check)
    index.verify_checksums = False
    off, size = index.members(1)["npy"]
    buf = io.BytesIO()
    np.save(buf, np.array([4, 1 << 40, 6], dtype=np.int64))
    assert len(buf.getvalue()) == size
    with open(shard, "r+b") as f:
        f.seek(off)
        f.write(buf.getvalue())

    def ids_of(text: str) -> list[int]:
        return [1] * max(1, -(-len(text.encode()) // 4))

    ids_of.spec = "bytes:4"  # type: ignore[attr-defined]
    ld = make_loader(index, ids_of, n=1, gbs=2)
    with pytest.raises(SampleReadError, match=r"'ok2'.*past 2147483647 \(2\^31 - 1\)"):
        list(ld)


# ---- empty results are never success -------------------------------------------------------
def test_fcp_index_with_no_sample_exits_2_and_writes_nothing(tmp_path: Path, capsys) -> None:
    """Was: exit 0 with an index of 0 samples, for a tar whose few samples were all skipped
    (fewer than the consecutive-failure stop) and for a 0-byte tar."""
    few = write_tar(tmp_path / "few.tar", [{"json": {"body": "x"}}, {"json": {"body": "y"}}])
    empty = tmp_path / "zero.tar"
    empty.write_bytes(b"")
    for shard, says in ((few, "'s00000': .json has no string field 'text'"), (empty, "empty")):
        out = tmp_path / f"i-{Path(shard).stem}"
        assert main(["index", str(shard), "-o", str(out)]) == 2
        [err] = [x for x in capsys.readouterr().err.splitlines() if "error" in x]
        assert "no sample to index in" in err
        assert says in err and "No index was written" in err, err
        assert not out.exists()
        with pytest.raises(EmptyIndexError):
            build_index(str(shard), out)
    assert len(build_index(few, tmp_path / "ok", allow_empty=True)) == 0  # asked for: written


def test_stream_records_without_a_skipped_list_is_never_silent(tmp_path: Path) -> None:
    """Was: `stream_records(path)`, as its docstring shows it, returned nothing and said
    nothing when every sample was skipped."""
    few = write_tar(tmp_path / "few.tar", [{"json": {"body": "x"}}, {"json": {"body": "y"}}])
    with pytest.raises(EmptyIndexError, match=r"all 2 skipped .*'s00000'"):
        list(stream_records(few))
    mixed = write_tar(tmp_path / "mixed.tar", [{"txt": "words"}, {"json": {"body": "y"}}])
    with pytest.warns(SkippedSamplesWarning, match=r"skipped 1 sample\(s\) .*'s00001'"):
        assert [r.key for r in stream_records(mixed)] == ["s00000"]
    held: list = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # given a list, the caller holds the skips: no warning
        assert [r.key for r in stream_records(mixed, skipped=held)] == ["s00000"]
    assert [s.key for s in held] == ["s00001"]


# ---- what WebDataset users expect ----------------------------------------------------------
def _gz_tar(path: Path, samples: list[dict[str, bytes]]) -> str:
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as t:
        for i, sample in enumerate(samples):
            for ext, data in sample.items():
                info = tarfile.TarInfo(f"s{i:05d}.{ext}")
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    return str(path)


def test_gzipped_members_read_as_webdataset_decodes_them(tmp_path: Path) -> None:
    """Was: `.txt.gz` / `.json.gz` members, which webdataset's decoder gunzips, were skipped as
    "no text". Now they count and load exactly as the plain tar does (same token counts, same
    micro-batches); webdataset reads the same tar as the oracle."""
    import webdataset as wds

    texts = [("import os\n" * (3 + i)) + f"x = {i}\n" for i in range(12)]
    bpe = str(train_bpe(tmp_path / "bpe.json", texts))
    plain = write_tar(
        tmp_path / "plain.tar",
        [{"txt": t} if i % 2 else {"json": {"text": t}} for i, t in enumerate(texts)],
    )
    zipped = _gz_tar(
        tmp_path / "zipped.tar",
        [
            {"txt.gz": gzip.compress(t.encode())}
            if i % 2
            else {"json.gz": gzip.compress(json.dumps({"text": t}).encode())}
            for i, t in enumerate(texts)
        ],
    )
    oracle = [
        s.get("txt.gz") or s["json.gz"]["text"]
        for s in wds.WebDataset(zipped, shardshuffle=False).decode()
    ]
    assert oracle == texts  # webdataset gunzips them (keeping the .gz in the key)
    config = ScanConfig(tokenizer=bpe)
    a = build_index(plain, tmp_path / "a", config=config)
    b = build_index(zipped, tmp_path / "b", config=config)
    assert b.skipped == [] and len(b) == len(texts)
    np.testing.assert_array_equal(a.seqlens, b.seqlens)
    assert sorted(b.members(1)) == ["txt.gz"]  # stored as written: offsets and crc32 of it
    assert b.read(1)["txt"] == texts[1].encode()
    assert_same_batches(epoch_fields(make_loader(a, bpe)), epoch_fields(make_loader(b, bpe)))


def test_a_gzipped_member_that_is_damaged_or_a_bomb_is_one_bad_sample(tmp_path: Path) -> None:
    bomb = gzip.compress(b"a" * (3 * MIB))  # 3 KB that gunzips to 3 MiB, past a 1 MiB limit
    good = gzip.compress(b"plain words here")
    shard = _gz_tar(
        tmp_path / "bad.tar",
        [
            {"txt.gz": good},
            {"txt.gz": bomb},
            {"txt.gz": good[: len(good) // 2]},
            {"txt.gz": b"not gzip at all"},
            {"txt.gz": good, "txt": b"the same text twice"},
            {"txt.gz": good},
        ],
    )
    index = build_index(shard, tmp_path / "i", config=ScanConfig(stream_max_bytes=MIB))
    assert list(map(str, index.keys)) == ["s00000", "s00005"]
    why = {s.key: s.reason for s in index.skipped}
    assert f"gunzips to more than {MIB} bytes" in why["s00001"]
    assert "is cut" in why["s00002"] and "does not gunzip" in why["s00003"]
    assert "both .txt and .txt.gz" in why["s00004"]


def test_samples_with_nothing_to_count_are_told_so(tmp_path: Path, capsys) -> None:
    """Was: "this is a configuration problem ... fix the setup", which no setting fixes when
    the shards hold members fcp does not count."""
    shard = write_tar(tmp_path / "cls.tar", [{"cls": b"%d" % i, "wav": b"RIFF"} for i in range(9)])
    with pytest.raises(TooManyFailures) as err:
        build_index(shard, tmp_path / "i")
    msg = str(err.value)
    assert "hold samples with no member fcp can count" in msg and ".txt.gz" in msg
    assert "fix the setup" not in msg and "configuration problem" not in msg
    assert main(["index", shard, "-o", str(tmp_path / "i")]) == 2
    assert "no member fcp can count" in capsys.readouterr().err


def test_a_hf_folder_of_links_into_a_cache_still_reads(tmp_path: Path) -> None:
    """The folder check reads the names in state.json, not where links point: a dataset whose
    data file is a link elsewhere (a cache) still reads."""
    datasets = pytest.importorskip("datasets")
    pytest.importorskip("pyarrow")
    datasets.Dataset.from_dict({"text": ["linked row"]}).save_to_disk(str(tmp_path / "d"))
    [arrow] = list((tmp_path / "d").glob("data-*.arrow"))
    (tmp_path / "blobs").mkdir()
    shutil.move(arrow, tmp_path / "blobs" / "blob")
    arrow.symlink_to(tmp_path / "blobs" / "blob")
    index = build_index(str(tmp_path / "d"), tmp_path / "i")
    assert index.read(0)["txt"] == b"linked row"


def test_a_flipped_key_that_spells_the_next_sample_is_not_trusted(tmp_path: Path) -> None:
    """Found by the fuzzer (tests/fuzz/corpus/tar): one bit flipped in the name of s00002.txt
    spells s00003.txt; the first member of s00003 "confirmed" the name, so the loss was pinned
    on s00003 and s00002 passed on as whole without its .txt. s00003 holds its own .txt, which
    proves the name wrong: the region and both neighbours are reported instead."""
    path = tmp_path / "u.tar"
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as t:
        for i in range(6):
            for ext, data in (("cls", b"%d" % i), ("txt", b"text of sample %d " % i * 9)):
                info = tarfile.TarInfo(f"s{i:05d}.{ext}")
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    data = bytearray(path.read_bytes())
    with tarfile.open(path) as tf:
        [member] = [m for m in tf.getmembers() if m.name == "s00002.txt"]
    data[member.offset + 5] ^= 0x01  # "s00002.txt" -> "s00003.txt": its checksum now fails
    path.write_bytes(bytes(data))
    from fcp_data.readers.shards import BadMember, RawSample, iter_raw_samples

    out = list(iter_raw_samples(str(path), lambda _e: True))
    got = {r.key: r for r in out if isinstance(r, RawSample)}
    bad = {r.key: r.reason for r in out if isinstance(r, BadMember)}
    assert sorted(got) == ["s00000", "s00001", "s00004", "s00005"]  # was: s00002 without .txt
    assert "precedes damaged tar" in bad["s00002"] and "follows damaged tar" in bad["s00003"]
    assert any(k.startswith("(bytes ") for k in bad)
