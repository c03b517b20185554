"""Verified bytes: every range answer is checked against its request, every member read against
the crc32 the index recorded, and no read waits unbounded. Real servers on 127.0.0.1 (an
http.server with fault switches, moto's S3), real files edited in place, a real loader."""

from __future__ import annotations

import os
import shutil
import warnings
import zlib
from pathlib import Path

import numpy as np
import pytest
from servers import RangeServer

from fcp_data.errors import DataError, StaleIndexError
from fcp_data.loader import FCPDataLoader, LoaderOptions
from fcp_data.loader.global_batch import SampleReadError
from fcp_data.planner import Cluster
from fcp_data.readers import LengthIndex, build_index
from fcp_data.readers.index_format import CHECKSUM_ARRAY, ChecksumMismatchError
from fcp_data.readers.remote import RangeAnswerError, RemoteOptions
from fcp_data.readers.text import load_counter

FAST = RemoteOptions(retries=2, backoff_s=0.01, stall_timeout_s=5.0)


@pytest.fixture()
def served(tmp_path: Path, text_shards):
    root = tmp_path / "www"
    root.mkdir()
    for s in text_shards[:3]:
        shutil.copy(s, root / Path(s).name)
    with RangeServer(root) as srv:
        yield srv, [f"{srv.url}/{Path(s).name}" for s in text_shards[:3]]


def _index(urls, out: Path, bpe_file: Path) -> LengthIndex:
    index = build_index(urls, out, counter=load_counter(str(bpe_file)))
    index.remote = FAST
    return index


def _flip_in_place(path: Path, at: int) -> None:
    """One byte changed, same size; mtime put back so even an mtime-based ETag stays."""
    st = path.stat()
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x20]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _text_member(index: LengthIndex, i: int) -> tuple[str, int, int]:
    ext, (off, size) = next(iter(index.members(i).items()))
    return ext, off, size


def test_the_index_records_each_members_crc32(tmp_path, text_shards, bpe_file) -> None:
    index = _index(text_shards[:2], tmp_path / "idx", bpe_file)
    crc = np.load(index.path / f"{CHECKSUM_ARRAY}.npy")
    assert crc.dtype == np.uint32 and crc.shape == index.arrays["member_offset"].shape
    for i in (0, 7, len(index) - 1):
        for j, (ext, (off, size)) in enumerate(index.members(i).items()):
            with open(index.shard_url(i), "rb") as f:
                f.seek(off)
                want = zlib.crc32(f.read(size))
            assert int(crc[int(index.arrays["member_start"][i]) + j]) == want, ext


def _text_loader(index, bpe_file, on_error: str) -> FCPDataLoader:
    return FCPDataLoader(
        index,
        cluster=Cluster(1, tokens_per_replica=1 << 15),
        replica=0,
        cost=_cost(),
        global_batch_size=16,
        num_workers=0,
        tokenizer=str(bpe_file),
        options=LoaderOptions(on_error=on_error),
    )


def _cost():
    from fcp_data.planner import CostModel

    return CostModel.from_model("qwen3-1.7b", "cpu")


