"""A batch's vision work for the planner, from the length index columns and the vision rule.

The planner prices encoder units from arrays alone (`fcp_data.planner.VisionWork`) and imports
nothing of readers or vision; this module turns what only the vision side knows into those
arrays. The rule (a `VisionTokenRule`, by default the one the index header names) gives each
video or image its grid (units, grid_h, grid_w in patches), token counts and template parts;
its `FamilySpec` says how many patches a unit has (a Qwen tubelet's grid_h x grid_w, an
InternVL tile's 32 x 32 = 1024).

Layout "template": the parts in order (text parts counted by the rule's text counter, special
parts one token, pad parts the units' tokens), then the caption, as
`fcp_data.vision.template.render` emits them. Layout "specials-first": every template token,
then the units back to back (`fcp_data.loader.encode` without vision options).

Decoded megapixels per unit: a unit's share of the source frames a replica decodes (sequential
decode from the nearest keyframe covers every source frame in its span: `num_frames / groups`
frames of width x height); an image is decoded whole once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ConfigError
from .families import PAD_PARTS, FamilySpec, get_rule, rule_spec
from .modality import Modality

if TYPE_CHECKING:
    from ..planner.cost.vision_work import VisionWork

__all__ = [
    "LAYOUTS",
    "index_work",
    "media_work",
    "vision_work_from_index",
    "vision_work_from_media",
]

LAYOUTS = ("template", "specials-first")


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
    decode_mpix) of samples with these index columns under `rule`."""
    if layout not in LAYOUTS:
        raise ConfigError(f"vision layout {layout!r} is not one of {LAYOUTS}")
    mod = np.asarray(modality)
    n = mod.size
    out = {k: np.zeros(n, np.int64) for k in ("unit_tokens", "patches")}
    starts: list[list[int]] = [[] for _ in range(n)]
    mpix = np.zeros(n)
    spec: FamilySpec | None = None
    for i in np.flatnonzero(mod != Modality.TEXT):
        if rule is None:
            raise ConfigError(
                f"sample {int(i)} is a media sample but no vision rule was given; pass the "
                "index's rule (fcp_data.vision.get_rule(index.header.scan.vision_rule))"
            )
        spec = spec or rule_spec(rule)
        w, h = int(width[i]), int(height[i])
        if int(mod[i]) == Modality.VIDEO:
            vt = rule.video(num_frames=int(num_frames[i]), fps=float(fps[i]), height=h, width=w)
            groups = max(1, int(vt.grid[0]))
            # sequential decode from the nearest keyframe: every source frame of the span
            frames_per_unit = max(1.0, int(num_frames[i]) / groups)
        elif int(mod[i]) == Modality.IMAGE:
            vt = rule.image(height=h, width=w)
            groups = max(1, int(vt.grid[0]))
            frames_per_unit = 1.0 / groups
        else:
            raise ConfigError(
                f"sample {int(i)} has modality code {int(mod[i])}; allowed: "
                + ", ".join(f"{int(m)} {m.label}" for m in Modality)
            )
        per = vt.vision // groups
        if per > 0:
            starts[i] = _starts(vt, per, rule, layout)
        out["unit_tokens"][i] = per
        out["patches"][i] = spec.unit_patches(vt)
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
        elif kind in PAD_PARTS:
            out += range(at, at + int(value), per)
            at += int(value)
        else:  # a special token
            at += 1
    return out


def index_work(index: Any, ids: np.ndarray | None, rule: Any, layout: str) -> dict[str, Any]:
    """`media_work` over a LengthIndex's columns; the rule defaults to the index's own."""
    if rule is None:  # the index's rule, as the loader resolves it
        scan = index.header.scan
        rule = get_rule(scan.vision_rule, **scan.rule_overrides)
    sel = slice(None) if ids is None else np.asarray(ids, np.int64)
    cols = [np.asarray(getattr(index, k))[sel] for k in ("modality", "num_frames", "fps")]
    size = [np.asarray(getattr(index, k))[sel] for k in ("width", "height")]
    return media_work(*cols, *size, rule, layout)


def vision_work_from_media(
    *,
    modality: np.ndarray,
    num_frames: np.ndarray,
    fps: np.ndarray,
    width: np.ndarray,
    height: np.ndarray,
    rule: Any,
    layout: str = "template",
) -> VisionWork:
    """The planner's `VisionWork` from length-index columns (modality codes: `Modality`) and the
    index's vision-token rule. `layout`: "template" (the vision payload's sequences: the rule's
    template parts in order, then the caption) or "specials-first" (a loader without vision
    options: every template token, then the units, then the caption)."""
    from ..planner.cost.vision_work import VisionWork  # the planner's array type, lazily

    return VisionWork.build(**media_work(modality, num_frames, fps, width, height, rule, layout))


def vision_work_from_index(
    index: Any, ids: np.ndarray | None = None, rule: Any = None, layout: str = "template"
) -> VisionWork:
    """The planner's `VisionWork` of a `LengthIndex` (samples `ids`, default all) under `rule`
    (default: the rule named in its header; pass the rule built with the index's tokenizer as
    text counter for exact template offsets), e.g. for `plan_global_batch(..., vision=...)`."""
    from ..planner.cost.vision_work import VisionWork  # the planner's array type, lazily

    return VisionWork.build(**index_work(index, ids, rule, layout))
