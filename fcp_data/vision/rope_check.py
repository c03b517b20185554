"""Which `next_text` convention the installed transformers' `get_rope_index` follows, by behaviour.

Qwen's fine-tuning code and transformers 4.x start the text after a video at max(video ids) + 1;
transformers 5.x's `get_rope_index` starts it at start + max(h, w) (merged grid). A model trained
on one and run (its own forward, generation) on the other sees different positions after every
long video: with the VLM loop of docs/vlm.md on transformers 5.x, the old "max+1" default gave
gradients 1.6e-1 off and a loss 2e-7 off the model's own forward (a tester's measurement), with
no error anywhere. So `VisionOptions(next_text="auto")`, the default,
runs the installed model class's own rope-index function once per process on a tiny synthetic
video (12 tubelets at interval 2 on a 2 x 2 merged grid: the last temporal id is s + 22, the
spatial extent s + 2, so the two conventions put the next text at s + 23 and s + 2) and takes
the convention whose ids equal it. No version string is read: a patched or future transformers
is judged by what it computes.

* "auto" and a convention matches: that convention, stated once per process (log, INFO).
* "auto" and neither matches: `ConfigError` naming the transformers version and the first
  differing id (fcp cannot reproduce it; train with an explicit choice at your own risk).
* "auto" and transformers (or the model class) is not importable: "max+1" (Qwen's code), with
  one WARNING saying so.
* an explicit "max+1" / "spatial": used as given; one WARNING when transformers computes the
  other convention (the model's own forward will see other positions).
* Qwen3-VL (every temporal group is its own run with t = 1) and InternVL (1-D positions): the
  conventions give the same ids, nothing is probed.

The probe costs one import of the model module (seconds, once) and a forward-free call on a
60-token input (milliseconds). The loader resolves it in the main process before its workers
start, so workers never probe (fcp_data.loader.dataloader).
"""

from __future__ import annotations

import functools
import inspect
import logging
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..errors import ConfigError
from .families import FamilySpec, HFRopeModel, VisionTokens, family_of, family_spec
from .modality import Modality
from .options import VisionOptions
from .positions import NEXT_TEXT, mrope_positions
from .template import MediaLayout

__all__ = [
    "RopeProbe",
    "probe_next_text",
    "resolve_next_text",
    "resolve_vision_options",
    "transformers_next_text",
]

_LOG = logging.getLogger(__name__)

# the synthetic probe: 3 text ids, <vision_start>, 12 tubelets x 4 merged tokens, <vision_end>,
# 3 text ids; at interval 2 (Qwen2.5-VL) or 1 (Qwen2-VL) the conventions differ after the video
PROBE_GRID = (12, 4, 4)  # (tubelets, patch rows, patch cols); merged 2 x 2
PROBE_PREFIX, PROBE_SUFFIX = 4, 4  # text before the pads (incl. vision_start), after (incl. end)
PROBE_TOKENS_PER_SECOND = 2
PROBE_RULE = "qwen2-vl"  # the probe video's template; every probed rule lays it out the same


@dataclass(frozen=True, slots=True)
class RopeProbe:
    """What the installed transformers computed on the probe: the matching conventions."""

    rule: str
    version: str
    matches: tuple[str, ...]  # conventions of NEXT_TEXT whose ids equal transformers'
    detail: str  # first differing id per convention, for the error message


def _rule_of(spec: FamilySpec) -> str | None:
    """The probed rule a family spec stands for (None: the conventions cannot differ).

    Qwen3-VL runs have t = 1 (max+1 == spatial) and InternVL is 1-D: their specs name no
    transformers model to probe."""
    if spec.rope != "mrope" or spec.hf_rope_model is None:
        return None
    return spec.rule


def _hf_model(rule: str) -> HFRopeModel:
    """The transformers model whose get_rope_index rule `rule` runs (ValueError: none)."""
    hf = family_spec(rule).hf_rope_model
    if hf is None:
        raise ConfigError(f"rule {rule!r} has no transformers get_rope_index to probe")
    return hf


