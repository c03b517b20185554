"""The Qwen2-VL, Qwen2.5-VL and Qwen3-VL family: token rules, template, pixels, family specs.

The vision-token rules are exact to qwen-vl-utils' defaults.

Source: QwenLM/Qwen3-VL `qwen-vl-utils/src/qwen_vl_utils/vision_process.py` (the same constants
as QwenLM/Qwen2.5-VL's copy): `smart_resize`, `smart_nframes`, `fetch_image`, `fetch_video`.
The Hugging Face processors differ (see `QwenRuleConfig.image_min_pixels` and
`QwenRuleConfig.hf_frame_sampling`); qwen-vl-utils is what the training recipes call.

Worked example (the test suite checks it): 60 s of 30 fps 1920x1080 video, patch 14. Frames:
1800 / 30 * 2 = 120 (inside [4, 768], even). Per-frame budget: min(768*28², 0.9*128000*28²/120*2)
= 768*28² = 602,112 px, so 1080x1920 (2.07 Mpx) shrinks by beta = sqrt(2,073,600/602,112) = 1.856
to floor28(581.9) x floor28(1034.6) = 560 x 1008 -> 20 x 36 = 720 tokens per 2-frame group,
60 groups = 43,200 tokens (+2 for <|vision_start|>/<|vision_end|>).

Encoder input (Qwen2VLImageProcessor.patchify / Qwen2VLVideoProcessor.patchify): a unit of 2
frames (C, H, W) each, normalised, is cut into patches of p x p; rows run over merged h, merged
w, then the 2x2 merge window (h, w), and each row holds C * 2 * p * p values ordered channel,
frame, patch row, patch column. So 2 frames of 56x56 at p = 14 give 16 rows of 1176 values, and
4 consecutive rows are one LLM token. Units are concatenated in time order (t-major), the
processor's order for a whole video. Statistics: CLIP's for Qwen2/2.5-VL, 0.5 for Qwen3-VL.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

import numpy as np

from ...errors import ConfigError, MemberError
from .base import (
    FamilySpec,
    HFRopeModel,
    TemplatePart,
    TextCounter,
    VisionTokenRule,
    VisionTokens,
    count_template,
    qwen_digit_text_tokens,
)

__all__ = [
    "CLIP_MEAN",
    "CLIP_STD",
    "CONFIG",
    "FAMILY",
    "FPS",
    "FPS_MAX_FRAMES",
    "FPS_MIN_FRAMES",
    "FRAME_FACTOR",
    "HALF_MEAN",
    "HALF_STD",
    "IMAGE_MAX_TOKEN_NUM",
    "IMAGE_MIN_TOKEN_NUM",
    "MAX_RATIO",
    "MODEL_SEQ_LEN",
    "QWEN2VL_LEGACY_TOTAL_PIXELS",
    "QWEN2_VL",
    "QWEN3_VL",
    "QWEN25_VL",
    "RULE_NAMES",
    "SPATIAL_MERGE_SIZE",
    "SPECS",
    "TOKEN_STRINGS",
    "VIDEO_MAX_TOKEN_NUM",
    "VIDEO_MIN_TOKEN_NUM",
    "QwenRuleConfig",
    "QwenSpec",
    "QwenVisionRule",
    "make_rule",
    "qwen_rows",
    "rule_defaults",
    "smart_nframes",
    "smart_resize",
    "spec",
    "spec_of_rule",
]

FAMILY = "qwen"
RULE_NAMES = ("qwen2-vl", "qwen2.5-vl", "qwen3-vl")
# template role -> token string (Qwen2VLProcessor / Qwen3VLProcessor defaults)
TOKEN_STRINGS = (
    ("vision_start", "<|vision_start|>"),
    ("vision_end", "<|vision_end|>"),
    ("video_pad", "<|video_pad|>"),
    ("image_pad", "<|image_pad|>"),
)
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)  # Qwen2/2.5-VL processors (OPENAI_CLIP_*)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
HALF_MEAN = (0.5, 0.5, 0.5)  # Qwen3-VL processors (IMAGENET_STANDARD_*)
HALF_STD = (0.5, 0.5, 0.5)

MAX_RATIO = 200  # vision_process.py: longest/shortest side must stay below 200
SPATIAL_MERGE_SIZE = 2  # 2x2 patches merge into one LLM token
IMAGE_MIN_TOKEN_NUM = 4  # images: min_pixels = 4 * factor²
IMAGE_MAX_TOKEN_NUM = 16384  # images: max_pixels = 16384 * factor²
VIDEO_MIN_TOKEN_NUM = 128  # video frames: min_pixels = 128 * factor²
VIDEO_MAX_TOKEN_NUM = 768  # video frames: max_pixels = 768 * factor² (before the total budget)
FPS = 2.0  # frames sampled per second of video
FRAME_FACTOR = 2  # temporal_patch_size: frames are merged in pairs, counts are even
FPS_MIN_FRAMES = 4
FPS_MAX_FRAMES = 768
MODEL_SEQ_LEN = 128000  # total video budget = MODEL_SEQ_LEN * factor² * 0.9 pixels
TOTAL_BUDGET_FRACTION = 0.9
# Qwen2-VL-era qwen-vl-utils used VIDEO_TOTAL_PIXELS = 24576 * 28 * 28; pass
# `total_pixels=QWEN2VL_LEGACY_TOTAL_PIXELS` to reproduce it.
QWEN2VL_LEGACY_TOTAL_PIXELS = 24576 * 28 * 28
HF_IMAGE_MIN_PIXELS = 56 * 56  # Qwen2VLImageProcessor class defaults
HF_IMAGE_MAX_PIXELS = 28 * 28 * 1280


def _round(x: float, f: int) -> int:
    return round(x / f) * f


def _floor(x: float, f: int) -> int:
    return math.floor(x / f) * f


def _ceil(x: float, f: int) -> int:
    return math.ceil(x / f) * f


def smart_resize(
    height: int, width: int, *, factor: int, min_pixels: float, max_pixels: float
) -> tuple[int, int]:
    """Resize target: sides multiples of `factor`, area in [min_pixels, max_pixels], ratio kept.

    Same arithmetic as qwen-vl-utils: round each side to the nearest multiple (at least one
    factor), then if the area is too large scale by beta = sqrt(HW/max) and floor, if too small
    scale by beta = sqrt(min/HW) and ceil.
    """
    if height <= 0 or width <= 0:
        raise MemberError(f"frame size {height}x{width} must be positive; check the sidecar")
    if max(height, width) / min(height, width) > MAX_RATIO:
        raise MemberError(
            f"aspect ratio of {height}x{width} exceeds {MAX_RATIO}:1 (qwen-vl-utils rejects it); "
            "crop or pad the media"
        )
    h = max(factor, _round(height, factor))
    w = max(factor, _round(width, factor))
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h, w = _floor(height / beta, factor), _floor(width / beta, factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h, w = _ceil(height * beta, factor), _ceil(width * beta, factor)
    return h, w


def smart_nframes(
    total_frames: int,
    video_fps: float,
    *,
    fps: float = FPS,
    min_frames: int = FPS_MIN_FRAMES,
    max_frames: int = FPS_MAX_FRAMES,
) -> int:
    """Frames sampled from a video: N/f*fps clamped to [min, min(max, N)], floored to even."""
    if total_frames < FRAME_FACTOR:
        raise MemberError(
            f"video has {total_frames} frame(s); qwen-vl-utils needs at least {FRAME_FACTOR}"
        )
    if video_fps <= 0:
        raise MemberError(f"video fps {video_fps} must be positive; fix the sidecar or re-probe")
    lo = _ceil(min_frames, FRAME_FACTOR)
    hi = _floor(min(max_frames, total_frames), FRAME_FACTOR)
    n = total_frames / video_fps * fps
    n = _floor(min(min(max(n, lo), hi), total_frames), FRAME_FACTOR)
    if not FRAME_FACTOR <= n <= total_frames:
        raise MemberError(f"sampled frame count {n} outside [{FRAME_FACTOR}, {total_frames}]")
    return int(n)


def _linspace_round(start: int, end: int, n: int) -> tuple[int, ...]:
    """torch.linspace(start, end, n).round() in float64 (round half to even, as torch does)."""
    if n == 1:
        return (start,)
    step = (end - start) / (n - 1)
    return tuple(round(start + i * step) for i in range(n))


@dataclass(kw_only=True, slots=True)
class QwenRuleConfig:
    """Settings of a Qwen rule; defaults are qwen-vl-utils' for the family.

    `patch_size` 14 (Qwen2/2.5-VL) or 16 (Qwen3-VL). `total_pixels` None means
    MODEL_SEQ_LEN * factor² * 0.9. `hf_frame_sampling` switches Qwen3-VL to the HF video
    processor's count: int(N/f*fps) clamped to [4, 768, N] without even rounding, padded by
    repeating the last frame (t = ceil(n/2)).
    """

    patch_size: int = 14
    timestamps: bool = False  # Qwen3-VL: "<t seconds>" text before each temporal group
    fps: float = FPS
    min_frames: int = FPS_MIN_FRAMES
    max_frames: int = FPS_MAX_FRAMES
    video_min_pixels: int | None = None
    video_max_pixels: int | None = None
    total_pixels: float | None = None
    image_min_pixels: int | None = None
    image_max_pixels: int | None = None
    hf_frame_sampling: bool = False


class QwenVisionRule(VisionTokenRule):
    """Qwen-VL token arithmetic; `text_counter` counts Qwen3-VL timestamp strings."""

    def __init__(
        self, name: str, config: QwenRuleConfig, text_counter: TextCounter | None = None
    ) -> None:
        self.name = name
        self.config = config
        self.text_counter = text_counter or qwen_digit_text_tokens

    @property
    def factor(self) -> int:
        return self.config.patch_size * SPATIAL_MERGE_SIZE

    def settings(self) -> dict[str, object]:
        return {"name": self.name, **asdict(self.config)}

    def _frames(self, num_frames: int, fps: float) -> tuple[int, tuple[int, ...]]:
        c = self.config
        if c.hf_frame_sampling:
            if num_frames < 1 or fps <= 0:
                raise MemberError(f"video with {num_frames} frames at {fps} fps cannot be sampled")
            n = int(num_frames / fps * c.fps)
            n = min(max(n, c.min_frames), c.max_frames, num_frames)
            idx = _linspace_round(0, num_frames - 1, n)
            pad = (-n) % FRAME_FACTOR
            return n + pad, idx + (idx[-1],) * pad
        n = smart_nframes(
            num_frames, fps, fps=c.fps, min_frames=c.min_frames, max_frames=c.max_frames
        )
        return n, _linspace_round(0, num_frames - 1, n)

    def video(self, *, num_frames: int, fps: float, height: int, width: int) -> VisionTokens:
        c, f = self.config, self.factor
        n, idx = self._frames(num_frames, fps)
        min_px = (
            c.video_min_pixels if c.video_min_pixels is not None else VIDEO_MIN_TOKEN_NUM * f * f
        )
        total = (
            c.total_pixels
            if c.total_pixels is not None
            else MODEL_SEQ_LEN * f * f * TOTAL_BUDGET_FRACTION
        )
        max_px = max(min(VIDEO_MAX_TOKEN_NUM * f * f, total / n * FRAME_FACTOR), int(min_px * 1.05))
        if c.video_max_pixels is not None:
            max_px = min(max_px, c.video_max_pixels)
        h, w = smart_resize(height, width, factor=f, min_pixels=min_px, max_pixels=max_px)
        groups, gh, gw = n // FRAME_FACTOR, h // c.patch_size, w // c.patch_size
        per_group = gh * gw // (SPATIAL_MERGE_SIZE**2)
        parts: list[TemplatePart] = []
        if c.timestamps:
            # Qwen3VLProcessor: each group is "<{t:.1f} seconds>" <|vision_start|> pads
            # <|vision_end|>, t the mean timestamp of the group's frames (frame index / fps).
            for g in range(groups):
                pair = idx[g * FRAME_FACTOR : (g + 1) * FRAME_FACTOR]
                t = (pair[0] / fps + pair[-1] / fps) / 2
                parts += [
                    ("text", f"<{t:.1f} seconds>"),
                    ("vision_start", 1),
                    ("video_pad", per_group),
                    ("vision_end", 1),
                ]
        else:
            parts = [("vision_start", 1), ("video_pad", groups * per_group), ("vision_end", 1)]
        special = count_template(tuple(parts), self.text_counter)
        return VisionTokens(
            vision=groups * per_group,
            special=special,
            frame_indices=idx,
            resized=(h, w),
            grid=(groups, gh, gw),
            parts=tuple(parts),
        )

    def image(self, *, height: int, width: int) -> VisionTokens:
        c, f = self.config, self.factor
        min_px = (
            c.image_min_pixels if c.image_min_pixels is not None else IMAGE_MIN_TOKEN_NUM * f * f
        )
        max_px = (
            c.image_max_pixels if c.image_max_pixels is not None else IMAGE_MAX_TOKEN_NUM * f * f
        )
        h, w = smart_resize(height, width, factor=f, min_pixels=min_px, max_pixels=max_px)
        gh, gw = h // c.patch_size, w // c.patch_size
        n = gh * gw // (SPATIAL_MERGE_SIZE**2)
        parts: tuple[TemplatePart, ...] = (("vision_start", 1), ("image_pad", n), ("vision_end", 1))
        return VisionTokens(
            vision=n,
            special=count_template(parts, self.text_counter),
            frame_indices=(),
            resized=(h, w),
            grid=(1, gh, gw),
            parts=parts,
        )


def qwen_rows(units: np.ndarray, *, patch: int, merge: int = 2) -> np.ndarray:
    """float32 [U, tps, C, H, W] (U units of tps frames) -> rows [U * gh * gw, C * tps * p * p]."""
    u, tps, c, h, w = units.shape
    if h % (patch * merge) or w % (patch * merge):
        raise MemberError(
            f"frame size {h}x{w} is not a multiple of patch*merge={patch * merge}; resize it "
            "with the rule's smart_resize first"
        )
    gh, gw = h // patch, w // patch
    x = units.reshape(u, tps, c, gh // merge, merge, patch, gw // merge, merge, patch)
    # -> (U, gh/m, gw/m, m_h, m_w, C, tps, p_h, p_w)
    x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return np.ascontiguousarray(x.reshape(u * gh * gw, c * tps * patch * patch))


@dataclass(frozen=True, kw_only=True, slots=True)
class QwenSpec(FamilySpec):
    """A Qwen rule's spec: a unit is a tubelet of `temporal` frames (an image is repeated to
    2) on a grid_h x grid_w patch grid, merged 2 x 2 into grid_h * grid_w / 4 LLM tokens."""

    def unit_tokens(self, vt: VisionTokens) -> int:
        return vt.grid[1] * vt.grid[2] // (self.merge * self.merge)

    def unit_patches(self, vt: VisionTokens) -> int:
        return int(vt.grid[1] * vt.grid[2])

    def grid_row(self, vt: VisionTokens, units: int) -> tuple[int, int, int]:
        return (units, int(vt.grid[1]), int(vt.grid[2]))

    def empty_pixels(self, row_width: int) -> tuple[int, ...]:
        return (0, row_width)


# The tiny vision configs of the probe models (rope_check): one block, 8 channels; the two
# classes name their widths differently (Qwen2-VL embed_dim / mlp_ratio, Qwen2.5-VL
# intermediate_size / out_hidden_size and a full-attention block list).
_QWEN2_PROBE = HFRopeModel(
    config_class="Qwen2VLConfig",
    model_class="Qwen2VLModel",
    vision_config=(
        ("depth", 1),
        ("hidden_size", 8),
        ("num_heads", 1),
        ("embed_dim", 8),
        ("mlp_ratio", 1),
    ),
)
_QWEN25_PROBE = HFRopeModel(
    config_class="Qwen2_5_VLConfig",
    model_class="Qwen2_5_VLModel",
    vision_config=(
        ("depth", 1),
        ("hidden_size", 8),
        ("num_heads", 1),
        ("intermediate_size", 8),
        ("out_hidden_size", 8),
        ("fullatt_block_indexes", (0,)),
    ),
)
# One spec per rule: Qwen2-VL's, and what Qwen2.5-VL (time-scaled temporal ids) and Qwen3-VL
# (patch 16, 0.5 statistics, every temporal group its own run after a "<t seconds>" text) change.
QWEN2_VL = QwenSpec(
    rule="qwen2-vl",
    family=FAMILY,
    tokens=TOKEN_STRINGS,
    patch=14,
    merge=SPATIAL_MERGE_SIZE,
    temporal=FRAME_FACTOR,
    mean=CLIP_MEAN,
    std=CLIP_STD,
    rope="mrope",
    time_scaled=False,
    pixel_layout="rows",
    hf_rope_model=_QWEN2_PROBE,
)
QWEN25_VL = replace(QWEN2_VL, rule="qwen2.5-vl", time_scaled=True, hf_rope_model=_QWEN25_PROBE)
QWEN3_VL = replace(
    QWEN2_VL,
    rule="qwen3-vl",
    patch=16,
    mean=HALF_MEAN,
    std=HALF_STD,
    rope="mrope-groups",
    hf_rope_model=None,  # runs of t = 1: both next_text conventions give the same ids
)
SPECS = (QWEN2_VL, QWEN25_VL, QWEN3_VL)  # in RULE_NAMES order


def spec(rule_name: str, patch_size: int | None = None) -> QwenSpec:
    """The spec of Qwen rule `rule_name`; `patch_size` None is the rule's own (16 for Qwen3-VL,
    14 for Qwen2/2.5-VL), else the rule config's `patch_size` (a user override)."""
    for s in SPECS:
        if s.rule == rule_name:
            return s if patch_size in (None, s.patch) else replace(s, patch=patch_size)
    raise ConfigError(f"{rule_name!r} is not a Qwen rule ({', '.join(RULE_NAMES)})")


def spec_of_rule(rule: VisionTokenRule) -> QwenSpec:
    """The spec of a built Qwen rule, with the patch size its config was given."""
    return spec(rule.name, rule.config.patch_size)  # type: ignore[attr-defined]


def rule_defaults(rule_name: str) -> dict[str, object]:
    """`QwenRuleConfig` fields rule `rule_name` sets before the user's overrides: its patch
    size, and Qwen3-VL's "<t seconds>" timestamps (what makes each group its own run)."""
    s = spec(rule_name)
    return {"patch_size": s.patch, "timestamps": s.rope == "mrope-groups"}


def make_rule(
    rule_name: str, config: QwenRuleConfig, text_counter: TextCounter | None = None
) -> QwenVisionRule:
    """The rule `rule_name` with `config` (defaults and overrides already merged)."""
    return QwenVisionRule(rule_name, config, text_counter)


CONFIG = QwenRuleConfig  # the settings class the registry checks overrides against
