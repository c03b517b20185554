"""Bad samples at load time: undecodable or short videos, scan-time skips, all-too-long batches."""

from __future__ import annotations

import json

import pytest
from loader_helpers import ByteTokenizer, TarIndex, cluster, simple_planner

from fcp_data.errors import SampleError
from fcp_data.loader import FCPDataLoader, LoaderOptions
from fcp_data.loader.global_batch import SampleReadError
from fcp_data.planner import Cluster

EOD, SPECIAL, VISION = 300, 301, 302


def _sidecar(frames: int, fps: int, w: int, h: int) -> bytes:
    meta = {"num_frames": frames, "fps": fps, "width": w, "height": h, "duration": frames / fps}
    return json.dumps(meta).encode()


@pytest.fixture(scope="module")
def video_index(tmp_path_factory):
    """A real index over a real shard: good videos, one whose bytes do not decode, one whose
    sidecar claims 24 frames where the mp4 holds 6, and text."""
    from webdataset import TarWriter

    from fcp_data.readers import build_index
    from fcp_data.readers.synth import encode_video
    from fcp_data.readers.text import CallableCounter

    root = tmp_path_factory.mktemp("videos")
    url = str(root / "v.tar")
    with TarWriter(url) as w:
        for i in range(3):
            w.write(
                {
                    "__key__": f"good{i}",
                    "mp4": encode_video(24, 64, 48, 6, seed=i),
                    "json": _sidecar(24, 6, 64, 48),
                    "txt": f"clip {i}".encode(),
                }
            )
            w.write({"__key__": f"text{i}", "txt": ("words " * (30 + 9 * i)).encode()})
        w.write(
            {
                "__key__": "garbage",
                "mp4": b"\x00\x00\x00\x18ftypmp42" + bytes(4000),
                "json": _sidecar(24, 6, 64, 48),
            }
        )
        w.write(
            {
                "__key__": "short",
                "mp4": encode_video(6, 64, 48, 6, seed=9),
                "json": _sidecar(24, 6, 64, 48),
            }
        )
    counter = CallableCounter(ByteTokenizer(), spec=ByteTokenizer.spec)
    return build_index(url, root / "index", counter=counter)


def _video_loaders(index, cost, on_error: str) -> list[FCPDataLoader]:
    from fcp_data.vision.families import get_rule

    rule = get_rule(index.header.rule["name"])
    cap = int(index.seqlens.max()) + 16  # every sample fits one replica: decoded whole
    return [
        FCPDataLoader(
            index,
            cluster=Cluster(2, tokens_per_replica=cap),
            cost=cost,
            replica=r,
            global_batch_size=len(index),
            num_workers=0,
            tokenizer=ByteTokenizer(),
            vision_rule=rule,
            options=LoaderOptions(
                on_error=on_error, eod_id=EOD, special_token_id=SPECIAL, vision_token_id=VISION
            ),
        )
        for r in range(2)
    ]


def test_undecodable_and_short_videos_are_skipped_and_counted(video_index, cost) -> None:
    assert {"garbage", "short"} <= set(video_index.keys)  # the sidecars got them indexed
    skipped: dict[str, str] = {}
    decoded: dict[str, int] = {}
    for ld in _video_loaders(video_index, cost, "skip"):
        for mb in ld:
            for k, why in mb.skipped:
                skipped[k] = why
            for j, key in enumerate(mb.keys):
                a, b = mb.local_cu_seqlens_padded[j], mb.local_cu_seqlens_padded[j + 1]
                assert (float(mb.loss_mask[a:b].sum()) == 0) == (key in dict(mb.skipped)), key
            for vi in mb.vision:
                assert vi.pixels.shape[0] == len(vi.frame_indices)  # no frame made up
                decoded[vi.key] = decoded.get(vi.key, 0) + vi.pixels.shape[0]
        assert ld.metrics_history[-1].index_skipped == 0
    assert set(skipped) == {"garbage", "short"}
    assert "video has 6 decodable frames but frame" in skipped["short"]
    assert set(decoded) == {"good0", "good1", "good2"}


def test_undecodable_video_raises_naming_its_key(video_index, cost) -> None:
    errors = []
    for ld in _video_loaders(video_index, cost, "raise"):
        with pytest.raises(SampleReadError) as info:  # each replica holds one of the two
            list(ld)
        errors.append(str(info.value))
    assert any("'garbage'" in e for e in errors), errors
    assert all("'garbage'" in e or ("'short'" in e and "6 decodable frames" in e) for e in errors)


