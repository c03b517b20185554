"""`LoaderOptions.decode_backend` is honoured on both loader paths, and a missing decoder is
fatal on both, never a counted bad sample.

The vision (pixel payload) path used to ignore decode_backend="decord" (0 decord calls, every
clip through PyAV), and with PyAV missing and on_error="skip" it skipped every video as a bad
sample: a whole video corpus dropped with exit 0. Here decord's VideoReader is wrapped to count
its calls, and PyAV is made unimportable (sys.modules["av"] = None) after the loader is built,
so the failure happens where a worker decodes.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
from test_loader_vision import _index, _run
from vision_helpers import video_sample

from fcp_data.errors import ConfigError, MissingDependencyError
from fcp_data.loader import FCPDataLoader, LoaderOptions
from fcp_data.planner import Cluster, CostModel
from fcp_data.vision import VisionOptions

PATHS = {"vision path": {}, "placeholder path": {"vision": None}}


@pytest.fixture(scope="module")
def cost() -> CostModel:
    return CostModel.from_model("qwen3-1.7b", "cpu")


def _samples() -> list[dict]:
    return [
        video_sample("v0", 40, 96, 64, 10, seed=0),
        video_sample("v1", 30, 64, 48, 10, seed=1),
        {"__key__": "t0", "txt": b"the cat sits on the mat"},
    ]


def _pixels(mbs: list) -> list[np.ndarray]:
    out = []
    for mb in mbs:
        if getattr(mb, "pixel_values", None) is not None and mb.pixel_values.numel():
            out.append(mb.pixel_values.numpy())
        out += [v.pixels.numpy() for v in mb.vision]
    return out


@pytest.mark.parametrize("path", PATHS)
def test_decord_is_used_when_named_and_gives_pyavs_frames(
    tmp_path, tok, cost, path, monkeypatch
) -> None:
    decord = pytest.importorskip("decord")
    index = _index(tmp_path, tok, "qwen2.5-vl", _samples())
    cap = int(index.seqlens.max()) // 2 + 64
    calls = []
    real = decord.VideoReader

    def counting(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(decord, "VideoReader", counting)
    got = _run(index, tok, cost, 2, cap, decode_backend="decord", **PATHS[path])
    assert len(calls) >= 2  # both clips (on both replicas) went through decord
    n = len(calls)
    want = _run(index, tok, cost, 2, cap, decode_backend="pyav", **PATHS[path])
    assert len(calls) == n  # and PyAV's run did not touch it
    for a, b in zip(got, want, strict=True):
        pa, pb = _pixels(a), _pixels(b)
        assert pa and len(pa) == len(pb)
        for x, y in zip(pa, pb, strict=True):
            np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("path", PATHS)
def test_a_named_backend_that_does_not_load_stops_the_constructor(
    tmp_path, tok, cost, path, monkeypatch
) -> None:
    index = _index(tmp_path, tok, "qwen2.5-vl", _samples())
    monkeypatch.setitem(sys.modules, "torchcodec", None)
    monkeypatch.setitem(sys.modules, "torchcodec.decoders", None)
    with pytest.raises(MissingDependencyError, match="torchcodec"):
        _run(index, tok, cost, 1, int(index.seqlens.sum()) + 64, decode_backend="torchcodec",
             on_error="skip", **PATHS[path])  # fmt: skip


@pytest.mark.parametrize("path", PATHS)
def test_pyav_missing_where_frames_are_decoded_is_fatal_not_a_skip(
    tmp_path, tok, cost, path, monkeypatch
) -> None:
    index = _index(tmp_path, tok, "qwen2.5-vl", _samples())
    opts = {"vision": VisionOptions(), **PATHS[path]}
    ld = FCPDataLoader(
        index,
        cluster=Cluster(1, tokens_per_replica=int(index.seqlens.sum()) + 64),
        cost=cost,
        replica=0,
        global_batch_size=len(index.seqlens),
        num_workers=0,
        tokenizer=tok,
        options=LoaderOptions(decode_backend="pyav", on_error="skip", **opts),
    )
    monkeypatch.setitem(sys.modules, "av", None)  # gone after the loader was built
    with pytest.raises(MissingDependencyError, match=r"'av'.*fcp\[video\]"):
        list(ld)


def test_a_text_corpus_needs_no_decoder(tmp_path, tok, cost, monkeypatch) -> None:
    """decode_backend is resolved only when the source holds a video."""
    samples = [{"__key__": f"t{i}", "txt": b"the cat sits on the mat " * (i + 1)} for i in range(4)]
    index = _index(tmp_path, tok, "qwen2.5-vl", samples)
    for mod in ("av", "torchcodec", "torchcodec.decoders"):
        monkeypatch.setitem(sys.modules, mod, None)
    (mbs,) = _run(index, tok, cost, 1, int(index.seqlens.sum()) + 64)
    assert sum(mb.num_loss_tokens for mb in mbs) > 0


@pytest.mark.parametrize(
    ("backend", "device", "match"),
    [
        ("ffmpeg", "cpu", r"decode_backend='ffmpeg'; allowed: 'auto', 'pyav'"),
        ("pyav", "gpu", r"decode_device='gpu'; allowed: 'cpu', 'cuda'"),
        ("pyav", "cuda", r"only torchcodec decodes on the GPU"),
    ],
)
def test_bad_decode_options_are_named(backend, device, match) -> None:
    with pytest.raises(ConfigError, match=match):
        LoaderOptions(decode_backend=backend, decode_device=device)


def _bad_clips() -> list[dict]:
    wide = video_sample("wide", 20, 96, 64, 10, seed=1)  # really 96x64, sidecar says 192x64
    wide["json"] = wide["json"].replace(b'"width": 96', b'"width": 192')
    short = video_sample("short", 20, 64, 48, 10, seed=2)  # 20 frames, sidecar says 60
    short["json"] = short["json"].replace(b'"num_frames": 20', b'"num_frames": 60')
    return [wide, short, {"__key__": "t0", "txt": b"the cat sits on the mat"}]


@pytest.mark.parametrize("path", PATHS)
def test_bad_clips_are_the_same_counted_skips_on_every_backend(tmp_path, tok, cost, path) -> None:
    """Another size than indexed and fewer frames than indexed: a skip naming the key, with
    the same reason whichever library decoded it (the messages are built in one place)."""
    backends = ["pyav"] + (["decord"] if _loads("decord") else [])
    index = _index(tmp_path, tok, "qwen2.5-vl", _bad_clips())
    cap = int(index.seqlens.sum()) + 64
    reasons = {}
    for backend in backends:
        (mbs,) = _run(index, tok, cost, 1, cap, on_error="skip", decode_backend=backend,
                      **PATHS[path])  # fmt: skip
        skipped = dict(kv for mb in mbs for kv in mb.skipped)
        assert set(skipped) == {"wide", "short"}, skipped
        assert "stretched" in skipped["wide"] and "192x64" in skipped["wide"]
        assert "20 decodable frames" in skipped["short"] and "over-reports" in skipped["short"]
        assert sum(mb.num_loss_tokens for mb in mbs) > 0  # the text sample still trains
        reasons[backend] = {k: r.replace(backend, "<backend>") for k, r in skipped.items()}
    assert all(r == reasons["pyav"] for r in reasons.values()), reasons


def _loads(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True
