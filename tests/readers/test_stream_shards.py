"""Shard specs, pipe: shards, streaming records, text counters and make_shards."""

from __future__ import annotations

import io
import shlex
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from webdataset import TarWriter

from fcp.cli import main
from fcp_data.readers.length_index import LengthIndex
from fcp_data.readers.scan import ScanConfig
from fcp_data.readers.shards import expand_shards, iter_raw_samples, read_members
from fcp_data.readers.stream import stream_records
from fcp_data.readers.synth import make_shards
from fcp_data.readers.text import (
    CallableCounter,
    RatioCounter,
    calibrate_ratio,
    load_counter,
)


def test_expand_paths_globs_braces_pipes(shard_dir: Path) -> None:
    brace = expand_shards(str(shard_dir / "text-{000000..000002}.tar"))
    assert [Path(u).name for u in brace] == [f"text-00000{i}.tar" for i in range(3)]
    globbed = expand_shards(str(shard_dir / "*.tar"))
    assert len(globbed) == 4 and globbed == sorted(globbed)
    both = expand_shards([str(shard_dir / "text-000000.tar"), str(shard_dir / "*.tar")])
    assert len(both) == 4  # duplicates removed, order kept
    assert expand_shards("pipe:cat x.tar") == ["pipe:cat x.tar"]
    assert expand_shards("pipe:cat x{1..2}.tar") == ["pipe:cat x1.tar", "pipe:cat x2.tar"]
    listed = expand_shards(f"{shard_dir}/text-000001.tar::{shard_dir}/video-000000.tar")
    assert [Path(u).name for u in listed] == ["text-000001.tar", "video-000000.tar"]
    with pytest.raises(FileNotFoundError, match=r"nope-1\.tar"):
        expand_shards(str(shard_dir / "nope-{1..3}.tar"))
    with pytest.raises(FileNotFoundError, match="matched no files"):
        expand_shards(str(shard_dir / "*.zip"))


def test_stream_equals_index(built_index: LengthIndex, shard_paths: list[Path]) -> None:
    records = list(stream_records([str(p) for p in shard_paths]))
    assert [r.key for r in records] == list(built_index.keys)
    assert [r.seqlen for r in records] == list(built_index.seqlens)
    assert records[0].payload is None  # local shards: nothing kept in memory
    for i in (0, len(records) - 1):
        assert records[i].fetch() == built_index.read(i)


def test_pipe_shards_stream_and_index(shard_paths: list[Path], tmp_path: Path) -> None:
    spec = f"pipe:cat {shlex.quote(str(shard_paths[-1]))}"  # the video shard
    local = list(stream_records(str(shard_paths[-1])))
    piped = list(stream_records(spec))
    assert [r.seqlen for r in piped] == [r.seqlen for r in local] and piped
    assert piped[0].payload is not None and piped[0].fetch() == local[0].fetch()
    from fcp_data.readers.build import build_index

    idx = build_index(spec, tmp_path / "pidx")
    assert list(idx.seqlens) == [r.seqlen for r in local]
    from fcp_data.readers.cache import ShardCache

    idx.shard_cache = ShardCache(directory=tmp_path / "cache")  # pipe shards load via a copy
    assert idx.read(0) == local[0].fetch()
    assert len(list((tmp_path / "cache").iterdir())) == 1


def test_npy_json_and_image_samples(tmp_path: Path) -> None:
    pil = pytest.importorskip("PIL.Image")
    buf = io.BytesIO()
    pil.new("RGB", (1920, 1080), (10, 20, 30)).save(buf, format="PNG")
    path = tmp_path / "mixed.tar"
    ids = np.arange(77, dtype=np.int32)
    npy = io.BytesIO()
    np.save(npy, ids)
    with TarWriter(str(path)) as w:
        w.write({"__key__": "a", "npy": npy.getvalue()})
        w.write({"__key__": "b", "json": b'{"body": "abcdefgh"}'})
        w.write({"__key__": "c", "png": buf.getvalue(), "txt": b"a caption"})
    recs = list(
        stream_records(str(path), config=ScanConfig(text_field="body", vision_rule="qwen2-vl"))
    )
    a, b, c = recs
    assert a.text_tokens == 77 and a.modality == 0
    assert b.text_tokens == 2  # 8 bytes / 4
    assert c.modality == 2 and (c.height, c.width) == (1080, 1920)
    assert c.vision_tokens == 39 * 69 and c.text_tokens == 3  # ceil(9/4)


