"""Blending: weights per batch, independent source epochs, exact and elastic resume, counts in
the metrics; the loader over a blend of two real indices (one with a token store)."""

from __future__ import annotations

import numpy as np
import pytest
from datapath_helpers import EOD

from fcp_data.errors import ConfigError, IndexMismatchError
from fcp_data.loader import Blend, FCPDataLoader, LoaderOptions
from fcp_data.loader.blend import BlendSampler
from fcp_data.planner import Cluster
from fcp_data.readers import build_index
from fcp_data.readers.text import load_counter


def test_batches_follow_the_weights_and_are_pure_functions_of_seed_epoch_batch() -> None:
    s = BlendSampler(sizes=(1000, 37), weights=(0.7, 0.3), global_batch_size=16, seed=3)
    t = BlendSampler(sizes=(1000, 37), weights=(0.7, 0.3), global_batch_size=16, seed=3)
    counts = np.stack([s.counts(0, b) for b in range(s.num_batches())])
    assert (counts.sum(axis=1) == 16).all()
    assert set(counts[:, 1].tolist()) <= {4, 5}  # 0.3 * 16 = 4.8: 4 or 5, never further
    assert abs(counts[:, 1].mean() - 4.8) < 0.35
    for e, b in [(0, 0), (2, 5), (7, 64)]:
        np.testing.assert_array_equal(s.batch(e, b), t.batch(e, b))
    assert not np.array_equal(s.batch(0, 0), s.batch(1, 0))
    other = BlendSampler(sizes=(1000, 37), weights=(0.7, 0.3), global_batch_size=16, seed=4)
    assert not np.array_equal(s.batch(0, 0), other.batch(0, 0))


def test_source_epochs_advance_independently() -> None:
    s = BlendSampler(sizes=(500, 10), weights=(0.5, 0.5), global_batch_size=8, seed=1)
    small = np.concatenate([s.order(e) for e in range(3)])
    small = small[small >= 500] - 500
    # each pass over the 10-sample source is a permutation of it, passes differ
    passes = [small[i : i + 10] for i in range(0, len(small) - 9, 10)]
    assert len(passes) >= 10
    for p in passes:
        assert sorted(p.tolist()) == list(range(10))
    assert any(not np.array_equal(passes[0], p) for p in passes[1:])
    big = np.concatenate([s.order(e) for e in range(3)])
    big = big[big < 500]
    # 256 draws an epoch from the large source: its first pass spans two blend epochs
    assert len(big) == 768 and sorted(big[:500].tolist()) == list(range(500))
    assert len(set(big[:400].tolist())) == 400


def test_bad_weights_and_mixed_tokenizers_are_refused(tmp_path, text_shards, bpe_file) -> None:
    a = build_index(text_shards[:1], tmp_path / "a", counter=load_counter(str(bpe_file)))
    b = build_index(text_shards[1:2], tmp_path / "b")  # bytes:4 estimate
    with pytest.raises(ConfigError, match="one weight per source"):
        Blend([a], weights=[0.5, 0.5])
    with pytest.raises(ConfigError, match="must be >= 0"):
        Blend([a, a], weights=[1.0, -1.0])
    with pytest.raises(IndexMismatchError, match="different tokenizers"):
        Blend([a, b], weights=[0.5, 0.5])


@pytest.fixture(scope="module")
def blend_parts(tmp_path_factory, text_shards, bpe_file):
    root = tmp_path_factory.mktemp("dp-blend")
    c = load_counter(str(bpe_file))
    a = build_index(text_shards[:3], root / "a", counter=c, store_tokens=True)
    b = build_index(text_shards[3:], root / "b", counter=c)
    return a, b


def _loader(blend, n, r, cost, bpe_file) -> FCPDataLoader:
    cap = int(blend.seqlens.max()) // min(n, 3) + 64
    return FCPDataLoader(
        blend,
        cluster=Cluster(n, replicas_per_node=4, tokens_per_replica=cap),
        cost=cost,
        replica=r,
        global_batch_size=10,
        num_workers=0,
        tokenizer=str(bpe_file),
        options=LoaderOptions(eod_id=EOD),
    )


