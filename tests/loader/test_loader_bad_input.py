"""Bad input: batch size, replica index, index/loader mismatch, too long, corrupt, crashes."""

from __future__ import annotations

import pytest
from crash_helpers import ExitOn, RaiseOn
from loader_helpers import ByteTokenizer, TarIndex, cluster, simple_planner, write_text_shards

from fcp_data.loader import FCPDataLoader, LoaderOptions
from fcp_data.loader.global_batch import SampleReadError


def loader(index, cost, *, replica: int = 0, n: int = 4, gbs: int = 16, **kw) -> FCPDataLoader:
    opts = kw.pop("options", None) or LoaderOptions(planner=simple_planner)
    return FCPDataLoader(
        index,
        cluster=cluster(n),
        cost=cost,
        replica=replica,
        global_batch_size=gbs,
        num_workers=0,
        options=opts,
        **kw,
    )


@pytest.mark.parametrize("gbs", [0, -3])
def test_global_batch_size_below_one(index, cost, gbs: int) -> None:
    with pytest.raises(ValueError, match=rf"global_batch_size={gbs} must be an integer >= 1"):
        loader(index, cost, gbs=gbs)


@pytest.mark.parametrize("replica", [-1, 4, 9])
def test_replica_outside_range(index, cost, replica: int) -> None:
    with pytest.raises(ValueError, match=rf"replica={replica} is outside \[0, 4\)"):
        loader(index, cost, replica=replica)


def test_index_built_with_another_tokenizer(shards, cost) -> None:
    idx = TarIndex(shards[0], ByteTokenizer(), tokenizer_spec="bytes:4")
    with pytest.raises(ValueError, match="built with tokenizer 'bytes:4' but the loader has"):
        loader(idx, cost, tokenizer=ByteTokenizer())


def test_index_built_with_another_vision_rule(shards, cost) -> None:
    idx = TarIndex(
        shards[0],
        ByteTokenizer(),
        rule={"name": "qwen2-vl"},
    )
    with pytest.raises(ValueError, match="vision rule 'qwen2-vl' but the loader has 'qwen3-vl'"):
        loader(idx, cost, tokenizer=ByteTokenizer(), vision_rule="qwen3-vl")


def test_lengths_that_do_not_match_the_index(index, cost) -> None:
    index.seqlens = index.seqlens + 1  # as if counted by another tokenizer
    ld = loader(index, cost, tokenizer=ByteTokenizer())
    with pytest.raises(SampleReadError, match="built with another tokenizer"):
        next(iter(ld))


def test_sample_longer_than_the_cluster(index, cost) -> None:
    ld = loader(index, cost, n=2, tokenizer=ByteTokenizer())  # 2 x 1100 < 3000 tokens
    with pytest.raises(ValueError, match="does not fit"):
        list(ld)
    mbs, dropped = [], set()
    for r in range(2):
        ld = loader(
            index,
            cost,
            n=2,
            replica=r,
            tokenizer=ByteTokenizer(),
            options=LoaderOptions(planner=simple_planner, on_too_long="drop"),
        )
        mbs += list(ld)
        dropped |= {k for m in ld.metrics_history for k, why in m.skipped if "too long" in why}
    long_keys = {str(k) for k, L in zip(index.keys, index.seqlens) if L > 2 * 1100 - 4}
    assert dropped == long_keys and dropped  # counted exactly, not silently lost
    seen = {s for mb in mbs for s in mb.sample_ids}
    assert len(seen) == len(index.keys) - len(long_keys)


def test_corrupt_samples_skipped_and_counted_exactly(tmp_path, cost) -> None:
    """Invalid utf-8 the index did not catch: read-time skip, masked out, counted by key."""
    bad = [3, 17, 40]
    urls, _ = write_text_shards(tmp_path, 50, per_shard=20, seed=2, corrupt=bad)
    idx = TarIndex(urls, ByteTokenizer())

    per_replica, skipped = [], []
    for r in range(4):
        ld = loader(
            idx,
            cost,
            replica=r,
            tokenizer=ByteTokenizer(),
            options=LoaderOptions(planner=simple_planner, on_error="skip"),
        )
        per_replica.append(list(ld))
        skipped += [k for m in ld.metrics_history for k, _ in m.skipped]
    # each bad sample is reported by every member of its group; the set is exactly the bad ones
    assert set(skipped) == {f"s{i:05d}" for i in bad}
    for mbs in per_replica:
        for mb in mbs:
            for k, (key, _) in enumerate(zip(mb.keys, mb.sample_ids)):
                a, b = mb.local_cu_seqlens_padded[k], mb.local_cu_seqlens_padded[k + 1]
                masked = float(mb.loss_mask[a:b].sum()) == 0
                assert masked == (key in skipped), key  # bad ones carry no loss, good ones do
    assert sum(not mb.is_empty for mbs in per_replica for mb in mbs) > 0


def test_read_error_names_the_key_in_the_training_loop(shards, cost) -> None:
    idx = TarIndex(shards[0], ByteTokenizer())
    victim = 11
    marker = shards[1][f"s{victim:05d}"][:24]
    for r in range(4):  # some replica's group holds the victim
        ld = FCPDataLoader(
            idx,
            cluster=cluster(4),
            cost=cost,
            replica=r,
            global_batch_size=16,
            num_workers=2,
            options=LoaderOptions(planner=simple_planner, encode=RaiseOn(marker)),
        )
        try:
            list(ld)
        except SampleReadError as e:  # torch re-raises the worker's error in the main process
            assert f"s{victim:05d}" in str(e) and "simulated decoder failure" in str(e)
            return
    pytest.fail("no replica raised for the failing sample")


def test_worker_crash_does_not_hang(shards, cost) -> None:
    idx = TarIndex(shards[0], ByteTokenizer())
    marker = shards[1]["s00011"][:24]
    owners = []
    for r in range(4):
        ld = FCPDataLoader(
            idx,
            cluster=cluster(4),
            cost=cost,
            replica=r,
            global_batch_size=16,
            num_workers=2,
            options=LoaderOptions(planner=simple_planner, encode=ExitOn(marker)),
        )
        try:  # the dead worker is noticed and named, not waited for
            list(ld)
        except RuntimeError as e:
            assert "exited unexpectedly" in str(e), str(e)
            assert "s00011" in str(e), str(e)  # suspects named: this replica's samples in flight
            owners.append(r)
    assert owners, "no replica's worker died: the test is vacuous"
