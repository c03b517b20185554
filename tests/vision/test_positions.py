"""M-RoPE ids equal transformers' get_rope_index on the unsharded sample (tiny offline models)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fcp_data.vision import SpecialTokenIds, TokenizerText, VisionOptions, mrope_positions, render
from fcp_data.vision.encode import encode_media
from fcp_data.vision.families import get_rule
from fcp_data.vision.options import family_spec

TEXT_CFG = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    vocab_size=512,
)


@pytest.fixture(scope="module")
def qwen25():
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLModel

    cfg = Qwen2_5_VLConfig(
        text_config={**TEXT_CFG, "rope_scaling": {"type": "mrope", "mrope_section": [2, 1, 1]}},
        vision_config=dict(
            depth=1,
            hidden_size=16,
            intermediate_size=32,
            num_heads=2,
            out_hidden_size=32,
            tokens_per_second=2,
            fullatt_block_indexes=[0],
        ),
    )
    return Qwen2_5_VLModel(cfg).eval()


@pytest.fixture(scope="module")
def qwen3():
    from transformers import Qwen3VLConfig, Qwen3VLModel

    cfg = Qwen3VLConfig(
        text_config={
            **TEXT_CFG,
            "head_dim": 16,
            "rope_scaling": {
                "rope_type": "default",
                "mrope_section": [4, 2, 2],
                "mrope_interleaved": True,
            },
        },
        vision_config=dict(
            depth=1,
            hidden_size=16,
            intermediate_size=32,
            num_heads=2,
            out_hidden_size=32,
            deepstack_visual_indexes=[0],
            num_position_embeddings=16,
        ),
    )
    return Qwen3VLModel(cfg).eval()


def _sample(tok, name, kind, vt, opts, num_frames=0, fps=0.0):
    text = TokenizerText(tok)
    ids = SpecialTokenIds.from_tokenizer(tok, name)
    cap = np.asarray(text("the cat sits on the mat"), dtype=np.int64)
    em = encode_media(
        vt,
        kind=kind,
        spec=family_spec(name, 16 if name == "qwen3-vl" else 14),
        options=opts,
        token_ids=ids,
        text_ids=text,
        caption=cap,
        eod=1,
        eod_id=0,
        num_frames=num_frames,
        fps=fps,
    )
    types = np.zeros(em.tokens.size, dtype=np.int64)
    for u in range(em.layout.num_units):
        types[slice(*em.layout.unit_range(u))] = kind
    return em, torch.from_numpy(em.tokens)[None], torch.from_numpy(types)[None]


CLIPS = [(30, 30.0, 360, 640), (240, 24.0, 224, 224), (90, 30.0, 112, 1000), (8, 4.0, 64, 64)]


@pytest.mark.parametrize("convention", ["measured", "constant"])
def test_qwen25_video_positions_equal_get_rope_index(tok, qwen25, convention) -> None:
    rule = get_rule("qwen2.5-vl", text_counter=lambda s: len(TokenizerText(tok)(s)))
    opts = VisionOptions(second_per_grid=convention, next_text="spatial", tokens_per_second=2)
    for n, fps, h, w in CLIPS:
        vt = rule.video(num_frames=n, fps=fps, height=h, width=w)
        em, ids, types = _sample(tok, "qwen2.5-vl", 2, vt, opts, n, fps)
        # qwen-vl-utils: sample_fps = nframes / total * fps; the processor: 2 / fps per grid
        sample_fps = len(vt.frame_indices) / n * fps
        spg = 2 / sample_fps if convention == "measured" else 2 / 2.0
        want, _ = qwen25.get_rope_index(
            ids,
            types,
            video_grid_thw=torch.tensor([vt.grid]),
            second_per_grid_ts=torch.tensor([spg]),
        )
        np.testing.assert_array_equal(em.mrope, want[:, 0].numpy(), err_msg=str((n, fps)))
    # the clamped 1 s clip: the two conventions really differ there (4 frames -> 0.5 s/grid)
    vt = rule.video(num_frames=30, fps=30.0, height=64, width=64)
    a = _sample(tok, "qwen2.5-vl", 2, vt, VisionOptions(second_per_grid="measured"), 30, 30.0)
    b = _sample(tok, "qwen2.5-vl", 2, vt, VisionOptions(second_per_grid="constant"), 30, 30.0)
    assert not np.array_equal(a[0].mrope, b[0].mrope)


def test_qwen25_image_positions_and_text_before(tok, qwen25) -> None:
    rule = get_rule("qwen2.5-vl", text_counter=lambda s: len(TokenizerText(tok)(s)))
    for h, w in ((300, 200), (56, 56), (1080, 1920)):
        vt = rule.image(height=h, width=w)
        for nt in ("spatial", "max+1"):  # identical for images
            em, ids, types = _sample(tok, "qwen2.5-vl", 1, vt, VisionOptions(next_text=nt))
            want, _ = qwen25.get_rope_index(ids, types, image_grid_thw=torch.tensor([vt.grid]))
            np.testing.assert_array_equal(em.mrope, want[:, 0].numpy())
    # media after a text prefix: render at an offset, ids from the same function
    text = TokenizerText(tok)
    vt = rule.video(num_frames=60, fps=30.0, height=112, width=112)
    prefix = np.asarray(text("look at this"), dtype=np.int64)
    tpl, lay = render(
        vt,
        kind=2,
        family="qwen",
        token_ids=SpecialTokenIds.from_tokenizer(tok, "qwen2.5-vl"),
        text_ids=text,
        offset=prefix.size,
    )
    seq = np.concatenate([prefix, tpl, prefix])
    sample_fps = len(vt.frame_indices) / 60 * 30.0
    interval = np.float32(2) * np.float32(2 / sample_fps)
    ours = mrope_positions(seq.size, [lay], interval=float(interval), next_text="spatial")
    types = np.zeros(seq.size, dtype=np.int64)
    types[prefix.size + 1 : prefix.size + 1 + vt.vision] = 2
    want, _ = qwen25.get_rope_index(
        torch.from_numpy(seq)[None],
        torch.from_numpy(types)[None],
        video_grid_thw=torch.tensor([vt.grid]),
        second_per_grid_ts=torch.tensor([2 / sample_fps]),
    )
    np.testing.assert_array_equal(ours, want[:, 0].numpy())


def test_next_text_conventions_differ_only_past_the_spatial_extent() -> None:
    """12 tubelets at interval 2 on a 4x4 merged grid: temporal ids reach s+22 > s+3."""
    from fcp_data.vision.families import VisionTokens
    from fcp_data.vision.template import MediaLayout

    vt = VisionTokens(
        vision=12 * 16, special=2, frame_indices=(), resized=(224, 224), grid=(12, 8, 8)
    )
    lay = MediaLayout(
        kind=2,
        family="qwen",
        unit_tokens=16,
        unit_starts=np.arange(1, 1 + 12 * 16, 16),
        pad_runs=((1, 0, 12),),
        vt=vt,
    )
    L = 1 + 12 * 16 + 3
    a = mrope_positions(L, [lay], interval=2.0, next_text="max+1")
    b = mrope_positions(L, [lay], interval=2.0, next_text="spatial")
    assert a[0, 1 + 16 * 11] == 1 + 22  # last tubelet's temporal id
    assert a[:, -3].tolist() == [1 + 22 + 1] * 3  # Qwen's code: one past the largest id
    assert b[:, -3].tolist() == [1 + 4] * 3  # transformers 5.x: start + max(h, w)
    np.testing.assert_array_equal(a[:, :-3], b[:, :-3])


def test_qwen3_positions_restart_per_group_and_equal_get_rope_index(tok, qwen3) -> None:
    rule = get_rule("qwen3-vl", text_counter=lambda s: len(TokenizerText(tok)(s)))
    for n, fps, h, w in CLIPS:
        vt = rule.video(num_frames=n, fps=fps, height=h, width=w)
        em, ids, types = _sample(tok, "qwen3-vl", 2, vt, VisionOptions(), n, fps)
        want, _ = qwen3.get_rope_index(ids, types, video_grid_thw=torch.tensor([vt.grid]))
        np.testing.assert_array_equal(em.mrope, want[:, 0].numpy())
        starts = [s for s, _, _ in em.layout.pad_runs]
        # temporal id of every group equals its own start id: time lives in the timestamps
        assert all(em.mrope[0, s] == em.mrope[1, s] for s in starts)
    vt = rule.image(height=300, width=500)
    em, ids, types = _sample(tok, "qwen3-vl", 1, vt, VisionOptions())
    want, _ = qwen3.get_rope_index(ids, types, image_grid_thw=torch.tensor([vt.grid]))
    np.testing.assert_array_equal(em.mrope, want[:, 0].numpy())


def test_qwen2vl_video_positions_count_tubelets_unscaled(tok) -> None:
    from transformers import Qwen2VLConfig, Qwen2VLModel

    cfg = Qwen2VLConfig(
        text_config={**TEXT_CFG, "rope_scaling": {"type": "mrope", "mrope_section": [2, 1, 1]}},
        vision_config=dict(depth=1, embed_dim=16, hidden_size=32, num_heads=2, mlp_ratio=2),
    )
    model = Qwen2VLModel(cfg).eval()
    rule = get_rule("qwen2-vl", text_counter=lambda s: len(TokenizerText(tok)(s)))
    for n, fps, h, w in CLIPS:
        vt = rule.video(num_frames=n, fps=fps, height=h, width=w)
        em, ids, types = _sample(tok, "qwen2-vl", 2, vt, VisionOptions(next_text="spatial"), n, fps)
        want, _ = model.get_rope_index(ids, types, video_grid_thw=torch.tensor([vt.grid]))
        np.testing.assert_array_equal(em.mrope, want[:, 0].numpy())
