"""The loader over the readers' real shards (stdlib text + mp4 videos), index and planner."""

from __future__ import annotations

import json

import numpy as np
import pytest
from loader_helpers import ByteTokenizer, reassemble

from fcp_data.collate import IGNORE_INDEX
from fcp_data.loader import FCPDataLoader, LoaderOptions
from fcp_data.planner import Cluster

EOD, SPECIAL, VISION = 300, 301, 302
N = 4


@pytest.fixture(scope="module")
def real_index(tmp_path_factory):
    from fcp_data.readers import build_index, make_shards
    from fcp_data.readers.text import CallableCounter

    root = tmp_path_factory.mktemp("real")
    paths = make_shards(
        root / "shards", text=40, video=4, seed=0, samples_per_shard=16, time_scale=0.05
    )
    counter = CallableCounter(ByteTokenizer(), spec=ByteTokenizer.spec)
    return build_index([str(p) for p in paths], root / "index", counter=counter)


def _loaders(index, cost, **kw):
    cap = int(index.seqlens.max()) // N + 64  # the longest sample needs all 4 replicas
    return [
        FCPDataLoader(
            index.path,
            cluster=Cluster(N, tokens_per_replica=cap),
            cost=cost,
            replica=r,
            global_batch_size=16,
            seed=5,
            num_workers=kw.get("num_workers", 0),
            tokenizer=ByteTokenizer(),
            vision_rule=index.header.rule["name"],
            options=LoaderOptions(eod_id=EOD, special_token_id=SPECIAL, vision_token_id=VISION),
        )
        for r in range(N)
    ]


def _expected(index, i: int) -> np.ndarray:
    sample = index.read(i)
    tok = ByteTokenizer()
    if int(index.modality[i]) == 0:
        text = sample["txt"].decode() if "txt" in sample else json.loads(sample["json"])["text"]
        return np.array(tok(text) + [EOD] * int(index.special_tokens[i]))
    from fcp_data.vision.families import get_rule

    cap = sample["txt"].decode() if "txt" in sample else json.loads(sample["json"])["caption"]
    vt = get_rule(index.header.rule["name"]).video(
        num_frames=int(index.num_frames[i]),
        fps=float(index.fps[i]),
        height=int(index.height[i]),
        width=int(index.width[i]),
    )
    eod = int(index.special_tokens[i]) - vt.special
    return np.array(
        [SPECIAL] * vt.special + [VISION] * int(index.vision_tokens[i]) + tok(cap) + [EOD] * eod
    )


def test_real_planner_and_index_epoch(real_index, cost) -> None:
    loaders = _loaders(real_index, cost)
    per_replica = [list(ld) for ld in loaders]
    assert len({len(m) for m in per_replica}) == 1
    for step in zip(*per_replica):
        assert len({mb.digest for mb in step}) == 1
    toks, labs, seen = reassemble([mb for mbs in per_replica for mb in mbs])
    assert sorted(toks) == list(range(len(real_index)))
    for sid in toks:
        want = _expected(real_index, sid)
        L = len(want)
        assert (seen[sid] == 1).all()
        np.testing.assert_array_equal(toks[sid][:L], want)
        np.testing.assert_array_equal(labs[sid][: L - 1], want[1:])
        assert (labs[sid][L - 1 :] == IGNORE_INDEX).all()
    assert any(mb.rank_plan.degree > 1 for mbs in per_replica for mb in mbs)
    m = loaders[0].metrics_history[0]
    assert m.winner and m.predicted_time >= m.lower_bound > 0