def test_text_counters() -> None:
    assert RatioCounter(4.0).count("abcdefghi") == 3
    assert RatioCounter(4.0).count("") == 0
    assert load_counter("bytes:2.5").spec == "bytes:2.5"
    c = CallableCounter(lambda s: list(range(len(s.split()))))
    assert c("a b c") == 3
    assert load_counter("py:shlex:split")("x y") == 2
    for bad in ("bytes:x", "py:nosuchmodule:f"):
        with pytest.raises(ValueError, match="tokenizer spec"):
            load_counter(bad)
    with pytest.raises(ValueError, match="tokenizer file 'what:ever' does not exist"):
        load_counter("what:ever")  # neither bytes:, py: nor hf:: a file that is not there
    with pytest.raises(ValueError, match="> 0"):
        RatioCounter(0)
    assert calibrate_ratio(["ab cd", "efgh"], str.split) == pytest.approx(9 / 3)


def test_make_shards_is_deterministic(tmp_path: Path) -> None:
    a = make_shards(tmp_path / "a", text=10, video=3, seed=5, samples_per_shard=8)
    b = make_shards(tmp_path / "b", text=10, video=3, seed=5, samples_per_shard=8)
    c = make_shards(tmp_path / "c", text=10, video=3, seed=6, samples_per_shard=8)
    assert [p.name for p in a] == ["text-000000.tar", "text-000001.tar", "video-000000.tar"]
    assert all(x.read_bytes() == y.read_bytes() for x, y in zip(a, b))
    assert any(x.read_bytes() != y.read_bytes() for x, y in zip(a, c))


def test_cli_make_shards(tmp_path: Path) -> None:
    assert (
        main(
            [
                "make-shards",
                "-o",
                str(tmp_path / "o"),
                "--text",
                "5",
                "--video",
                "2",
                "--samples-per-shard",
                "4",
            ]
        )
        == 0
    )
    assert sorted(p.name for p in (tmp_path / "o").glob("*.tar")) == [
        "text-000000.tar",
        "text-000001.tar",
        "video-000000.tar",
    ]


_EXT = st.sampled_from(["txt", "json", "mp4", "cls", "npy", "seg.cls"])
_SAMPLE = st.dictionaries(_EXT, st.binary(max_size=1500), min_size=1, max_size=4)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(samples=st.lists(_SAMPLE, min_size=1, max_size=12))
def test_scan_offsets_round_trip_any_tar(tmp_path: Path, samples: list[dict[str, bytes]]) -> None:
    """Whatever webdataset writes, scanning finds every member at the right offset."""
    path = tmp_path / "h.tar"
    with TarWriter(str(path)) as w:
        for k, s in enumerate(samples):
            w.write({"__key__": f"k{k:04d}", **s})
    raws = list(iter_raw_samples(str(path), lambda ext: ext == "txt"))
    assert [r.key for r in raws] == [f"k{k:04d}" for k in range(len(samples))]
    for raw, want in zip(raws, samples):
        assert read_members(str(path), raw.members) == want
        assert set(raw.payload) == ({"txt"} & set(want))


def test_as_counter_accepts_tokenizer_objects(shard_paths: list[Path]) -> None:
    from fcp_data.readers.text import as_counter

    class Encoding:
        def __init__(self, ids: list[int]) -> None:
            self.ids = ids

    class FakeHFTokenizer:  # the shape of tokenizers.Tokenizer: encode() -> Encoding(.ids)
        def encode(self, text: str, add_special_tokens: bool = True) -> Encoding:
            return Encoding(list(range(len(text.split()))))

    counter = as_counter(FakeHFTokenizer())
    assert counter("a b c") == 3 and counter.spec.startswith("object:")
    assert as_counter(len)("abcd") == 4 and as_counter("bytes:2")("abcd") == 2
    with pytest.raises(ValueError, match="cannot count tokens"):
        as_counter(42)
    recs = list(stream_records(str(shard_paths[0]), counter=str.split))
    body = recs[0].fetch().get("txt")
    if body is not None:
        assert recs[0].text_tokens == len(body.decode().split())