def _epoch(ld: FCPDataLoader, stop: int | None = None) -> list[tuple[int, ...]]:
    out = []
    for mb in ld:
        out.append((mb.batch_index, mb.wave, *mb.sample_ids, int(mb.tokens.sum())))
        if stop is not None and mb.is_last_wave and mb.batch_index + 1 == stop:
            break
    return out


def test_loader_over_a_blend_counts_sources_and_resumes(blend_parts, bpe_file, cost) -> None:
    a, b = blend_parts
    blend = Blend([a, b], weights=[0.7, 0.3], names=["a", "b"], batches_per_epoch=4)
    full = _loader(blend, 2, 0, cost, bpe_file)
    whole = _epoch(full)
    for m in full.metrics_history:
        want = full.sampler.counts(m.epoch, m.batch_index)
        assert m.source_counts == tuple(int(x) for x in want) and sum(m.source_counts) == 10
    # exact resume after batch 2 on the same cluster: the rest is identical
    first = _loader(blend, 2, 0, cost, bpe_file)
    head = _epoch(first, stop=2)
    state = first.state_dict()
    again = _loader(
        Blend([a.path, b.path], weights=[0.7, 0.3], batches_per_epoch=4), 2, 0, cost, bpe_file
    )
    again.load_state_dict(state)
    again.num_workers = 1  # the blend and its sampler travel to a worker process
    assert head + _epoch(again) == whole
    # elastic: 3 replicas resume from the same state and cover exactly the same samples
    rest = {int(p) for bi in (2, 3) for p in full.sampler.batch(0, bi)}
    seen: set[int] = set()
    for r in range(3):
        ld = _loader(blend, 3, r, cost, bpe_file)
        ld.load_state_dict(state)
        seen |= {s for mb in ld for s in mb.sample_ids}
    assert seen == rest


def test_bad_weights_names_and_repeated_sources_are_named(tmp_path, text_shards, bpe_file) -> None:
    c = load_counter(str(bpe_file))
    a = build_index(text_shards[:1], tmp_path / "a", counter=c)
    b = build_index(text_shards[1:2], tmp_path / "b", counter=c)
    for bad in ([0.5, float("nan")], [0.5, float("inf")], [0.5, "0.5"], [0.5, True]):
        with pytest.raises(ConfigError, match=r"blend weight .* of source 'y' must be >= 0"):
            Blend([a, b], weights=bad, names=["x", "y"])
    with pytest.raises(ConfigError, match="all 0"):
        Blend([a, b], weights=[0.0, 0.0])
    with pytest.raises(ConfigError, match="one name per source"):
        Blend([a, b], weights=[0.5, 0.5], names=["x"])
    with pytest.raises(ConfigError, match=r"names \['x'\] repeat"):
        Blend([a, b], weights=[0.5, 0.5], names=["x", "x"])
    with pytest.raises(ConfigError, match="batches_per_epoch"):
        Blend([a, b], weights=[0.5, 0.5], batches_per_epoch=0)
    # the same index twice (as object and as path, or a copy elsewhere): weight counted twice
    import shutil

    shutil.copytree(tmp_path / "a", tmp_path / "a-copy")
    for again in (a, a.path, tmp_path / "a-copy"):
        with pytest.raises(ConfigError, match=r"blend sources 'source0' .* 'source2' .* same"):
            Blend([a, b, again], weights=[0.4, 0.3, 0.3])
    # a zero-weight source is allowed and never drawn
    s = Blend([a, b], weights=[1.0, 0.0]).make_sampler(global_batch_size=4)
    assert (np.concatenate([s.batch(0, i) for i in range(s.num_batches())]) < len(a.seqlens)).all()


