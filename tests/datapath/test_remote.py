"""Remote shards over real loopback servers: HTTP with Range (a threading http.server) and S3
(moto's server mode). Oracles: the same shards indexed and loaded from local disk."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from datapath_helpers import fields, loader
from servers import RangeServer

from fcp_data.errors import DataError, MissingDependencyError, StaleIndexError
from fcp_data.loader import LoaderOptions
from fcp_data.readers import LengthIndex, build_index
from fcp_data.readers.remote import RemoteAccessError, RemoteOptions
from fcp_data.readers.text import load_counter

FAST = RemoteOptions(retries=4, backoff_s=0.01)


@pytest.fixture()
def served(tmp_path: Path, text_shards):
    root = tmp_path / "www"
    root.mkdir()
    for s in text_shards:
        shutil.copy(s, root / Path(s).name)
    with RangeServer(root) as srv:
        yield srv, [f"{srv.url}/{Path(s).name}" for s in text_shards]


@pytest.fixture(scope="module")
def local_index(tmp_path_factory, text_shards, bpe_file) -> LengthIndex:
    out = tmp_path_factory.mktemp("dp-local") / "index"
    return build_index(text_shards, out, counter=load_counter(str(bpe_file)))


def _remote_loader(index, n, r, cost, bpe_file, cap, remote=FAST):
    ld = loader(index, n, r, cost, store=False, tokenizer=str(bpe_file), cap=cap)
    ld.source.remote = remote
    return ld


def test_http_index_and_ranged_loads_equal_local(served, local_index, bpe_file, tmp_path, cost):
    srv, urls = served
    index = build_index(urls, tmp_path / "idx", counter=load_counter(str(bpe_file)))
    np.testing.assert_array_equal(index.keys, local_index.keys)
    np.testing.assert_array_equal(index.seqlens, local_index.seqlens)
    assert all(e.fingerprint.startswith("remote:size=") for e in index.header.shards)
    assert index.shard_urls == urls
    srv.requests.clear()
    cap = int(index.seqlens.max()) // 2 + 64
    for r in range(2):
        want = [
            fields(mb)
            for mb in loader(local_index, 2, r, cost, store=False, tokenizer=str(bpe_file), cap=cap)
        ]
        got = [fields(mb) for mb in _remote_loader(index.path, 2, r, cost, bpe_file, cap)]
        assert len(want) == len(got)
        for a, b in zip(want, got):
            for k in a:
                np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    gets = [q for q in srv.requests if q[0] == "GET"]
    assert gets and all(q[2] and q[2].startswith("bytes=") for q in gets)  # ranges only
    assert len(srv.peers) < len(srv.requests)  # keep-alive connections were reused


def test_500s_and_cut_responses_are_retried(served, bpe_file, tmp_path, local_index) -> None:
    srv, urls = served
    index = build_index(urls, tmp_path / "idx", counter=load_counter(str(bpe_file)))
    index.remote = FAST
    srv.fail_next, srv.cut_next = 2, 2
    for i in (0, 5, 17):
        assert index.read(i) == local_index.read(i)
    assert srv.fail_next == 0 and srv.cut_next == 0  # the faults really happened
    srv.fail_next = 100  # a server that stays down: a DataError naming the URL, not a hang
    fresh = LengthIndex.open(index.path)
    fresh.remote = RemoteOptions(retries=2, backoff_s=0.01)
    with pytest.raises(DataError, match=r"still failing after 2 retries") as err:
        fresh.read(30)
    assert fresh.shard_url(30) in str(err.value)


def test_client_errors_name_the_url_without_retrying(served, bpe_file, tmp_path) -> None:
    srv, urls = served
    index = build_index(urls, tmp_path / "idx", counter=load_counter(str(bpe_file)))
    index.remote = FAST
    srv.status = 403
    srv.requests.clear()
    with pytest.raises(RemoteAccessError, match="access denied") as err:
        index.read(0)
    # one info call (fsspec tries HEAD, then GET), no retries
    assert urls[0] in str(err.value) and [q[0] for q in srv.requests] == ["HEAD", "GET"]
    srv.status = None
    (srv.root / Path(urls[1]).name).unlink()
    with pytest.raises(RemoteAccessError, match="not found"):
        index.read(int(np.flatnonzero(index.shard == 1)[0]))


def test_a_shard_replaced_on_the_server_is_stale(served, bpe_file, tmp_path, text_shards):
    srv, urls = served
    index = build_index(urls, tmp_path / "idx", counter=load_counter(str(bpe_file)))
    index.remote = FAST
    shutil.copy(text_shards[2], srv.root / Path(urls[0]).name)  # same name, other bytes
    with pytest.raises(StaleIndexError, match="changed since indexing") as err:
        index.read(0)
    assert urls[0] in str(err.value)


def test_a_scheme_without_its_package_says_what_to_install(tmp_path) -> None:
    # gcsfs is not installed in the test environment: the real case, not a simulated one
    with pytest.raises(MissingDependencyError, match="gcsfs"):
        build_index(["gs://bucket/shard-000.tar"], tmp_path / "x")


@pytest.fixture()
def s3(monkeypatch, text_shards):
    from moto.server import ThreadedMotoServer

    srv = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    srv.start()
    host, port = srv.get_host_and_port()
    for k, v in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
    }.items():
        monkeypatch.setenv(k, v)
    import boto3

    client = boto3.client("s3", endpoint_url=f"http://{host}:{port}")
    client.create_bucket(Bucket="corpus")
    for s in text_shards:
        client.upload_file(s, "corpus", f"text/{Path(s).name}")
    import fsspec

    fsspec.filesystem("s3").clear_instance_cache()
    yield client, [f"s3://corpus/text/{Path(s).name}" for s in text_shards]
    srv.stop()


def test_s3_shards_index_and_load_like_local(s3, local_index, bpe_file, tmp_path, cost) -> None:
    client, urls = s3
    index = build_index(urls, tmp_path / "idx", counter=load_counter(str(bpe_file)))
    np.testing.assert_array_equal(index.seqlens, local_index.seqlens)
    assert all("etag=" in e.fingerprint and len(e.fingerprint) > 30 for e in index.header.shards)
    for i in range(0, len(index), 7):
        assert index.read(i) == local_index.read(i)
    client.put_object(Bucket="corpus", Key="text/" + Path(urls[3]).name, Body=b"x" * 1024)
    fresh = LengthIndex.open(index.path)
    with pytest.raises(StaleIndexError, match=urls[3]):
        fresh.read(int(np.flatnonzero(fresh.shard == 3)[0]))
    assert LoaderOptions(remote=FAST).remote is FAST


def test_neighbouring_ranges_of_a_shard_become_one_request() -> None:
    from fcp_data.readers.remote import merge_ranges

    got = merge_ranges(
        [("u2", 0, 10), ("u1", 500, 600), ("u1", 0, 100), ("u1", 100_000, 100_010)], gap=1000
    )
    assert got == [("u1", 0, 600), ("u1", 100_000, 100_010), ("u2", 0, 10)]
