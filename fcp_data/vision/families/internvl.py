"""The InternVL (1.5 / 2 / 2.5 / 3) family: 256 tokens per 448x448 tile, its template, its spec.

Sources (OpenGVLab/InternVL): `internvl_chat/internvl/model/internvl_chat/modeling_internvl_chat.py`
sets num_image_token = int((448 // 14)² * 0.5²) = 256 (pixel shuffle 0.5 on a 32x32 patch grid);
`internvl_chat/internvl/train/dataset.py` `dynamic_preprocess` / `find_closest_aspect_ratio`
tile images; `internvl_chat/internvl/train/internvl_chat_finetune.py` defaults
max_dynamic_patch=12, min_dynamic_patch=1, use_thumbnail=True, and video frames one tile each
with a "Frame-i: <image>" line per frame. Each image placeholder expands to
"<img>" + "<IMG_CONTEXT>" * 256 * tiles + "</img>".

Video frame count is random in training (randint(8, 32)); an index needs a fixed count, so
`num_frames` (default 32, the README `load_video` num_segments) is used, capped at the source's
frame count. Example: 8 frames -> 8 * 256 = 2,048 vision tokens whatever the duration.

Encoder input (InternVL's build_transform): tiles resized to 448x448, x / 255, ImageNet
mean/std, kept as images [tiles, 3, 448, 448]; each tile or frame is one encoder unit of
(448 / 14)² = 1024 patches, pixel-shuffled into 256 LLM tokens.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ...errors import ConfigError, MemberError
from .base import (
    FamilySpec,
    TemplatePart,
    TextCounter,
    VisionTokenRule,
    VisionTokens,
    count_template,
    qwen_digit_text_tokens,
)

__all__ = [
    "CONFIG",
    "FAMILY",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "IMAGE_SIZE",
    "INTERNVL",
    "NUM_IMAGE_TOKEN",
    "RULE_NAMES",
    "SPECS",
    "TOKEN_STRINGS",
    "InternVLRule",
    "InternVLRuleConfig",
    "InternVLSpec",
    "closest_grid",
    "make_rule",
    "rule_defaults",
    "spec",
    "spec_of_rule",
]

FAMILY = "internvl"
RULE_NAMES = ("internvl",)
# template role -> token string (InternVL's chat template; InternVLProcessor's start/end/context)
TOKEN_STRINGS = (("img_start", "<img>"), ("img_end", "</img>"), ("img_context", "<IMG_CONTEXT>"))
IMAGENET_MEAN = (0.485, 0.456, 0.406)  # InternVL build_transform (IMAGENET_DEFAULT_*)
IMAGENET_STD = (0.229, 0.224, 0.225)

IMAGE_SIZE = 448  # tile side in pixels
PATCH_SIZE = 14
DOWNSAMPLE_RATIO = 0.5  # pixel shuffle
NUM_IMAGE_TOKEN = int((IMAGE_SIZE // PATCH_SIZE) ** 2 * DOWNSAMPLE_RATIO**2)  # 256


def closest_grid(
    width: int, height: int, *, min_num: int, max_num: int, image_size: int = IMAGE_SIZE
) -> tuple[int, int]:
    """(columns, rows) of the tile grid whose aspect ratio is closest to the image's.

    Candidates are all (i, j) with min_num <= i*j <= max_num ordered by tile count (ties kept in
    the order InternVL builds them); on equal ratio distance a later (larger) grid wins when the
    image area exceeds half of that grid's pixel area, as in `find_closest_aspect_ratio`.
    """
    if width <= 0 or height <= 0:
        raise MemberError(f"image size {width}x{height} must be positive")
    if not 1 <= min_num <= max_num:
        raise ConfigError(f"tile bounds [{min_num}, {max_num}] must satisfy 1 <= min <= max")
    candidates = {
        (i, j)
        for n in range(min_num, max_num + 1)
        for i in range(1, n + 1)
        for j in range(1, n + 1)
        if min_num <= i * j <= max_num
    }
    ordered = sorted(candidates, key=lambda g: g[0] * g[1])
    aspect, area = width / height, width * height
    best, best_diff = (1, 1), float("inf")
    for cols, rows in ordered:
        diff = abs(aspect - cols / rows)
        if diff < best_diff:
            best, best_diff = (cols, rows), diff
        elif diff == best_diff and area > 0.5 * image_size * image_size * cols * rows:
            best = (cols, rows)
    return best


@dataclass(kw_only=True, slots=True)
class InternVLRuleConfig:
    """InternVL fine-tuning defaults; `num_frames` fixes the (otherwise random) frame count."""

    max_dynamic_patch: int = 12
    min_dynamic_patch: int = 1
    use_thumbnail: bool = True
    num_frames: int = 32
    frame_labels: bool = True  # "Frame-i: " before each frame's <img>


class InternVLRule(VisionTokenRule):
    """InternVL token arithmetic; `text_counter` counts the "Frame-i: " label tokens."""

    def __init__(
        self, config: InternVLRuleConfig | None = None, text_counter: TextCounter | None = None
    ) -> None:
        self.name = RULE_NAMES[0]
        self.config = config or InternVLRuleConfig()
        self.text_counter = text_counter or qwen_digit_text_tokens

    def settings(self) -> dict[str, object]:
        return {"name": self.name, **asdict(self.config)}

    def image(self, *, height: int, width: int) -> VisionTokens:
        c = self.config
        cols, rows = closest_grid(
            width, height, min_num=c.min_dynamic_patch, max_num=c.max_dynamic_patch
        )
        tiles = cols * rows + (1 if c.use_thumbnail and cols * rows != 1 else 0)
        parts: tuple[TemplatePart, ...] = (
            ("img_start", 1),
            ("img_context", NUM_IMAGE_TOKEN * tiles),
            ("img_end", 1),
        )
        return VisionTokens(
            vision=NUM_IMAGE_TOKEN * tiles,
            special=count_template(parts, self.text_counter),
            parts=parts,
            frame_indices=(),
            resized=(IMAGE_SIZE * rows, IMAGE_SIZE * cols),
            grid=(tiles, rows, cols),
        )

    def video(self, *, num_frames: int, fps: float, height: int, width: int) -> VisionTokens:
        if num_frames < 1:
            raise MemberError(f"video has {num_frames} frames; need at least 1")
        if height <= 0 or width <= 0:
            raise MemberError(f"frame size {height}x{width} must be positive")
        n = min(self.config.num_frames, num_frames)
        # InternVL's 'middle' sampling (get_frame_indices): split [0, N) into n segments at
        # int(linspace(0, N, n + 1)) and take each segment's integer midpoint.
        bounds = [int(num_frames * k / n) for k in range(n + 1)]
        idx = tuple((bounds[k] + bounds[k + 1]) // 2 for k in range(n))
        # "Frame-1: <img>...</img>\nFrame-2: <img>...</img>..." (internvl_chat_finetune.py);
        # the "\n" and each label are separate text parts, tokenized one by one.
        parts: list[TemplatePart] = []
        for i in range(n):
            if self.config.frame_labels:
                if i:
                    parts.append(("text", "\n"))
                parts.append(("text", f"Frame-{i + 1}: "))
            parts += [("img_start", 1), ("img_context", NUM_IMAGE_TOKEN), ("img_end", 1)]
        return VisionTokens(
            vision=NUM_IMAGE_TOKEN * n,
            special=count_template(tuple(parts), self.text_counter),
            frame_indices=idx,
            resized=(IMAGE_SIZE, IMAGE_SIZE),
            grid=(n, 1, 1),
            parts=tuple(parts),
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class InternVLSpec(FamilySpec):
    """InternVL's spec: a unit is one `tile` x `tile` image tile or video frame of
    (tile / patch)² = 1024 patches, pixel-shuffled 2 x 2 into 256 LLM tokens."""

    def unit_tokens(self, vt: VisionTokens) -> int:
        return vt.vision // max(1, vt.grid[0])

    def unit_patches(self, vt: VisionTokens) -> int:
        return self._side() ** 2

    def grid_row(self, vt: VisionTokens, units: int) -> tuple[int, int, int]:
        return (units, self._side(), self._side())

    def empty_pixels(self, row_width: int) -> tuple[int, ...]:
        tile = self.tile or IMAGE_SIZE
        return (0, 3, tile, tile)

    def _side(self) -> int:
        """Patches along a tile's side: 448 / 14 = 32."""
        return (self.tile or IMAGE_SIZE) // self.patch