def test_a_local_shard_edited_in_place_is_named_or_skipped(tmp_path, text_shards, bpe_file):
    shard = tmp_path / "s0.tar"
    shutil.copy(text_shards[0], shard)
    index = _index([str(shard)], tmp_path / "idx", bpe_file)
    skip, stop = _text_loader(index, bpe_file, "skip"), _text_loader(index, bpe_file, "raise")
    ext, off, size = _text_member(index, 3)
    # same size, mid-run (the shard was checked when the index opened): one byte of sample 3
    _flip_in_place(shard, off + size // 2)
    with pytest.raises(ChecksumMismatchError, match=str(index.keys[3])) as err:
        index.read(3)
    assert str(shard) in str(err.value) and f".{ext}" in str(err.value)
    assert index.read(2) and index.read(4)  # neighbours are untouched
    # the loader: "skip" counts exactly that sample, "raise" names it
    skipped = [s for mb in skip for s in mb.skipped]
    assert [k for k, _ in skipped] == [str(index.keys[3])]
    assert "crc32" in skipped[0][1]
    with pytest.raises(SampleReadError, match="crc32"):
        list(stop)


def test_verification_can_be_turned_off_and_travels_to_workers(tmp_path, text_shards, bpe_file):
    import pickle

    index = _index(text_shards[:1], tmp_path / "idx", bpe_file)
    index.verify_checksums = False
    assert pickle.loads(pickle.dumps(index)).verify_checksums is False
    assert pickle.loads(pickle.dumps(LengthIndex.open(index.path))).verify_checksums is True


def test_an_old_index_without_checksums_loads_and_says_so(tmp_path, text_shards, bpe_file):
    index = _index(text_shards[:1], tmp_path / "idx", bpe_file)
    (index.path / f"{CHECKSUM_ARRAY}.npy").unlink()
    with pytest.warns(UserWarning, match="not verified"):
        old = LengthIndex.open(index.path)
    assert old.read(0) == index.read(0)
    (index.path / f"{CHECKSUM_ARRAY}.npy").write_bytes(b"\x93NUMPY garbage")
    from fcp_data.errors import IndexMismatchError

    with pytest.raises(IndexMismatchError, match=CHECKSUM_ARRAY):
        LengthIndex.open(index.path)


def test_a_lying_content_range_is_refused(served, tmp_path, bpe_file) -> None:
    srv, urls = served
    index = _index(urls, tmp_path / "idx", bpe_file)
    srv.shift = 7  # other bytes, and the Content-Range says so: refused at the header
    with pytest.raises(RangeAnswerError, match="Content-Range") as err:
        index.read(2)
    assert urls[0] in str(err.value) and "asked for bytes" in str(err.value)
    srv.lie = True  # other bytes under the asked range's header: the crc32 catches them
    fresh = LengthIndex.open(index.path)
    fresh.remote = FAST
    with pytest.raises(ChecksumMismatchError, match=str(index.keys[2])):
        fresh.read(2)
    srv.shift, srv.lie = 0, False
    assert fresh.read(2)


def test_a_server_that_ignores_range_is_named_as_such(served, tmp_path, bpe_file) -> None:
    srv, urls = served
    index = _index(urls, tmp_path / "idx", bpe_file)
    srv.ignore_range = True
    srv.requests.clear()
    with pytest.raises(RangeAnswerError, match="server ignores Range requests") as err:
        index.read(1)
    assert "shorter" not in str(err.value) and urls[0] in str(err.value)
    assert len([q for q in srv.requests if q[0] == "GET"]) == 1  # not retried
    with pytest.raises(RangeAnswerError, match="ignores Range"):  # index time too
        _index(urls[:1], tmp_path / "idx2", bpe_file)


def test_an_in_place_edit_without_etags_is_caught(served, tmp_path, bpe_file) -> None:
    srv, urls = served
    srv.etags = False
    index = _index(urls, tmp_path / "idx", bpe_file)
    assert all(e.fingerprint.endswith("etag=") for e in index.header.shards)
    _, off, _ = _text_member(index, 5)
    _flip_in_place(srv.root / Path(urls[0]).name, off + 1)
    fresh = LengthIndex.open(index.path)
    fresh.remote = FAST
    with pytest.raises(ChecksumMismatchError, match=str(index.keys[5])):
        fresh.read(5)
    assert fresh.read(6)


def test_a_stalled_body_is_bounded(served, tmp_path, bpe_file, cost) -> None:
    srv, urls = served
    index = _index(urls, tmp_path / "idx", bpe_file)
    srv.stall_s = 4.0
    fresh = LengthIndex.open(index.path)
    fresh.remote = RemoteOptions(retries=1, backoff_s=0.01, stall_timeout_s=0.5)
    # each attempt ends at the 0.5 s read timeout (a wait for the 4 s stall ends in a cut body)
    with pytest.raises(DataError, match=r"still failing after 1 retries \(\w*Timeout\w*:"):
        fresh.read(0)
    # num_workers=0 with a long stall limit: the sample time limit bounds it, prefetch too
    ld = FCPDataLoader(
        index.path,
        cluster=Cluster(1, tokens_per_replica=1 << 15),
        replica=0,
        cost=cost,
        global_batch_size=4,
        num_workers=0,
        tokenizer=str(bpe_file),
        options=LoaderOptions(
            sample_timeout_s=1.0,
            remote=RemoteOptions(retries=0, stall_timeout_s=30.0),
        ),
    )
    # prefetch and read each bounded by 1 s, not 30 s: a 4 s wait would fail as a cut body
    with pytest.raises(SampleReadError, match=r"did not finish within sample_timeout_s=1 s"):
        next(iter(ld))
    srv.stall_s = 0.0


def test_index_time_streams_respect_the_stream_timeout(served, tmp_path, bpe_file) -> None:
    from fcp_data.readers import ScanConfig

    srv, urls = served
    srv.stall_s = 5.0
    # each attempt ends at the 0.5 s stream timeout (a wait for the 5 s stall: a cut body)
    with pytest.raises(DataError, match=r"still failing after \d+ retries \(\w*Timeout\w*:"):
        build_index(
            urls[:1],
            tmp_path / "idx",
            config=ScanConfig(stream_timeout_s=0.5),
            counter=load_counter(str(bpe_file)),
        )


def test_an_s3_object_overwritten_mid_epoch_is_caught(
    monkeypatch, tmp_path, text_shards, bpe_file
) -> None:
    from moto.server import ThreadedMotoServer

    srv = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    srv.start()
    try:
        host, port = srv.get_host_and_port()
        for k, v in {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": f"http://{host}:{port}",
        }.items():
            monkeypatch.setenv(k, v)
        import boto3
        import fsspec

        client = boto3.client("s3", endpoint_url=f"http://{host}:{port}")
        client.create_bucket(Bucket="corpus")
        client.upload_file(text_shards[0], "corpus", "t/s0.tar")
        fsspec.filesystem("s3").clear_instance_cache()
        index = _index(["s3://corpus/t/s0.tar"], tmp_path / "idx", bpe_file)
        assert index.read(0)  # the process has checked the shard's ETag once
        body = bytearray(Path(text_shards[0]).read_bytes())
        _, off, _ = _text_member(index, 4)
        body[off] ^= 0x20  # same size, other bytes: a new ETag
        client.put_object(Bucket="corpus", Key="t/s0.tar", Body=bytes(body))
        with pytest.raises(StaleIndexError, match="ETag") as err:
            index.read(4)
        assert "s3://corpus/t/s0.tar" in str(err.value)
    finally:
        srv.stop()


def test_warning_for_old_indexes_is_once_per_process(tmp_path, text_shards, bpe_file) -> None:
    index = _index(text_shards[:1], tmp_path / "idx", bpe_file)
    (index.path / f"{CHECKSUM_ARRAY}.npy").unlink()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("default")
        for _ in range(3):
            LengthIndex.open(index.path)
    assert len([w for w in seen if "not verified" in str(w.message)]) == 1
