"""`pipe:` shards load through a bounded local cache: equal output, LRU eviction under the size
limit, failed or cut copies never used, a full disk named (real ENOSPC from /dev/full)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from datapath_helpers import ended, fields, loader

from fcp_data.errors import DataError
from fcp_data.readers import LengthIndex, build_index
from fcp_data.readers.cache import CacheFullError, ShardCache
from fcp_data.readers.index_format import ChecksumMismatchError
from fcp_data.readers.text import load_counter


@pytest.fixture(scope="module")
def pipe_index(tmp_path_factory, text_shards, bpe_file) -> LengthIndex:
    out = tmp_path_factory.mktemp("dp-pipe") / "index"
    urls = [f"pipe:cat {s}" for s in text_shards]
    return build_index(urls, out, counter=load_counter(str(bpe_file)))


def test_pipe_shards_load_through_the_cache_like_local(
    pipe_index, text_shards, bpe_file, cost, tmp_path
):
    local = build_index(text_shards, tmp_path / "local", counter=load_counter(str(bpe_file)))
    sizes = sorted(os.path.getsize(s) for s in text_shards)
    cache = ShardCache(directory=tmp_path / "cache", max_bytes=sizes[-1] + sizes[-2])
    cap = int(local.seqlens.max()) // 2 + 64
    for r in range(2):
        want = [
            fields(mb)
            for mb in loader(local, 2, r, cost, store=False, tokenizer=str(bpe_file), cap=cap)
        ]
        piped = LengthIndex.open(pipe_index.path, allow_pipe=True)  # our own commands
        ld = loader(piped, 2, r, cost, store=False, tokenizer=str(bpe_file), cap=cap)
        ld.source.shard_cache = cache
        got = [fields(mb) for mb in ld]
        for a, b in zip(want, got, strict=True):
            for k in a:
                np.testing.assert_array_equal(a[k], b[k], err_msg=k)
        kept = list(Path(cache.directory).iterdir())
        assert 1 <= len(kept) <= 2 and cache.size() <= cache.max_bytes  # LRU kept it bounded
        assert not any(".partial" in p.name for p in kept)


def test_a_failing_command_leaves_no_copy(tmp_path: Path, text_shards) -> None:
    cache = ShardCache(directory=tmp_path / "c", max_bytes=1 << 30)
    url = f"pipe:head -c 5000 {text_shards[0]}; exit 3"
    with pytest.raises(DataError, match="status 3"):
        cache.get(url)
    assert list(Path(cache.directory).iterdir()) == []
    with pytest.raises(CacheFullError, match="over the cache limit"):
        ShardCache(directory=tmp_path / "c", max_bytes=1000).get(f"pipe:cat {text_shards[0]}")
    assert list(Path(cache.directory).iterdir()) == []


def test_a_full_disk_is_named_and_no_partial_copy_stays(tmp_path: Path, text_shards) -> None:
    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full (Linux) to produce a real ENOSPC")
    cache = ShardCache(directory=tmp_path / "c", max_bytes=1 << 30)
    url = f"pipe:cat {text_shards[0]}"
    dest = cache.path_of(url)
    dest.parent.mkdir(parents=True)
    # the copy's partial file is a link to /dev/full: every write fails with ENOSPC
    os.symlink("/dev/full", dest.with_name(f"{dest.name}.partial-{os.getpid()}"))
    with pytest.raises(CacheFullError, match="out of space") as err:
        cache.get(url)
    assert str(cache.directory) in str(err.value) and not dest.exists()
    assert list(Path(cache.directory).iterdir()) == []


def _pipe_index(url: str, out: Path, bpe_file: Path, stall_s: float = 60.0) -> LengthIndex:
    from fcp_data.readers import ScanConfig

    index = build_index(
        [url],
        out,
        config=ScanConfig(stream_timeout_s=stall_s),
        counter=load_counter(str(bpe_file)),
    )
    index = LengthIndex.open(out, allow_pipe=True)
    return index


def test_pipe_shards_are_fingerprinted_and_a_reindexed_shard_gets_a_new_copy(
    tmp_path: Path, text_shards, bpe_file
) -> None:
    shard = tmp_path / "s.tar"
    shutil.copy(text_shards[0], shard)
    url = f"pipe:cat {shard}"
    cache = ShardCache(directory=tmp_path / "c", max_bytes=1 << 30)
    first = _pipe_index(url, tmp_path / "i1", bpe_file)
    fp = first.header.shards[0].fingerprint
    assert fp.startswith("pipe:end=") and "blake2b=" in fp
    first.shard_cache = cache
    assert first.read(0) == LengthIndex.open(build_index([str(shard)], tmp_path / "l1").path).read(
        0
    )
    shutil.copy(text_shards[1], shard)  # rewritten, then re-indexed
    second = _pipe_index(url, tmp_path / "i2", bpe_file)
    assert second.header.shards[0].fingerprint != fp
    second.shard_cache = cache
    local = build_index([str(shard)], tmp_path / "l2")
    for i in range(len(second)):
        assert second.read(i) == local.read(i)  # the new bytes, not the old copy's
    assert len(list(Path(cache.directory).glob("*.tar"))) == 2


def test_a_changed_command_output_is_named_once_per_shard(tmp_path, text_shards, bpe_file):
    shard, log = tmp_path / "s.tar", tmp_path / "runs.log"
    shutil.copy(text_shards[0], shard)
    index = _pipe_index(f"pipe:echo run >> {log}; cat {shard}", tmp_path / "idx", bpe_file)
    index.shard_cache = ShardCache(directory=tmp_path / "c", max_bytes=1 << 30)
    log.unlink()
    shutil.copy(text_shards[1], shard)  # not re-indexed: the output differs from the index
    with pytest.raises(ChecksumMismatchError, match="differs from what index") as err:
        index.read(0)
    assert "pipe:echo run" in str(err.value)
    with pytest.raises(DataError, match="copy failed earlier"):
        index.read(1)
    assert log.read_text().count("run") == 1  # the command ran once, not once per sample
    assert not list(Path(index.shard_cache.directory).glob("*.tar"))


def test_a_quiet_command_is_killed_and_bounded_once_per_shard(tmp_path, text_shards, bpe_file):
    shard, script, pidfile = tmp_path / "s.tar", tmp_path / "cmd.sh", tmp_path / "pid"
    shutil.copy(text_shards[0], shard)
    script.write_text(f"cat {shard}\n")
    index = _pipe_index(f"pipe:sh {script}", tmp_path / "idx", bpe_file, stall_s=1.0)
    index.shard_cache = ShardCache(directory=tmp_path / "c", max_bytes=1 << 30)
    done = tmp_path / "done"  # written only if the command outlives its sleep: not killed
    script.write_text(f"echo $$ > {pidfile}\nhead -c 3000 {shard}\nsleep 30\ntouch {done}\n")
    with pytest.raises(DataError, match=r"no data for 1 s"):
        index.read(0)
    assert not done.exists()  # bounded at the stall limit, not waited for
    pid = int(pidfile.read_text())
    assert ended(pid)  # the command was killed, not left running
    pidfile.unlink()
    with pytest.raises(DataError, match="copy failed earlier"):
        index.read(5)
    assert not pidfile.exists()  # the other samples of the shard fail at once: no new run
