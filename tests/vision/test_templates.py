"""Templates: every rule's count equals the emitted length; ids equal the processors' expansion."""

from __future__ import annotations

from functools import partial
from types import SimpleNamespace

import numpy as np
import pytest

from fcp_data.errors import ConfigError
from fcp_data.vision import SpecialTokenIds, TokenizerText, render
from fcp_data.vision.families import get_rule
from fcp_data.vision.options import family_spec

SIZES = [(64, 96), (480, 640), (1080, 1920), (33, 500)]
VIDEOS = [(8, 4.0), (30, 10.0), (301, 29.97), (1800, 30.0)]


def _rule(name: str, text):  # the loader's rule: template text counted by its tokenizer
    over = {"num_frames": 12} if name == "internvl" else {}
    return get_rule(name, text_counter=lambda s: len(text(s)), **over)


@pytest.mark.parametrize("name", ["qwen2-vl", "qwen2.5-vl", "qwen3-vl", "internvl"])
def test_count_equals_emitted_length_for_every_rule(tok, name) -> None:
    text = TokenizerText(tok)
    rule = _rule(name, text)
    ids = SpecialTokenIds.from_tokenizer(tok, name)
    fam = family_spec(name).family
    checked = 0
    for h, w in SIZES:
        cases = [(1, rule.image(height=h, width=w))]
        cases += [(2, rule.video(num_frames=n, fps=f, height=h, width=w)) for n, f in VIDEOS]
        for kind, vt in cases:
            toks, lay = render(vt, kind=kind, family=fam, token_ids=ids, text_ids=text)
            assert toks.size == vt.total  # the index's count is the emitted length
            pad = ids[{"qwen": "video_pad" if kind == 2 else "image_pad"}.get(fam, "img_context")]
            assert int((toks == pad).sum()) == vt.vision
            for u in range(lay.num_units):  # each unit's pads are one contiguous run
                s, e = lay.unit_range(u)
                assert (toks[s:e] == pad).all()
            assert lay.num_units * lay.unit_tokens == vt.vision
            checked += 1
    assert checked == len(SIZES) * (1 + len(VIDEOS))


def test_qwen25_ids_equal_processor_expansion(tok) -> None:
    """Qwen2.5-VL's processor expands one <|video_pad|> to grid.prod()/4 inside start/end."""
    from transformers.models.qwen2_5_vl.processing_qwen2_5_vl import Qwen2_5_VLProcessor

    text = TokenizerText(tok)
    rule = _rule("qwen2.5-vl", text)
    ids = SpecialTokenIds.from_tokenizer(tok, "qwen2.5-vl")
    for kind, vt in (
        (2, rule.video(num_frames=90, fps=30, height=360, width=640)),
        (1, rule.image(height=300, width=200)),
    ):
        fake = SimpleNamespace(
            video_processor=SimpleNamespace(merge_size=2),
            image_processor=SimpleNamespace(merge_size=2),
            video_token="<|video_pad|>",
            image_token="<|image_pad|>",
        )
        grid = np.array([vt.grid])
        if kind == 2:
            pads = Qwen2_5_VLProcessor.replace_video_token(fake, {"video_grid_thw": grid}, 0)
        else:
            pads = Qwen2_5_VLProcessor.replace_image_token(fake, {"image_grid_thw": grid}, 0)
        want = tok.encode("<|vision_start|>" + pads + "<|vision_end|>").ids
        got, _ = render(vt, kind=kind, family="qwen", token_ids=ids, text_ids=text)
        assert got.tolist() == want


def test_qwen3_ids_equal_processor_placeholder(tok) -> None:
    """Qwen3-VL: per temporal group "<t seconds>" + start + pads + end, t from frame indices."""
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor

    text = TokenizerText(tok)
    rule = _rule("qwen3-vl", text)
    ids = SpecialTokenIds.from_tokenizer(tok, "qwen3-vl")
    for n, fps in ((90, 30.0), (301, 29.97), (8, 4.0)):
        vt = rule.video(num_frames=n, fps=fps, height=360, width=640)
        meta = SimpleNamespace(fps=fps, frames_indices=list(vt.frame_indices))
        fake = SimpleNamespace(
            video_processor=SimpleNamespace(merge_size=2, temporal_patch_size=2),
            video_token="<|video_pad|>",
            vision_start_token="<|vision_start|>",
            vision_end_token="<|vision_end|>",
        )
        fake._calculate_timestamps = partial(Qwen3VLProcessor._calculate_timestamps, fake)
        inputs = {"video_grid_thw": np.array([vt.grid]), "video_metadata": [meta]}
        placeholder = Qwen3VLProcessor.replace_video_token(fake, inputs, 0)
        got, lay = render(vt, kind=2, family="qwen", token_ids=ids, text_ids=text)
        assert got.tolist() == tok.encode(placeholder).ids
        assert len(lay.pad_runs) == vt.grid[0]  # one M-RoPE run per temporal group


def test_internvl_image_ids_equal_processor_expansion(tok) -> None:
    text = TokenizerText(tok)
    rule = _rule("internvl", text)
    ids = SpecialTokenIds.from_tokenizer(tok, "internvl")
    vt = rule.image(height=600, width=1000)
    tiles = vt.grid[0]
    want = tok.encode("<img>" + "<IMG_CONTEXT>" * 256 * tiles + "</img>").ids
    got, _ = render(vt, kind=1, family="internvl", token_ids=ids, text_ids=text)
    assert got.tolist() == want
    vid = rule.video(num_frames=40, fps=10, height=480, width=640)
    got, lay = render(vid, kind=2, family="internvl", token_ids=ids, text_ids=text)
    frames = "\n".join(
        f"Frame-{i + 1}: <img>" + "<IMG_CONTEXT>" * 256 + "</img>" for i in range(12)
    )
    assert got.tolist() == [t for part in _pieces(frames) for t in tok.encode(part).ids]
    assert lay.num_units == 12 and lay.unit_tokens == 256


def _pieces(s: str) -> list[str]:  # text parts tokenized separately: "\n", "Frame-i: ", specials
    out = []
    for line_no, line in enumerate(s.split("\n")):
        if line_no:
            out.append("\n")
        head, rest = line.split("<img>", 1)
        out += [head, "<img>" + rest]
    return out


def test_missing_special_token_is_named(tok) -> None:
    from vision_helpers import make_tokenizer

    bare = make_tokenizer(specials=["<|endoftext|>", "<|vision_start|>", "<|vision_end|>"])
    with pytest.raises(ConfigError, match=r"<\|video_pad\|>.*qwen2.5-vl"):
        SpecialTokenIds.from_tokenizer(bare, "qwen2.5-vl")
    with pytest.raises(ConfigError, match="img_context"):
        SpecialTokenIds(family="internvl", ids={"img_start": 1, "img_end": 2})
    # a transformers tokenizer wrapping the same vocabulary resolves the same ids
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=tok)
    assert SpecialTokenIds.from_tokenizer(fast, "qwen3-vl") == SpecialTokenIds.from_tokenizer(
        tok, "qwen3-vl"
    )
    assert TokenizerText(fast)("a cat <0.5 seconds>") == TokenizerText(tok)("a cat <0.5 seconds>")