def _text_shard(tmp_path, bad: dict[str, bytes]) -> str:
    from webdataset import TarWriter

    url = str(tmp_path / "t.tar")
    with TarWriter(url) as w:
        for i in range(12):
            key = f"k{i:02d}"
            w.write({"__key__": key, "txt": bad.get(key, ("text " * (10 + 7 * i)).encode())})
    return url


def test_shard_specs_honour_on_error_and_count_scan_skips(tmp_path, cost) -> None:
    url = _text_shard(tmp_path, {"k03": b"", "k07": b"\xff\xfe bad utf-8"})
    kw = {
        "cluster": cluster(2, 4000),
        "cost": cost,
        "replica": 0,
        "global_batch_size": 4,
        "num_workers": 0,
        "tokenizer": ByteTokenizer(),
    }
    with pytest.raises(SampleError, match=r"sample 'k03': empty text"):
        FCPDataLoader([url], **kw, options=LoaderOptions(on_error="raise"))
    ld = FCPDataLoader([url], **kw, options=LoaderOptions(on_error="skip"))
    assert sorted(k for k, _ in ld.source_skipped) == ["k03", "k07"]
    metrics = [m for _ in ld for m in [ld.metrics]]
    assert metrics and all(m.index_skipped == 2 for m in metrics)  # never a silent 0


def test_index_skips_reach_the_metrics(tmp_path, cost) -> None:
    from fcp_data.readers import build_index
    from fcp_data.readers.text import CallableCounter

    url = _text_shard(tmp_path, {"k05": b""})
    counter = CallableCounter(ByteTokenizer(), spec=ByteTokenizer.spec)
    index = build_index(url, tmp_path / "idx", counter=counter)
    ld = FCPDataLoader(
        tmp_path / "idx",
        cluster=cluster(2, 4000),
        cost=cost,
        replica=1,
        global_batch_size=5,
        num_workers=0,
        tokenizer=ByteTokenizer(),
    )
    assert len(index) == 11 and [k for k, _ in ld.source_skipped] == ["k05"]
    assert {m.index_skipped for _ in ld for m in [ld.metrics]} == {1}


@pytest.mark.parametrize("planner", [None, simple_planner])
def test_a_batch_of_only_too_long_samples_yields_placeholder_micro_batches(
    shards, cost, planner
) -> None:
    index = TarIndex(shards[0], ByteTokenizer())
    cap = 1100
    long = [i for i, n in enumerate(index.seqlens) if n > 2 * cap - 4]
    short = [i for i, n in enumerate(index.seqlens) if n < cap // 2]
    assert len(long) >= 3, "the fixture has too few long samples: vacuous"
    order = long[:3] + short[:5]  # batch 0: only too-long samples, batch 1: short ones
    index.keys, index.seqlens = index.keys[order], index.seqlens[order]
    index.causal, index.where = index.causal[order], [index.where[i] for i in order]
    per_replica, loaded = [], 0
    for r in range(2):
        ld = FCPDataLoader(
            index,
            cluster=cluster(2, cap),
            cost=cost,
            replica=r,
            global_batch_size=3,
            num_workers=0,
            tokenizer=ByteTokenizer(),
            options=LoaderOptions(on_too_long="drop", shuffle=False, planner=planner),
        )
        mbs = list(ld)
        first = [mb for mb in mbs if mb.batch_index == 0]
        assert len(first) == 1 and first[0].is_placeholder and first[0].rank_plan.is_last_wave
        m0 = ld.metrics_history[0]
        assert [k for k, why in m0.skipped if "too long" in why] == list(index.keys[:3])
        loaded += sum(not mb.rank_plan.is_empty for mb in mbs)
        per_replica.append([(mb.batch_index, mb.wave) for mb in mbs])
    assert per_replica[0] == per_replica[1]  # every replica the same micro-batch count
    assert loaded > 0  # the short batches still load


def test_a_setup_fault_is_not_skipped_as_a_bad_sample(index, cost) -> None:
    """No tokenizer for text samples is the setup's fault: under on_error="skip" it must still
    raise (skipping would silently drop every text sample)."""
    from fcp_data.errors import ConfigError

    ld = FCPDataLoader(
        index,
        cluster=cluster(4),
        cost=cost,
        replica=0,
        global_batch_size=16,
        num_workers=0,
        options=LoaderOptions(planner=simple_planner, on_error="skip"),
    )
    with pytest.raises(ConfigError, match="the loader has no tokenizer="):
        next(iter(ld))