def test_an_empty_source_with_weight_is_refused_by_name(tmp_path, text_shards, bpe_file) -> None:
    """All of its samples left out at index time: 0 samples. Was a raw ZeroDivisionError."""
    from webdataset import TarWriter

    from fcp_data.readers.scan import ScanConfig

    c = load_counter(str(bpe_file))
    a = build_index(text_shards[:1], tmp_path / "a", counter=c)
    url = str(tmp_path / "bad.tar")
    with TarWriter(url) as w:  # .json without the text field: skipped, counted
        w.write({"__key__": "k0", "json": {"other": "x"}})
        w.write({"__key__": "k1", "json": {"other": "y"}})
    empty = build_index(
        url, tmp_path / "e", counter=c, config=ScanConfig(on_error="skip"), allow_empty=True
    )
    assert len(empty.seqlens) == 0
    with pytest.raises(ConfigError, match=r"source 'video' .*e\) has 0 samples \(2 left out"):
        Blend([a, empty], weights=[0.7, 0.3], names=["text", "video"])
    blend = Blend([a, empty], weights=[1.0, 0.0])  # weight 0: nothing to draw from it
    s = blend.make_sampler(global_batch_size=4)
    assert len(s.batch(1, 0)) == 4


def test_each_source_is_read_with_its_own_text_field(tmp_path, bpe_file, cost) -> None:
    """Source b was indexed with --text-field body: the loader reads "body" there, "text" in a
    (each source's counts came from its own field), and refuses an option naming another."""
    from webdataset import TarWriter

    from fcp_data.readers.scan import ScanConfig
    from fcp_data.readers.text import as_tokenizer

    c = load_counter(str(bpe_file))
    texts = {f"a{i}": f"alpha sample number {i} " * (3 + i) for i in range(4)}
    bodies = {f"b{i}": f"beta body {i} is longer " * (5 + i) for i in range(4)}
    for name, field, rows in (("a", "text", texts), ("b", "body", bodies)):
        with TarWriter(str(tmp_path / f"{name}.tar")) as w:
            for key, value in rows.items():  # both fields present: the wrong one would load
                other = "body" if field == "text" else "text"
                w.write({"__key__": key, "json": {field: value, other: "decoy " * 40}})
    a = build_index(str(tmp_path / "a.tar"), tmp_path / "ia", counter=c)
    b = build_index(
        str(tmp_path / "b.tar"), tmp_path / "ib", counter=c, config=ScanConfig(text_field="body")
    )
    blend = Blend([a, b], weights=[0.5, 0.5], names=["a", "b"], batches_per_epoch=1)
    tok = as_tokenizer(str(bpe_file))
    ld = FCPDataLoader(
        blend,
        cluster=Cluster(1, tokens_per_replica=4096),
        cost=cost,
        replica=0,
        global_batch_size=8,
        num_workers=0,
        tokenizer=str(bpe_file),
        options=LoaderOptions(eod_id=EOD),
    )
    enc = ld._builder.encoder
    for p, key in enumerate(blend.keys):
        want = [*tok({**texts, **bodies}[str(key)]), EOD]
        assert enc(blend, p).tokens.tolist() == want, key
        assert len(want) == int(blend.seqlens[p])  # what the index counted
    assert sum(mb.num_tokens for mb in ld) > 0  # and the loader plans and builds them
    with pytest.raises(ConfigError, match=r"text_field='body'.*source 'a'.*'text'"):
        FCPDataLoader(
            blend,
            cluster=Cluster(1, tokens_per_replica=4096),
            cost=cost,
            replica=0,
            global_batch_size=8,
            num_workers=0,
            tokenizer=str(bpe_file),
            options=LoaderOptions(eod_id=EOD, text_field="body"),
        )
    # shard specs are scanned with the loader's fields, and read with them
    specs = FCPDataLoader(
        str(tmp_path / "b.tar"),
        cluster=Cluster(1, tokens_per_replica=4096),
        cost=cost,
        replica=0,
        global_batch_size=4,
        num_workers=0,
        tokenizer=str(bpe_file),
        options=LoaderOptions(eod_id=EOD, text_field="body"),
    )
    for p, key in enumerate(specs.source.keys):
        assert specs._builder.encoder(specs.source, p).tokens.tolist() == [
            *tok(bodies[str(key)]),
            EOD,
        ]