def _probe_layout(interval: float) -> tuple[int, list[MediaLayout], float]:
    t, h, w = PROBE_GRID
    spec = family_spec(PROBE_RULE)
    per = h * w // (spec.merge * spec.merge)  # merged tokens per tubelet: 4
    vt = VisionTokens(
        vision=t * per,
        special=2,
        frame_indices=(),
        resized=(h * spec.patch, w * spec.patch),
        grid=(t, h, w),
    )
    lay = MediaLayout(
        kind=Modality.VIDEO.token_type,
        family=family_of(PROBE_RULE),
        unit_tokens=per,
        unit_starts=np.arange(PROBE_PREFIX, PROBE_PREFIX + t * per, per),
        pad_runs=((PROBE_PREFIX, 0, t),),
        vt=vt,
    )
    return PROBE_PREFIX + t * per + PROBE_SUFFIX, [lay], interval


def probe_next_text(model: Any, rule: str, version: str = "?") -> RopeProbe:
    """Run `model.get_rope_index` on the probe video and compare it with each convention.

    `model` is any object with the transformers method (5.x signature with `mm_token_type_ids`,
    or 4.x with vision-start/video-pad ids read from `model.config`); tests pass stand-ins.
    """
    import torch

    interval = float(PROBE_TOKENS_PER_SECOND) if family_spec(rule).time_scaled else 1.0
    length, layouts, interval = _probe_layout(interval)
    t, h, w = PROBE_GRID
    n_pad = layouts[0].vt.vision
    cfg = getattr(model, "config", None)
    vid = int(getattr(cfg, "video_token_id", 2) or 2)
    start = int(getattr(cfg, "vision_start_token_id", 3) or 3)
    ids = torch.zeros(1, length, dtype=torch.long)
    ids[0, PROBE_PREFIX - 1] = start
    ids[0, PROBE_PREFIX : PROBE_PREFIX + n_pad] = vid
    types = torch.zeros(1, length, dtype=torch.long)
    types[0, PROBE_PREFIX : PROBE_PREFIX + n_pad] = Modality.VIDEO.token_type
    kwargs: dict[str, Any] = {"video_grid_thw": torch.tensor([[t, h, w]])}
    fn = model.get_rope_index
    params = inspect.signature(fn).parameters
    if "second_per_grid_ts" in params:
        kwargs["second_per_grid_ts"] = torch.tensor([1.0])
    if "mm_token_type_ids" in params:
        kwargs["mm_token_type_ids"] = types
    got = fn(ids, **kwargs)
    got = got[0] if isinstance(got, tuple) else got
    theirs = np.asarray(got[:, 0].cpu().numpy(), dtype=np.int64)
    matches, detail = [], []
    for mode in NEXT_TEXT:
        ours = mrope_positions(length, layouts, interval=interval, next_text=mode)
        if ours.shape == theirs.shape and np.array_equal(ours, theirs):
            matches.append(mode)
            continue
        if ours.shape != theirs.shape:
            detail.append(f"{mode}: shape {ours.shape} vs {theirs.shape}")
            continue
        i = int(np.flatnonzero((ours != theirs).any(axis=0))[0])
        detail.append(
            f"{mode}: token {i} ours {ours[:, i].tolist()} theirs {theirs[:, i].tolist()}"
        )
    return RopeProbe(rule=rule, version=version, matches=tuple(matches), detail="; ".join(detail))


