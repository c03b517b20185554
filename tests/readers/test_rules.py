"""Vision-token rules against hand-worked qwen-vl-utils / InternVL arithmetic."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fcp_data.vision.families import (
    NUM_IMAGE_TOKEN,
    RULE_NAMES,
    closest_grid,
    get_rule,
    qwen_digit_text_tokens,
    smart_nframes,
    smart_resize,
)


def test_sixty_seconds_1080p_patch14_is_120_frames_43200_tokens() -> None:
    for name in ("qwen2-vl", "qwen2.5-vl"):
        vt = get_rule(name).video(num_frames=1800, fps=30, height=1080, width=1920)
        assert len(vt.frame_indices) == 120
        assert vt.resized == (560, 1008)
        assert vt.grid == (60, 40, 72)
        assert vt.vision == 43_200
        assert vt.special == 2  # <|vision_start|>, <|vision_end|>
        assert vt.frame_indices[0] == 0 and vt.frame_indices[-1] == 1799


def test_qwen3_patch16_same_tokens_plus_timestamps() -> None:
    vt = get_rule("qwen3-vl").video(num_frames=1800, fps=30, height=1080, width=1920)
    assert vt.resized == (640, 1152) and vt.vision == 43_200
    # 60 groups: each "<t seconds>" + start + end. t = mean of the pair's timestamps.
    idx = vt.frame_indices
    expect = 0
    for g in range(60):
        t = (idx[2 * g] / 30 + idx[2 * g + 1] / 30) / 2
        digits = sum(c.isdigit() for c in f"{t:.1f}")
        expect += digits + 4 + 2  # "<", ".", " seconds", ">" + two markers
    assert vt.special == expect
    assert vt.special > 60 * 6  # not vacuous: 60 groups, at least 6 tokens each


def test_qwen3_exact_text_counter_is_used() -> None:
    seen: list[str] = []

    def counter(text: str) -> int:
        seen.append(text)
        return 10

    vt = get_rule("qwen3-vl", text_counter=counter).video(
        num_frames=40, fps=10, height=64, width=64
    )
    # 8 frames at linspace(0, 39, 8).round(): the first pair is frames 0 and 6 -> t = 0.3 s
    assert seen[0] == "<0.3 seconds>" and len(seen) == vt.grid[0] == 4
    assert vt.special == vt.grid[0] * 12


def test_digit_token_counter_examples() -> None:
    assert qwen_digit_text_tokens("<12.5 seconds>") == 7
    assert qwen_digit_text_tokens("<0.2 seconds>") == 6
    assert qwen_digit_text_tokens("Frame-1: ") == 5


def test_tiny_frames_scale_up_to_128_tokens_per_frame_pair() -> None:
    vt = get_rule("qwen2.5-vl").video(num_frames=8, fps=30, height=16, width=16)
    # min_pixels = 128*28² = 100,352: beta = sqrt(100352/256) = 19.8 -> ceil28(316.8) = 336.
    assert vt.resized == (336, 336)
    assert len(vt.frame_indices) == 4  # 8/30*2 = 0.53 -> min 4 frames
    assert vt.vision == 2 * (12 * 12)
    assert vt.vision // vt.grid[0] >= 128


def test_long_video_capped_by_total_budget() -> None:
    rule = get_rule("qwen2.5-vl")
    vt = rule.video(num_frames=3600 * 30, fps=30, height=1080, width=1920)
    assert len(vt.frame_indices) == 768  # FPS_MAX_FRAMES
    # max_pixels = 0.9*128000*784/768*2 = 235,200 -> 336 x 644 -> 12 x 23 = 276 per group.
    assert vt.resized == (336, 644) and vt.vision == 384 * 276
    assert vt.vision <= 0.9 * 128_000
    shorter = rule.video(num_frames=60 * 30, fps=30, height=1080, width=1920)
    assert shorter.vision // shorter.grid[0] > vt.vision // vt.grid[0]


def test_images_qwen_and_internvl() -> None:
    vt = get_rule("qwen2-vl").image(height=1080, width=1920)
    assert vt.resized == (1092, 1932) and vt.vision == 39 * 69 and vt.special == 2
    tiny = get_rule("qwen2-vl").image(height=10, width=10)
    assert tiny.resized == (56, 56) and tiny.vision == 4  # IMAGE_MIN_TOKEN_NUM
    iv = get_rule("internvl").image(height=1080, width=1920)
    cols, rows = closest_grid(1920, 1080, min_num=1, max_num=12)
    assert (cols, rows) == (4, 2)  # 16:9 -> 2.0 is the closest ratio with <= 12 tiles
    assert iv.vision == NUM_IMAGE_TOKEN * (8 + 1)  # + thumbnail
    square = get_rule("internvl").image(height=448, width=448)
    assert square.vision == 256  # one tile, no thumbnail


def test_internvl_video_fixed_frames() -> None:
    vt = get_rule("internvl", num_frames=8).video(num_frames=300, fps=30, height=720, width=1280)
    assert vt.vision == 8 * 256 == 2048
    assert len(set(vt.frame_indices)) == 8 and max(vt.frame_indices) < 300
    # 2 markers per frame + "Frame-i: " (5 tokens for i < 10) + 7 newlines
    assert vt.special == 8 * 2 + 8 * 5 + 7
    short = get_rule("internvl").video(num_frames=5, fps=30, height=64, width=64)
    assert short.vision == 5 * 256


def test_hf_frame_sampling_option_for_qwen3() -> None:
    rule = get_rule("qwen3-vl", hf_frame_sampling=True)
    vt = rule.video(num_frames=75, fps=30, height=64, width=64)  # int(75/30*2)=5 -> pad to 6
    assert len(vt.frame_indices) == 6 and vt.frame_indices[-1] == vt.frame_indices[-2]
    assert vt.grid[0] == 3


def test_unknown_rule_and_setting_errors_name_the_choices() -> None:
    with pytest.raises(ValueError, match="qwen2-vl"):
        get_rule("llava")
    with pytest.raises(ValueError, match="num_frames"):
        get_rule("qwen2-vl", num_frames=3)
    assert set(RULE_NAMES) == {"qwen2-vl", "qwen2.5-vl", "qwen3-vl", "internvl"}


@settings(max_examples=300, deadline=None)
@given(h=st.integers(1, 8000), w=st.integers(1, 8000), factor=st.sampled_from([28, 32]))
def test_smart_resize_invariants(h: int, w: int, factor: int) -> None:
    if max(h, w) / min(h, w) > 200:
        with pytest.raises(ValueError, match="aspect ratio"):
            smart_resize(
                h, w, factor=factor, min_pixels=4 * factor**2, max_pixels=16384 * factor**2
            )
        return
    lo, hi = 4 * factor**2, 16384 * factor**2
    rh, rw = smart_resize(h, w, factor=factor, min_pixels=lo, max_pixels=hi)
    assert rh % factor == 0 and rw % factor == 0 and rh >= factor and rw >= factor
    assert rh * rw <= hi
    # aspect ratio kept to within one factor step on each side
    assert (
        abs(rh / rw - h / w) <= (h / w) * (factor / rw + factor / rh) + factor / rw + 1e-9
        or rh == factor
        or rw == factor
    )


@settings(max_examples=300, deadline=None)
@given(n=st.integers(2, 200_000), fps=st.floats(1.0, 120.0))
def test_smart_nframes_invariants(n: int, fps: float) -> None:
    k = smart_nframes(n, fps)
    assert k % 2 == 0 and 2 <= k <= min(n, 768)
    target = n / fps * 2
    if 4 <= target <= min(768, n):
        assert k == math.floor(target / 2) * 2


@settings(max_examples=100, deadline=None)
@given(
    n=st.integers(2, 20_000),
    fps=st.floats(5.0, 60.0),
    h=st.integers(16, 2160),
    w=st.integers(16, 3840),
    name=st.sampled_from(["qwen2.5-vl", "qwen3-vl"]),
)
def test_video_tokens_within_budget(n: int, fps: float, h: int, w: int, name: str) -> None:
    if max(h, w) / min(h, w) > 200:
        return
    rule = get_rule(name)
    vt = rule.video(num_frames=n, fps=fps, height=h, width=w)
    f = 28 if name == "qwen2.5-vl" else 32
    per_group = vt.vision // vt.grid[0]
    assert vt.vision == vt.grid[0] * per_group
    assert per_group >= 128 or vt.resized[0] * vt.resized[1] >= 128 * f * f
    assert per_group <= 768
    assert vt.frame_indices == tuple(sorted(vt.frame_indices))
    assert vt.frame_indices[0] >= 0 and vt.frame_indices[-1] <= n - 1


def test_frame_indices_match_torch_linspace_round() -> None:
    """qwen-vl-utils picks frames with torch.linspace(0, N-1, n).round() (float32)."""
    import torch

    rule = get_rule("qwen2.5-vl")
    checked = 0
    for total in range(4, 4000, 37):
        for fps in (1.0, 7.5, 24.0, 30.0):
            vt = rule.video(num_frames=total, fps=fps, height=64, width=64)
            n = len(vt.frame_indices)
            ref = torch.linspace(0, total - 1, n).round().long().tolist()
            assert list(vt.frame_indices) == ref, (total, fps)
            checked += 1
    assert checked > 400


def test_qwen2vl_legacy_total_budget_option() -> None:
    from fcp_data.vision.families import QWEN2VL_LEGACY_TOTAL_PIXELS

    rule = get_rule("qwen2-vl", total_pixels=QWEN2VL_LEGACY_TOTAL_PIXELS)
    vt = rule.video(num_frames=1800, fps=30, height=1080, width=1920)
    # max_pixels = 24576*784/120*2 = 321,126 -> beta = 2.541 -> floor28(425.0) x floor28(755.6)
    # = 420 x 728 -> 15 x 26 = 390 tokens per group, 60 groups
    assert vt.resized == (420, 728) and vt.vision == 60 * 15 * 26 == 23_400
