"""Media whose real size differs from the index (a lying sidecar) and 16-bit images: the same
rule on both loader paths (vision payload and placeholder `vision_input`), named or counted."""

from __future__ import annotations

import numpy as np
import pytest
from test_loader_vision import _index, _run
from vision_helpers import png, video_sample

from fcp_data.loader.global_batch import SampleReadError
from fcp_data.planner import CostModel
from fcp_data.vision.media import decode_video_frames, load_image

PATHS = {"vision path": {}, "text-side path": {"vision": None}}


@pytest.fixture(scope="module")
def cost() -> CostModel:
    return CostModel.from_model("qwen3-1.7b", "cpu")


def _liar() -> list[dict]:
    lie = video_sample("wide", 20, 96, 64, 10, seed=1)  # really 96x64
    lie["json"] = lie["json"].replace(b'"width": 96', b'"width": 192')  # sidecar: 192x64
    return [lie, {"__key__": "t0", "txt": b"the cat sits on the mat"}]


@pytest.mark.parametrize("path", PATHS)
def test_a_clip_of_another_size_than_indexed_raises_naming_it(tmp_path, tok, cost, path) -> None:
    index = _index(tmp_path, tok, "qwen2.5-vl", _liar())
    assert int(index.width[list(index.keys).index("wide")]) == 192  # the sidecar was believed
    with pytest.raises(SampleReadError, match=r"'wide'.*decodes at 96x64.*index says 192x64"):
        _run(index, tok, cost, 1, int(index.seqlens.sum()) + 64, **PATHS[path])


@pytest.mark.parametrize("path", PATHS)
def test_a_clip_of_another_size_is_a_counted_skip(tmp_path, tok, cost, path) -> None:
    index = _index(tmp_path, tok, "qwen2.5-vl", _liar())
    (mbs,) = _run(
        index, tok, cost, 1, int(index.seqlens.sum()) + 64, on_error="skip", **PATHS[path]
    )
    skipped = [(k, r) for mb in mbs for k, r in mb.skipped]
    assert [k for k, _ in skipped] == ["wide"] and "stretched" in skipped[0][1]
    assert sum(mb.num_loss_tokens for mb in mbs) > 0  # the text sample still trains


@pytest.mark.parametrize("path", PATHS)
def test_a_16_bit_png_is_refused_on_both_paths(tmp_path, tok, cost, path) -> None:
    """Pillow's convert("RGB") saturates I;16 (98.8% of values at 255): never sent as pixels."""
    samples = [{"__key__": "deep", "png": png(64, 64, 3, mode="I;16"), "txt": b"a cat"}]
    index = _index(tmp_path, tok, "qwen2.5-vl", samples)
    with pytest.raises(SampleReadError, match=r"'deep'.*mode 'I;16'.*8-bit RGB"):
        _run(index, tok, cost, 1, int(index.seqlens.sum()) + 64, **PATHS[path])
    (mbs,) = _run(
        index, tok, cost, 1, int(index.seqlens.sum()) + 64, on_error="skip", **PATHS[path]
    )
    assert [k for mb in mbs for k, _ in mb.skipped] == ["deep"]
    assert all(len(mb.vision) == 0 for mb in mbs)  # no saturated pixels reach a micro-batch


def test_size_checks_of_the_decoders() -> None:
    from fcp_data.readers.synth import encode_video

    mp4 = encode_video(4, 96, 64, 10, seed=0)
    assert decode_video_frames(mp4, [0, 1], (64, 96)).shape == (2, 64, 96, 3)
    with pytest.raises(ValueError, match=r"decodes at 96x64.*index says 48x64"):
        decode_video_frames(mp4, [0], (64, 48))
    im = png(30, 40, 0)
    assert np.asarray(load_image(im, (30, 40))).shape == (30, 40, 3)
    assert np.asarray(load_image(im, (0, 0))).shape == (30, 40, 3)  # unknown size: not checked
    with pytest.raises(ValueError, match="image decodes at 40x30"):
        load_image(im, (40, 30))
