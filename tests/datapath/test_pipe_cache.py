"""`pipe:` shards load through a bounded local cache: equal output, LRU eviction under the size
limit, failed or cut copies never used, a full disk named (real ENOSPC from /dev/full)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from datapath_helpers import fields, loader

from fcp_data.errors import DataError
from fcp_data.readers import LengthIndex, build_index
from fcp_data.readers.cache import CacheFullError, ShardCache
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
        ld = loader(pipe_index.path, 2, r, cost, store=False, tokenizer=str(bpe_file), cap=cap)
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