def test_video_frames_decoded_only_where_their_tokens_are(real_index, cost) -> None:
    videos = {i for i in range(len(real_index)) if int(real_index.modality[i]) == 1}
    assert videos, "make_shards wrote no video"
    groups_seen: dict[int, set[int]] = {}
    for mbs in (list(ld) for ld in _loaders(real_index, cost)):
        for mb in mbs:
            for vi in mb.vision:
                assert vi.sample_id in videos
                pos = vi.token_positions
                assert (mb.tokens[pos] == VISION).all()  # exactly the placeholder slots
                n_vision_here = int((mb.tokens == VISION).sum())
                assert len(pos) <= n_vision_here
                assert vi.pixels is not None and vi.pixels.dtype.__str__() == "torch.uint8"
                fpg = vi.meta["frames_per_group"]
                assert vi.pixels.shape[0] == len(vi.frame_indices) == len(vi.groups) * fpg
                # no group is decoded without a placeholder of it on this replica
                assert sorted(set(vi.token_group.tolist())) == list(range(len(vi.groups)))
                groups_seen.setdefault(vi.sample_id, set()).update(vi.groups.tolist())
    from fcp_data.vision.families import get_rule

    rule = get_rule(real_index.header.rule["name"])
    for v in videos:  # across its CP group, every temporal group of every video was decoded
        vt = rule.video(
            num_frames=int(real_index.num_frames[v]),
            fps=float(real_index.fps[v]),
            height=int(real_index.height[v]),
            width=int(real_index.width[v]),
        )
        assert groups_seen[v] == set(range(vt.grid[0]))


def test_real_index_rejects_other_tokenizer_or_rule(real_index, cost) -> None:
    cl = Cluster(N, tokens_per_replica=int(real_index.seqlens.max()))

    class Other(ByteTokenizer):
        spec = "bytes:4"

    with pytest.raises(ValueError, match="built with tokenizer 'test:bytes\\+1' but the loader"):
        FCPDataLoader(
            real_index, cluster=cl, cost=cost, replica=0, global_batch_size=8, tokenizer=Other()
        )
    with pytest.raises(ValueError, match=r"rule 'qwen2\.5-vl' but the loader has 'internvl'"):
        FCPDataLoader(
            real_index,
            cluster=cl,
            cost=cost,
            replica=0,
            global_batch_size=8,
            tokenizer=ByteTokenizer(),
            vision_rule="internvl",
        )


@pytest.mark.parametrize("new_n", [3, 6])
def test_real_planner_elastic_resume(real_index, cost, new_n: int) -> None:
    def run(n: int, state=None, stop_at=None):
        cap = int(real_index.seqlens.max()) // 3 + 64  # fits on 3 replicas too
        ids: dict[int, set[int]] = {}
        states = []
        for r in range(n):
            ld = FCPDataLoader(
                real_index,
                cluster=Cluster(n, tokens_per_replica=cap),
                cost=cost,
                replica=r,
                global_batch_size=12,
                seed=1,
                num_workers=0,
                tokenizer=ByteTokenizer(),
                vision_rule="qwen2.5-vl",
                options=LoaderOptions(eod_id=EOD),
            )
            if state:
                ld.load_state_dict(state)
            for mb in ld:
                ids.setdefault(mb.batch_index, set()).update(mb.sample_ids)
                if stop_at is not None and ld.state_dict()["batch"] == stop_at:
                    break
            states.append(ld.state_dict())
        return ids, states

    full, _ = run(4)
    head, states = run(4, stop_at=2)
    assert sorted(head) == [0, 1] and all(s == states[0] for s in states)
    tail, _ = run(new_n, state=states[0])
    assert {**head, **tail} == full


def test_shards_without_index_are_scanned(real_index, cost) -> None:
    shards = list(real_index.shard_urls)
    by_index = {}
    for mb in _loaders(real_index, cost)[0]:
        by_index.setdefault(mb.batch_index, set()).update(str(k) for k in mb.keys)
    cap = int(real_index.seqlens.max()) // N + 64
    ld = FCPDataLoader(
        shards,
        cluster=Cluster(N, tokens_per_replica=cap),
        cost=cost,
        replica=0,
        global_batch_size=16,
        seed=5,
        num_workers=0,
        tokenizer=ByteTokenizer(),
        vision_rule="qwen2.5-vl",
        options=LoaderOptions(eod_id=EOD, special_token_id=SPECIAL, vision_token_id=VISION),
    )
    np.testing.assert_array_equal(ld.source.seqlens, real_index.seqlens)
    by_scan = {}
    for mb in ld:
        by_scan.setdefault(mb.batch_index, set()).update(mb.keys)
    assert by_scan == by_index and by_scan


