"""pipe: shards and FIFOs that fail: exit status, cuts, silence; compressed shards.

Real commands run through `sh`, real FIFOs are made with os.mkfifo; limits are short so a
hang shows up as a slow test, never as a stuck suite.
"""

from __future__ import annotations

import gzip
import io
import os
import pickle
import shlex
import tarfile
import threading
from pathlib import Path

import pytest
import webdataset as wds
from webdataset import TarWriter

from fcp.cli import main
from fcp_data.errors import ConfigError, DataError, SampleError
from fcp_data.readers.build import build_index
from fcp_data.readers.cache import ShardCache
from fcp_data.readers.errors import CompressedShardError
from fcp_data.readers.length_index import LengthIndex
from fcp_data.readers.scan import ScanConfig
from fcp_data.readers.shards import expand_shards
from fcp_data.readers.stream import stream_records

QUICK = ScanConfig(stream_timeout_s=0.5)
QUICK_02 = ScanConfig(stream_timeout_s=0.2)


@pytest.fixture(scope="module")
def shard(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pipes") / "s.tar"
    with TarWriter(str(path)) as w:
        for i in range(6):
            w.write({"__key__": f"k{i}", "txt": b"some words here " * (20 + i)})
    return path


def _run(spec: str, config: ScanConfig = QUICK) -> tuple[list[str], list]:
    skipped: list = []
    keys = [r.key for r in stream_records(spec, config=config, skipped=skipped)]
    return keys, skipped


def _member(path: Path, k: int) -> tarfile.TarInfo:
    with tarfile.open(path) as tf:
        return tf.getmembers()[k]


def test_pipe_cat_reads_everything(shard: Path) -> None:
    keys, skipped = _run(f"pipe:cat {shlex.quote(str(shard))}")
    assert keys == [f"k{i}" for i in range(6)] and skipped == []


def test_nonzero_exit_after_a_whole_tar_is_a_counted_loss(shard: Path, tmp_path: Path) -> None:
    spec = f"pipe:sh -c 'cat {shlex.quote(str(shard))}; exit 3'"
    keys, skipped = _run(spec)
    assert keys == [f"k{i}" for i in range(6)]  # the tar itself was whole
    assert [s.key for s in skipped] == ["(shard)"]
    assert "exited with status 3" in skipped[0].reason and skipped[0].shard == spec
    idx = build_index(spec, tmp_path / "idx", config=QUICK)
    assert len(idx) == 6 and "status 3" in idx.skipped[0].reason
    with pytest.raises(SampleError, match="exited with status 3"):
        _run(spec, ScanConfig(on_error="raise"))


def test_a_failing_command_with_no_output_is_named(tmp_path: Path) -> None:
    spec = f"pipe:cat {tmp_path / 'missing.tar'} 2>/dev/null"
    keys, skipped = _run(spec)
    assert keys == [] and [s.key for s in skipped] == ["(bytes 0..end)", "(shard)"]
    assert "empty" in skipped[0].reason and "exited with status 1" in skipped[1].reason


def test_stream_cut_inside_a_member_is_a_skip_not_a_read_error(shard: Path) -> None:
    k3 = _member(shard, 3)
    cut = k3.offset_data + 40  # inside k3's text
    spec = f"pipe:sh -c 'head -c {cut} {shlex.quote(str(shard))}; exit 3'"
    keys, skipped = _run(spec)
    assert keys == ["k0", "k1", "k2"]  # k3's header held: k2 before it is whole (was lost)
    reasons = {s.key: s.reason for s in skipped}
    assert list(reasons) == [f"(bytes {k3.offset}..end)", "k3", "(shard)"]
    assert f"cut inside member 'k3.txt' at byte {cut}" in reasons[f"(bytes {k3.offset}..end)"]
    assert "member 'k3.txt' is lost" in reasons["k3"]
    assert "exited with status 3" in reasons["(shard)"]
    # the same cut with a clean exit status is still a cut, not a clean end
    keys, skipped = _run(f"pipe:head -c {cut} {shlex.quote(str(shard))}")
    assert keys == ["k0", "k1", "k2"] and any("cut inside member" in s.reason for s in skipped)


def test_silent_pipe_is_bounded_by_the_stream_timeout(shard: Path, tmp_path: Path) -> None:
    k3 = _member(shard, 3)
    cut = k3.offset_data + 40  # the command sends part of k3, then goes quiet
    done = tmp_path / "done"  # written only if the command outlives its sleep: not killed
    quiet = f"head -c {cut} {shlex.quote(str(shard))}; sleep 30; touch {done}"
    keys, skipped = _run(f"pipe:sh -c '{quiet}'")
    assert not done.exists()  # killed at the timeout, not waited for
    assert keys == ["k0", "k1", "k2"]  # stalled inside k3's data: k2 is whole (was lost)
    assert [s.key for s in skipped] == [f"(bytes {k3.offset}..end)", "k3"]
    assert f"no data for 0.5 s after byte {cut}" in skipped[0].reason
    spec = f"pipe:sleep 30; touch {done}"
    keys, skipped = _run(spec, ScanConfig(stream_timeout_s=0.3))
    assert not done.exists()  # killed, not waited for
    assert keys == [] and len(skipped) == 1
    assert "no data for 0.3 s" in skipped[0].reason
    assert "stream_timeout_s" in skipped[0].reason and skipped[0].shard == spec
    with pytest.raises(SampleError, match=r"no data for 0\.3 s"):
        _run("pipe:sleep 30", ScanConfig(stream_timeout_s=0.3, on_error="raise"))


def test_fifo_without_a_writer_times_out(tmp_path: Path) -> None:
    fifo = tmp_path / "never.tar"
    os.mkfifo(fifo)
    keys, skipped = _run(str(fifo), ScanConfig(stream_timeout_s=0.3))  # no writer: the limit
    assert keys == [] and "no data for 0.3 s" in skipped[0].reason
    assert "FIFO" in skipped[0].reason and skipped[0].shard == str(fifo)


def test_fifo_with_a_writer_streams(shard: Path, tmp_path: Path) -> None:
    fifo = tmp_path / "live.tar"
    os.mkfifo(fifo)

    def feed() -> None:
        with open(fifo, "wb") as f:
            f.write(shard.read_bytes())

    writer = threading.Thread(target=feed)
    writer.start()
    try:
        records = list(stream_records(str(fifo), config=ScanConfig(stream_timeout_s=20)))
    finally:
        writer.join(timeout=20)
    assert [r.key for r in records] == [f"k{i}" for i in range(6)]
    assert records[0].payload is not None  # a FIFO cannot be re-read: members kept


def test_garbage_header_in_a_pipe_resyncs(shard: Path, tmp_path: Path) -> None:
    data = bytearray(shard.read_bytes())
    with tarfile.open(shard) as tf:
        head = tf.getmembers()[2].offset  # k2's header chain
    data[head : head + 512] = bytes(range(256)) * 2
    bad = tmp_path / "bad.tar"
    bad.write_bytes(bytes(data))
    keys, skipped = _run(f"pipe:cat {shlex.quote(str(bad))}")
    assert keys == ["k0", "k3", "k4", "k5"]  # k1 and k2 border the damage
    assert {s.key for s in skipped} == {"k1", "k2", f"(bytes {head}..{head + 1024})"}


def test_duplicate_member_names_raise_or_skip_as_webdataset(tmp_path: Path) -> None:
    path = tmp_path / "dup.tar"
    with tarfile.open(path, "w") as tf:
        for name, data in (("a.txt", b"first one"), ("b.txt", b"one"), ("b.txt", b"two")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        info = tarfile.TarInfo("c.txt")
        info.size = 5
        tf.addfile(info, io.BytesIO(b"third"))
    with pytest.raises(ValueError, match="duplicate file name"):  # the oracle
        list(wds.WebDataset(str(path), shardshuffle=False))
    with pytest.raises(SampleError, match=r"'b'.*duplicate member 'b\.txt'"):
        _run(str(path), ScanConfig(on_error="raise"))
    keys, skipped = _run(str(path))
    assert keys == ["a", "c"]  # neither b.txt is trusted; the neighbours are untouched
    assert [s.key for s in skipped] == ["b"] and "duplicate" in skipped[0].reason


def test_compressed_shards_are_refused_with_the_reason(shard: Path, tmp_path: Path) -> None:
    tgz = tmp_path / "s.tar.gz"
    tgz.write_bytes(gzip.compress(shard.read_bytes()))
    oracle = [s["__key__"] for s in wds.WebDataset(str(tgz), shardshuffle=False)]
    assert oracle == [f"k{i}" for i in range(6)]  # webdataset streams it
    for spec in (str(tgz), str(tmp_path / "*.gz")):
        with pytest.raises(CompressedShardError, match="a compressed stream does not allow"):
            expand_shards(spec)
    disguised = tmp_path / "plain-name.tar"  # gzip bytes under a .tar name: found by magic
    disguised.write_bytes(tgz.read_bytes())
    with pytest.raises(DataError, match=r"gzip-compressed shard.*seeking to its byte offset"):
        build_index(str(disguised), tmp_path / "idx")
    with pytest.raises(CompressedShardError, match=r"pipe:gzip -dc") as info:
        _run(f"pipe:cat {shlex.quote(str(tgz))}")
    again = pickle.loads(pickle.dumps(info.value))  # crosses the index build's process pool
    assert str(again) == str(info.value) and again.fmt == "gzip"
    keys, skipped = _run(f"pipe:gzip -dc {shlex.quote(str(tgz))}")  # the suggested route
    assert keys == oracle and skipped == []
    # the words are true (they said "stream it without an index"): such a shard is indexed,
    # and read through the shard cache once the index is opened with allow_pipe=True
    msg = str(info.value)
    assert "without an index" not in msg
    assert "index it as 'pipe:gzip -dc SHARD'" in msg and "allow_pipe=True" in msg
    assert "decompresses it whole into the shard cache" in msg
    spec = f"pipe:gzip -dc {shlex.quote(str(tgz))}"
    build_index(spec, tmp_path / "i-pipe", config=QUICK)
    with pytest.raises(ConfigError, match="allow_pipe=True"):
        LengthIndex.open(tmp_path / "i-pipe").read(0)
    piped = LengthIndex.open(tmp_path / "i-pipe", allow_pipe=True)
    piped.shard_cache = ShardCache(directory=tmp_path / "cache")
    plain = build_index(str(shard), tmp_path / "i-plain", config=QUICK)
    assert [piped.read(i) for i in range(len(piped))] == [plain.read(i) for i in range(6)]
    assert len(list((tmp_path / "cache").glob("*.tar"))) == 1  # decompressed once, whole


def test_stream_timeout_must_be_positive(shard: Path) -> None:
    with pytest.raises(ValueError, match="stream_timeout_s=0"):
        _run(str(shard), ScanConfig(stream_timeout_s=0))


def test_cli_stream_timeout_reaches_the_scan(tmp_path: Path, capsys) -> None:
    args = ["index", "pipe:sleep 30", "-o", str(tmp_path / "i"), "--stream-timeout", "0.2"]
    assert main(args) == 2  # no sample: never an index and exit 0
    assert "no data for 0.2 s" in capsys.readouterr().err
    idx = build_index("pipe:sleep 30", tmp_path / "i", config=QUICK_02, allow_empty=True)
    assert idx.header.scan.stream_timeout_s == 0.2
    assert "no data for 0.2 s" in idx.skipped[0].reason
