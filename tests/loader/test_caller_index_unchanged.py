"""A LengthIndex the caller passes is read, never changed: two loaders, two sets of options.

The loader reaches non-local shards with its own options (`LoaderOptions.remote`,
`shard_cache`, `allow_pipe`). It used to write them onto the caller's index, so a second loader
built from the same index with other options changed the first one's access under it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from loader_helpers import ByteTokenizer, cluster, reassemble

from fcp_data.loader import FCPDataLoader, LoaderOptions
from fcp_data.readers import build_index
from fcp_data.readers.cache import ShardCache
from fcp_data.readers.remote import RemoteOptions
from fcp_data.readers.text import CallableCounter

N = 4  # the fixture's longest samples (3000 tokens) need 3 replicas of 1100


def _access(index) -> tuple:
    return (index.remote, index.shard_cache, index.allow_pipe, index.verify_checksums)


def _epoch(index, cost, options: LoaderOptions) -> tuple[list, list[list]]:
    loaders = [
        FCPDataLoader(
            index,
            cluster=cluster(N),
            cost=cost,
            replica=r,
            global_batch_size=8,
            num_workers=0,
            tokenizer=ByteTokenizer(),
            options=options,
        )
        for r in range(N)
    ]
    return loaders, [list(ld) for ld in loaders]


def test_a_callers_index_is_unchanged_by_two_loaders(shards, cost, tmp_path: Path) -> None:
    counter = CallableCounter(ByteTokenizer(), spec=ByteTokenizer.spec)
    index = build_index(shards[0], tmp_path / "index", counter=counter)
    before = _access(index)
    remote = RemoteOptions(retries=2, backoff_s=0.01)
    cache = ShardCache(directory=tmp_path / "cache")
    first, first_mbs = _epoch(index, cost, LoaderOptions(remote=remote))
    assert _access(index) == before
    second, second_mbs = _epoch(index, cost, LoaderOptions(shard_cache=cache, allow_pipe=True))
    assert _access(index) == before  # after both loaders were built and read an epoch
    # each loader reads through its own index with its own options
    assert first[0].source is not index and second[0].source is not index
    assert (first[0].source.remote, first[0].source.shard_cache) == (remote, None)
    assert (second[0].source.shard_cache, second[0].source.allow_pipe) == (cache, True)
    assert second[0].source.remote is None
    # and both read every sample exactly as the index holds it
    tok = ByteTokenizer()
    for mbs in (first_mbs, second_mbs):
        toks, _, seen = reassemble([mb for per_replica in mbs for mb in per_replica])
        assert sorted(toks) == list(range(len(index.seqlens)))
        for sid, padded in toks.items():
            text = index.read(sid)["txt"].decode("utf-8")
            want = tok(text) + [0] * int(index.special_tokens[sid])
            L = int(index.seqlens[sid])
            assert len(want) == L
            np.testing.assert_array_equal(padded[:L], want)
            assert (seen[sid][:L] == 1).all()


def test_options_that_change_nothing_read_the_callers_index(shards, cost, tmp_path) -> None:
    """No copy when the loader's options are the index's own: the loader reads `index`."""
    counter = CallableCounter(ByteTokenizer(), spec=ByteTokenizer.spec)
    index = build_index(shards[0], tmp_path / "index", counter=counter)
    before = _access(index)
    loaders, _ = _epoch(index, cost, LoaderOptions())
    assert loaders[0].source is index and _access(index) == before


def test_a_callers_blend_is_unchanged(shards, cost, tmp_path) -> None:
    """allow_pipe reaches a Blend's indexes through the loader's own blend, not the caller's."""
    from fcp_data.loader import Blend

    counter = CallableCounter(ByteTokenizer(), spec=ByteTokenizer.spec)
    index = build_index(shards[0], tmp_path / "index", counter=counter)
    blend = Blend([index], weights=[1.0])
    before = _access(index)
    loaders, mbs = _epoch(blend, cost, LoaderOptions(allow_pipe=True))
    assert _access(index) == before and blend.sources[0] is index
    own = loaders[0].source
    assert own is not blend and own.sources[0] is not index and own.sources[0].allow_pipe
    toks, _, _ = reassemble([mb for per_replica in mbs for mb in per_replica])
    assert sorted(toks) == list(range(len(index.seqlens)))