def _build_model(rule: str) -> tuple[Any, str]:
    """A weightless (meta-device) tiny model of the rule's transformers class, and the version."""
    import torch
    import transformers

    hf = _hf_model(rule)
    cfg_cls, model_cls = (
        getattr(transformers, hf.config_class),
        getattr(transformers, hf.model_class),
    )
    text = dict(
        hidden_size=8,
        intermediate_size=8,
        num_hidden_layers=1,
        num_attention_heads=1,
        num_key_value_heads=1,
        rope_scaling={"type": "mrope", "mrope_section": [2, 1, 1]},
    )
    # the family's tiny vision config (tuples become the lists transformers' configs hold)
    vision: dict[str, Any] = {
        k: list(v) if isinstance(v, tuple) else v for k, v in hf.vision_config
    }
    if family_spec(rule).time_scaled:  # Qwen2.5-VL: the probe's temporal ids in time units
        vision["tokens_per_second"] = PROBE_TOKENS_PER_SECOND
    cfg = cfg_cls(text_config=text, vision_config=vision)
    with torch.device("meta"):  # get_rope_index reads only the config: allocate nothing
        model = model_cls(cfg)
    return model, str(transformers.__version__)


@functools.cache  # once per process and rule: the import is seconds, the answer never changes
def transformers_next_text(rule: str) -> RopeProbe | str:
    """The installed transformers' convention for `rule` (a RopeProbe), or why it is unknown."""
    try:
        model, version = _build_model(rule)
    except (ImportError, AttributeError, TypeError, ValueError, RuntimeError) as exc:
        return f"transformers' {_hf_model(rule).model_class} is not usable here ({exc!r})"
    try:
        return probe_next_text(model, rule, version)
    except (AttributeError, TypeError, ValueError, RuntimeError, IndexError, StopIteration) as exc:
        return f"transformers {version} get_rope_index failed on the probe ({exc!r})"


@functools.cache  # the statement is made once per process and (rule, choice)
def _state(rule: str, level: int, message: str) -> None:
    _LOG.log(level, "%s", message)


def resolve_next_text(choice: str, spec: FamilySpec) -> str:
    """The concrete convention for `choice` ("auto", "max+1", "spatial") on `spec`'s family."""
    if choice not in ("auto", *NEXT_TEXT):
        raise ConfigError(
            f"VisionOptions(next_text={choice!r}); allowed: auto, {', '.join(NEXT_TEXT)}"
        )
    rule = _rule_of(spec)
    if rule is None:  # the conventions give the same ids: nothing to decide
        return "max+1" if choice == "auto" else choice
    probe = transformers_next_text(rule)
    if isinstance(probe, str):  # transformers unknown here
        if choice == "auto":
            _state(
                rule,
                logging.WARNING,
                f"fcp {rule}: {probe}; VisionOptions(next_text='auto') uses 'max+1' (Qwen's "
                "fine-tuning code). Set next_text explicitly to the convention your model runs.",
            )
            return "max+1"
        return choice
    if choice == "auto":
        if not probe.matches:
            raise ConfigError(
                f"VisionOptions(next_text='auto'): transformers {probe.version} "
                f"{_hf_model(rule).model_class}.get_rope_index matches neither 'max+1' nor "
                f"'spatial' on a 12-tubelet probe video ({probe.detail}); fcp cannot reproduce its "
                "positions. Pass next_text='max+1' or 'spatial' explicitly to train anyway."
            )
        chosen = probe.matches[0]
        _state(
            rule,
            logging.INFO,
            f"fcp {rule}: M-RoPE next_text={chosen!r}, what the installed transformers "
            f"{probe.version} get_rope_index computes (checked on a probe video)",
        )
        return chosen
    if choice not in probe.matches:
        other = probe.matches[0] if probe.matches else "neither convention"
        _state(
            rule,
            logging.WARNING,
            f"fcp {rule}: VisionOptions(next_text={choice!r}) differs from the installed "
            f"transformers {probe.version} get_rope_index ({other}): positions after each video "
            "differ from what the model's own forward computes. Use next_text='auto' to follow it.",
        )
    return choice


def resolve_vision_options(options: VisionOptions, spec: FamilySpec) -> VisionOptions:
    """`options` with `next_text` made concrete for `spec` (a copy; the input is untouched)."""
    concrete = resolve_next_text(options.next_text, spec)
    return options if concrete == options.next_text else replace(options, next_text=concrete)