def test_corrupt_corpus_skipped_and_counted_exactly(tmp_path, cost) -> None:
    from webdataset import TarWriter

    from fcp_data.readers import ScanConfig, build_index
    from fcp_data.readers.text import CallableCounter

    bad = {
        "b-json": {"json": b"{not json"},
        "b-empty": {"txt": b""},
        "b-video": {"mp4": b"\x00\x01 not a video"},
        "b-fps": {"mp4": b"x", "json": b'{"num_frames": 10, "fps": 0, "width": 64, "height": 64}'},
    }
    url = str(tmp_path / "mixed.tar")
    with TarWriter(url) as w:
        for i in range(24):
            w.write({"__key__": f"g{i:03d}", "txt": (f"good sample {i} " * (i + 1)).encode()})
            if i % 6 == 0:
                k = sorted(bad)[i // 6]
                w.write({"__key__": k, **bad[k]})
    counter = CallableCounter(ByteTokenizer(), spec=ByteTokenizer.spec)
    index = build_index(
        url,
        tmp_path / "index",
        counter=counter,
        config=ScanConfig(on_error="skip", probe_timeout_s=10),
    )
    seen = set()
    for r in range(2):
        ld = FCPDataLoader(
            index,
            cluster=Cluster(2, tokens_per_replica=2000),
            cost=cost,
            replica=r,
            global_batch_size=8,
            num_workers=0,
            tokenizer=ByteTokenizer(),
            options=LoaderOptions(eod_id=EOD),
        )
        assert sorted(k for k, _ in ld.source_skipped) == sorted(bad)  # exactly the bad ones
        seen |= {k for mb in ld for k in mb.keys}
    assert seen == {f"g{i:03d}" for i in range(24)}


def test_spawned_workers_match_inline(real_index, cost) -> None:
    """Workers started with spawn (macOS, forkserver setups) unpickle the index and encoder."""
    cap = int(real_index.seqlens.max()) // N + 64

    def run(workers: int, ctx: str | None) -> list:
        ld = FCPDataLoader(
            real_index,
            cluster=Cluster(N, tokens_per_replica=cap),
            cost=cost,
            replica=1,
            global_batch_size=16,
            seed=5,
            num_workers=workers,
            tokenizer=ByteTokenizer(),
            vision_rule="qwen2.5-vl",
            options=LoaderOptions(eod_id=EOD, multiprocessing_context=ctx, timeout_s=120),
        )
        return [(mb.digest, mb.sample_ids, mb.tokens.tolist(), len(mb.vision)) for mb in ld]

    inline = run(0, None)
    assert inline and inline == run(1, "spawn")


@pytest.mark.parametrize("strategy", ["static", "megatron-hybrid"])
def test_baseline_strategies_and_drops(real_index, cost, strategy: str) -> None:
    """Baseline plans go through the same loader; too-long samples are dropped and counted."""
    cap = int(np.sort(real_index.seqlens)[-3]) // N + 64  # the two longest cannot fit anywhere
    too_long = {str(real_index.keys[i]) for i in np.argsort(real_index.seqlens)[-2:]}
    seen, dropped = set(), set()
    for r in range(N):
        ld = FCPDataLoader(
            real_index,
            cluster=Cluster(N, tokens_per_replica=cap),
            cost=cost,
            replica=r,
            global_batch_size=16,
            seed=5,
            num_workers=0,
            tokenizer=ByteTokenizer(),
            vision_rule="qwen2.5-vl",
            strategy=strategy,
            options=LoaderOptions(eod_id=EOD, on_too_long="drop"),
        )
        seen |= {k for mb in ld for k in mb.keys}
        dropped |= {k for m in ld.metrics_history for k, why in m.skipped if "too long" in why}
    assert dropped == too_long
    assert seen == {str(k) for k in real_index.keys} - too_long
