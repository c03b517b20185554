"""Vision work of samples from the length index columns and the index's vision-token rule.

The rule (a `fcp_data.readers.VisionTokenRule`, passed in) gives each video its grid (units,
grid_h, grid_w in patches), token counts and template parts. Layout "template": the parts in
order (text parts counted by the rule's text counter, special parts one token, pad parts the
units' tokens), then the caption, as `fcp_data.vision.template.render` emits them. Layout
"specials-first": every template token, then the units back to back (`fcp_data.loader.encode`
without vision options).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ConfigError

__all__ = ["index_work", "media_work"]

TEXT, VIDEO, IMAGE = 0, 1, 2
LAYOUTS = ("template", "specials-first")
PAD_KINDS = ("video_pad", "image_pad", "img_context")  # readers.rules_base.PAD_PARTS
INTERNVL_TILE_PATCHES = (448 // 14) ** 2  # InternViT-448: 32 × 32 patches per tile / frame


def _unit_patches(vt: Any, rule: Any) -> int:
    """Patches the encoder sees per unit: Qwen grid_h × grid_w (a tubelet's patches);
    InternVL's grid is (tiles, rows, cols) with 1024 patches per 448² tile or frame."""
    if str(getattr(rule, "name", "")).startswith("internvl"):
        return INTERNVL_TILE_PATCHES
    return int(vt.grid[1] * vt.grid[2])


def media_work(
    modality: np.ndarray,
    num_frames: np.ndarray,
    fps: np.ndarray,
    width: np.ndarray,
    height: np.ndarray,
    rule: Any,
    layout: str = "template",
) -> dict[str, Any]:
    """Keyword arguments of `VisionWork.build` (explicit unit starts, unit_tokens, patches,
    decode_mpix)."""
    if layout not in LAYOUTS:
        raise ConfigError(f"vision layout {layout!r} is not one of {LAYOUTS}")
    mod = np.asarray(modality)
    n = mod.size
    out = {k: np.zeros(n, np.int64) for k in ("unit_tokens", "patches")}
    starts: list[list[int]] = [[] for _ in range(n)]
    mpix = np.zeros(n)
    for i in np.flatnonzero(mod != TEXT):
        if rule is None:
            raise ConfigError(
                f"sample {int(i)} is a media sample but no vision rule was given; pass the "
                "index's rule (fcp_data.readers.get_rule(index.header.scan.vision_rule))"
            )
        w, h = int(width[i]), int(height[i])
        if int(mod[i]) == VIDEO:
            vt = rule.video(num_frames=int(num_frames[i]), fps=float(fps[i]), height=h, width=w)
            groups = max(1, int(vt.grid[0]))
            # sequential decode from the nearest keyframe: every source frame of the span
            frames_per_unit = max(1.0, int(num_frames[i]) / groups)
        elif int(mod[i]) == IMAGE:
            vt = rule.image(height=h, width=w)
            groups = max(1, int(vt.grid[0]))
            frames_per_unit = 1.0 / groups
        else:
            raise ConfigError(
                f"sample {int(i)} has modality code {int(mod[i])}; "
                "allowed: 0 text, 1 video, 2 image"
            )
        per = vt.vision // groups
        if per > 0:
            starts[i] = _starts(vt, per, rule, layout)
        out["unit_tokens"][i] = per
        out["patches"][i] = _unit_patches(vt, rule)
        mpix[i] = frames_per_unit * w * h / 1e6
    return {**out, "decode_mpix": mpix, "unit_starts": starts}


def _starts(vt: Any, per: int, rule: Any, layout: str) -> list[int]:
    """Token offsets of a media sample's units under `layout`."""
    if layout == "specials-first" or not getattr(vt, "parts", ()):
        return list(range(vt.special, vt.special + vt.vision, per))
    at, out = 0, []
    for kind, value in vt.parts:
        if kind == "text":
            at += int(rule.text_counter(str(value)))
        elif kind in PAD_KINDS:
            out += range(at, at + int(value), per)
            at += int(value)
        else:  # a special token
            at += 1
    return out


def index_work(index: Any, ids: np.ndarray | None, rule: Any, layout: str) -> dict[str, Any]:
    """`media_work` over a LengthIndex's columns; the rule defaults to the index's own."""
    if rule is None:
        from ..readers import get_rule  # the index's rule, as the loader resolves it

        scan = index.header.scan
        rule = get_rule(scan.vision_rule, **scan.rule_overrides)
    sel = slice(None) if ids is None else np.asarray(ids, np.int64)
    cols = [np.asarray(getattr(index, k))[sel] for k in ("modality", "num_frames", "fps")]
    size = [np.asarray(getattr(index, k))[sel] for k in ("width", "height")]
    return media_work(*cols, *size, rule, layout)
