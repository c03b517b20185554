"""Pixel payload: rows equal the processor's; every replica's share reassembles the whole sample."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from vision_helpers import png, qwen_vl_utils_vision_process

from fcp_data.collate import pack_shard
from fcp_data.readers.synth import encode_video
from fcp_data.vision import SpecialTokenIds, TokenizerText, VisionOptions
from fcp_data.vision.encode import encode_media
from fcp_data.vision.families import get_rule
from fcp_data.vision.media import decode_video_frames, resize_frames
from fcp_data.vision.options import family_spec
from fcp_data.vision.payload import PayloadParts, sequence_payload
from fcp_data.vision.pixels import CLIP_MEAN, CLIP_STD, normalize


def _documented_rows(frames: np.ndarray, p: int, m: int = 2, tps: int = 2) -> np.ndarray:
    """Qwen2VLVideoProcessor.patchify's documented reshape, written out with torch."""
    t, c, h, w = frames.shape
    gt, gh, gw = t // tps, h // p, w // p
    x = torch.from_numpy(frames).view(1, gt, tps, c, gh // m, m, p, gw // m, m, p)
    x = x.permute(0, 1, 4, 7, 5, 8, 3, 2, 6, 9)
    return x.reshape(gt * gh * gw, c * tps * p * p).numpy()


def _encode(tok, name, kind, vt, media_len=0, n=0, fps=0.0):
    text = TokenizerText(tok)
    spec = family_spec(name, 16 if name == "qwen3-vl" else 14)
    cap = np.asarray(text("a cat on a mat"), dtype=np.int64)
    em = encode_media(
        vt,
        kind=kind,
        spec=spec,
        options=VisionOptions(),
        token_ids=SpecialTokenIds.from_tokenizer(tok, name),
        text_ids=text,
        caption=cap,
        eod=1,
        eod_id=0,
        num_frames=n,
        fps=fps,
    )
    return em, spec


def _shares(em, spec, media, degree):
    """Each replica's PayloadParts and packed shard for one sequence at `degree`."""
    out = []
    for r in range(degree):
        packed = pack_shard([em.tokens], degree=degree, index=r, targets=[em.targets])
        parts = PayloadParts()
        sequence_payload(
            parts,
            0,
            layout=em.layout,
            media=media,
            mrope=em.mrope,
            length=em.tokens.size,
            held=packed.global_positions[0],
            offset=0,
            padded_len=int(packed.cu_seqlens_padded[1]),
            spec=spec,
            opts=VisionOptions(),
        )
        out.append((packed, parts))
    return out


def test_image_rows_equal_qwen2vl_image_processor(tok) -> None:
    from PIL import Image
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    rule = get_rule("qwen2.5-vl")
    proc = Qwen2VLImageProcessorPil(min_pixels=4 * 28 * 28, max_pixels=16384 * 28 * 28)
    for h, w in ((100, 150), (333, 517), (56, 900)):
        data = png(h, w, seed=h)
        vt = rule.image(height=h, width=w)
        em, spec = _encode(tok, "qwen2.5-vl", 1, vt)
        ((_packed, parts),) = _shares(em, spec, data, 1)
        import io

        ref = proc(images=[Image.open(io.BytesIO(data))], return_tensors="np")
        assert parts.grid_thw == [tuple(ref["image_grid_thw"][0])]
        np.testing.assert_array_equal(parts.pixel_values[0], ref["pixel_values"])
        # the documented video reshape on the image repeated to 2 frames gives the same rows
        im = np.asarray(
            Image.open(io.BytesIO(data))
            .convert("RGB")
            .resize((vt.resized[1], vt.resized[0]), Image.Resampling.BICUBIC)
        )
        x = normalize(np.repeat(im[None], 2, axis=0), CLIP_MEAN, CLIP_STD)
        np.testing.assert_array_equal(_documented_rows(x, 14), ref["pixel_values"])


@pytest.mark.parametrize(
    ("name", "degree", "over", "n"),
    [
        ("qwen2.5-vl", 3, {}, 80),
        ("qwen3-vl", 3, {}, 80),
        ("qwen2-vl", 4, {}, 80),
        # HF frame sampling: 45 frames at 10 fps -> 9 frames, padded by repeating the last
        ("qwen3-vl", 3, {"hf_frame_sampling": True}, 45),
    ],
)
def test_video_shares_reassemble_the_single_device_rows(tok, name, degree, over, n) -> None:
    fps, w, h = 10, 96, 64
    data = encode_video(n, w, h, fps, seed=3)
    rule = get_rule(name, text_counter=lambda s: len(TokenizerText(tok)(s)), **over)
    vt = rule.video(num_frames=n, fps=fps, height=h, width=w)
    if over:
        assert len(vt.frame_indices) == 10 and vt.frame_indices[-1] == vt.frame_indices[-2]
    em, spec = _encode(tok, name, 2, vt, n=n, fps=fps)
    p = spec.patch
    # single device: every frame the rule samples, the processor's documented layout
    frames = resize_frames(decode_video_frames(data, vt.frame_indices), vt.resized)
    full = _documented_rows(normalize(frames, spec.mean, spec.std), p)
    rows_per_unit = vt.grid[1] * vt.grid[2]
    assert full.shape == (vt.grid[0] * rows_per_unit, 3 * 2 * p * p)
    filled = {}
    owners: dict[int, int] = {}
    units_encoded = partial = 0
    for packed, parts in _shares(em, spec, data, degree):
        at = 0
        for (t, gh, gw), (_k, kind, first, count), rows, scatter in zip(
            parts.grid_thw, parts.runs, parts.pixel_values, parts.scatter
        ):
            assert (kind, t, gh, gw) == (2, count, vt.grid[1], vt.grid[2])
            assert rows.shape[0] == t * gh * gw and scatter.size == t * gh * gw // 4
            for u in range(first, first + count):
                owners[u] = owners.get(u, 0) + 1
            want = full[first * rows_per_unit : (first + count) * rows_per_unit]
            np.testing.assert_array_equal(rows, want)  # exact rows of those tubelets
            for i, local in enumerate(scatter):  # merged row i of the run -> token position
                if local >= 0:
                    g = int(packed.position_ids[local])
                    u, j = first + i // (rows_per_unit // 4), i % (rows_per_unit // 4)
                    assert g == em.layout.unit_starts[u] + j  # the token of that merged row
                    assert g not in filled, "a token filled twice"
                    filled[g] = True
            at += t
        kept = sum(int((s >= 0).sum()) for s in parts.scatter)
        pads = np.isin(
            packed.position_ids,
            np.concatenate(
                [np.arange(*em.layout.unit_range(u)) for u in range(em.layout.num_units)]
            ),
        )
        assert kept == int(pads.sum())  # count check: every held pad filled, nothing else
        units_encoded += parts.units
        partial += parts.partial_units
        # M-RoPE of the share is the whole sample's ids at the held positions
        held = packed.global_positions[0]
        real = held < em.tokens.size
        np.testing.assert_array_equal(parts.mrope[0][:, real], em.mrope[:, held[real]])
    assert len(filled) == vt.vision  # every pad of the video filled exactly once overall
    assert sorted(owners) == list(range(vt.grid[0])) and units_encoded == sum(owners.values())
    # a tubelet cut by a chunk edge is encoded by each owner, and each counts it as partial
    assert partial == sum(c for c in owners.values() if c > 1) > 0


def test_internvl_tiles_reassemble_to_the_hf_processor_output(tok) -> None:
    """InternVL in transformers tiles with GotOcr2's processor: same grid, order, thumbnail."""
    import io

    from PIL import Image
    from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import (
        GotOcr2ImageProcessorPil,
    )

    from fcp_data.vision.pixels import IMAGENET_MEAN, IMAGENET_STD

    proc = GotOcr2ImageProcessorPil(
        crop_to_patches=True,
        size={"height": 448, "width": 448},
        image_mean=IMAGENET_MEAN,
        image_std=IMAGENET_STD,
        min_patches=1,
        max_patches=12,
    )
    rule = get_rule("internvl")
    for h, w in ((500, 900), (1000, 700), (123, 456)):
        data = png(h, w, seed=h)
        vt = rule.image(height=h, width=w)
        em, spec = _encode(tok, "internvl", 1, vt)
        full = proc(images=[Image.open(io.BytesIO(data))], return_tensors="np")["pixel_values"]
        tiles = vt.grid[0]
        assert full.shape == (tiles, 3, 448, 448) and tiles == vt.grid[1] * vt.grid[2] + 1
        seen = set()
        for _packed, parts in _shares(em, spec, data, 3):
            assert parts.mrope == []  # InternVL: 1-D positions only
            for (t, gh, gw), (_k, _kind, first, count), px in zip(
                parts.grid_thw, parts.runs, parts.pixel_values
            ):
                assert (t, gh, gw) == (count, 32, 32) and px.shape == (count, 3, 448, 448)
                np.testing.assert_array_equal(px, full[first : first + count])
                seen.update(range(first, first + count))
        assert seen == set(range(tiles))


def test_frame_indices_equal_qwen_vl_utils() -> None:
    vp = qwen_vl_utils_vision_process()
    checked = 0
    for name, patch in (("qwen2.5-vl", 14), ("qwen3-vl", 16)):
        rule = get_rule(name)
        for total in (4, 9, 30, 121, 300, 1801, 5000):
            for fps in (1.0, 7.5, 29.97, 60.0):
                for h, w in ((64, 96), (1080, 1920), (720, 406)):
                    vt = rule.video(num_frames=total, fps=fps, height=h, width=w)
                    n = vp.smart_nframes({}, total_frames=total, video_fps=fps)
                    idx = torch.linspace(0, total - 1, n).round().long().tolist()
                    assert list(vt.frame_indices) == idx
                    f = patch * 2
                    min_px = vp.VIDEO_MIN_TOKEN_NUM * f * f
                    max_px = max(
                        min(vp.VIDEO_MAX_TOKEN_NUM * f * f, vp.MODEL_SEQ_LEN * f * f * 0.9 / n * 2),
                        int(min_px * 1.05),
                    )
                    want = vp.smart_resize(h, w, factor=f, min_pixels=min_px, max_pixels=max_px)
                    assert vt.resized == tuple(want)
                    assert vt.vision == n // 2 * (want[0] // f) * (want[1] // f)
                    checked += 1
    assert checked == 2 * 7 * 4 * 3
