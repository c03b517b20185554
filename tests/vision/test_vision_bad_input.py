"""Bad media on the vision path: a clear error naming the key, or a counted skip; shapes agree."""

from __future__ import annotations

import io

import numpy as np
import pytest
from test_loader_vision import _index, _run
from vision_helpers import make_tokenizer, png, video_sample

from fcp_data.errors import ConfigError
from fcp_data.loader import FCPDataLoader, LoaderOptions
from fcp_data.loader.global_batch import SampleReadError
from fcp_data.planner import Cluster, CostModel
from fcp_data.vision import VisionOptions


@pytest.fixture(scope="module")
def cost() -> CostModel:
    return CostModel.from_model("qwen3-1.7b", "cpu")


def _bad_videos() -> list[dict]:
    over = video_sample("over", 30, 96, 64, 10, seed=1)
    # the sidecar promises 60 frames; the file holds 30
    over["json"] = over["json"].replace(b'"num_frames": 30', b'"num_frames": 60')
    cut = video_sample("cut", 30, 96, 64, 10, seed=2)
    cut["mp4"] = cut["mp4"][: len(cut["mp4"]) * 2 // 3]  # a file cut short: frames fail
    good = {"__key__": "t0", "txt": b"the cat sits on the mat"}
    return [over, cut, good]


def test_video_frames_differing_from_index_raise_naming_key(tmp_path, tok, cost) -> None:
    index = _index(tmp_path, tok, "qwen2.5-vl", _bad_videos())
    with pytest.raises(SampleReadError, match=r"'(over|cut)'") as e:
        _run(index, tok, cost, 1, int(index.seqlens.sum()) + 64)
    msg = str(e.value)
    assert ("decodes 30 frames" in msg and "re-probe" in msg) or "decoding failed" in msg


def test_bad_videos_skipped_and_counted_group_shapes_agree(tmp_path, tok, cost) -> None:
    index = _index(tmp_path, tok, "qwen2.5-vl", _bad_videos())
    cap = int(index.seqlens.max()) // 2 + 64
    per_replica = _run(index, tok, cost, 2, cap, on_error="skip")
    skipped = {k for mbs in per_replica for mb in mbs for k, _ in mb.skipped}
    assert skipped == {"over", "cut"}
    reasons = [r for mbs in per_replica for mb in mbs for k, r in mb.skipped if k == "over"]
    assert all("decodes 30 frames" in r for r in reasons)
    for waves in zip(*per_replica):
        groups = {}
        for mb in waves:
            if not mb.rank_plan.is_empty:
                groups.setdefault(mb.rank_plan.group_replicas, []).append(mb)
        for mbs in groups.values():  # every member of a group has the same token shapes
            assert len({mb.num_tokens for mb in mbs}) == 1
            assert len({tuple(mb.cu_seqlens_padded.tolist()) for mb in mbs}) == 1
            for mb in mbs:
                for k, key in enumerate(mb.keys):
                    if key in skipped:  # masked out here: no loss, no pixels, no pads kept
                        a, b = mb.local_cu_seqlens_padded[k : k + 2].tolist()
                        assert mb.loss_mask[a:b].sum() == 0
                        assert not (mb.vision_runs[:, 0] == k).any()


def test_image_modes_converted_or_refused(tmp_path, tok, cost) -> None:
    from PIL import Image
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    samples = [
        {"__key__": "cmyk", "jpg": png(80, 120, 1, mode="CMYK"), "txt": b"a cat"},
        {"__key__": "pal", "png": png(60, 60, 2, mode="P"), "txt": b"a mat"},
        {"__key__": "deep", "png": png(64, 64, 3, mode="I;16"), "txt": b"a cat"},
    ]
    index = _index(tmp_path, tok, "qwen2.5-vl", samples)
    cap = int(index.seqlens.sum()) + 64
    with pytest.raises(SampleReadError, match=r"'deep'.*mode 'I;16'.*8-bit RGB"):
        _run(index, tok, cost, 1, cap)
    (mbs,) = _run(index, tok, cost, 1, cap, on_error="skip")
    (mb,) = mbs
    assert [k for k, _ in mb.skipped] == ["deep"]
    proc = Qwen2VLImageProcessorPil(min_pixels=4 * 28 * 28, max_pixels=16384 * 28 * 28)
    rows = {}
    at = 0
    for (t, h, w), (k, _kind, _first, _n) in zip(mb.grid_thw.tolist(), mb.vision_runs.tolist()):
        rows[mb.keys[k]] = mb.pixel_values[at : at + t * h * w].numpy()
        at += t * h * w
    for s in samples[:2]:  # converted to RGB exactly as the processor converts them
        data = s.get("jpg", s.get("png"))
        ref = proc(images=[Image.open(io.BytesIO(data))], return_tensors="np")["pixel_values"]
        np.testing.assert_array_equal(rows[s["__key__"]], ref)


def test_tokenizer_missing_template_token_fails_at_construction(tmp_path, tok, cost) -> None:
    bare = make_tokenizer(specials=["<|endoftext|>"])
    index = _index(tmp_path, bare, "qwen2.5-vl", [video_sample("v", 20, 64, 64, 10, seed=0)])
    with pytest.raises(ConfigError, match=r"<\|vision_start\|>.*add_special_tokens"):
        FCPDataLoader(
            index,
            cluster=Cluster(1, tokens_per_replica=4096),
            cost=cost,
            replica=0,
            global_batch_size=1,
            num_workers=0,
            tokenizer=bare,
            options=LoaderOptions(vision=VisionOptions()),
        )