INTERNVL = InternVLSpec(
    rule=RULE_NAMES[0],
    family=FAMILY,
    tokens=TOKEN_STRINGS,
    patch=PATCH_SIZE,
    merge=int(1 / DOWNSAMPLE_RATIO),
    temporal=1,
    mean=IMAGENET_MEAN,
    std=IMAGENET_STD,
    rope="1d",
    time_scaled=False,
    pixel_layout="tiles",
    tile=IMAGE_SIZE,
)
SPECS = (INTERNVL,)


def spec(rule_name: str, patch_size: int | None = None) -> InternVLSpec:
    """The spec of rule `rule_name` (InternViT's patch is fixed at 14: `patch_size` must be
    None or 14, the tile grid and token count depend on it)."""
    if rule_name not in RULE_NAMES:
        raise ConfigError(f"{rule_name!r} is not an InternVL rule ({', '.join(RULE_NAMES)})")
    if patch_size not in (None, INTERNVL.patch):
        raise ConfigError(f"InternVL's patch is {INTERNVL.patch}, not {patch_size}")
    return INTERNVL


def spec_of_rule(rule: VisionTokenRule) -> InternVLSpec:
    """The spec of a built InternVL rule (its config has no patch size to carry)."""
    return spec(rule.name)


def rule_defaults(rule_name: str) -> dict[str, object]:
    """`InternVLRuleConfig` fields the rule name sets before overrides: none."""
    spec(rule_name)
    return {}


def make_rule(
    rule_name: str, config: InternVLRuleConfig, text_counter: TextCounter | None = None
) -> InternVLRule:
    """The InternVL rule with `config` (defaults and overrides already merged)."""
    spec(rule_name)
    return InternVLRule(config, text_counter)


CONFIG = InternVLRuleConfig  # the settings class the registry checks overrides against
