"""The one place that maps a vision-rule name to its model family.

Rule names are what an index header records and `fcp index --vision-rule` takes: "qwen2-vl",
"qwen2.5-vl", "qwen3-vl" (the Qwen family, `families.qwen`) and "internvl"
(`families.internvl`). Everything else asks here: `get_rule` builds a rule with checked
settings, `family_spec` / `rule_spec` give the spec the template, payload, positions and
planner cost read, `family_of` the template family a tokenizer's ids are looked up for. An
unknown name is one `UnknownRuleError` listing the allowed names, whichever of these is asked.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import typing
from types import MappingProxyType, ModuleType

from ...errors import ConfigError
from . import internvl, qwen
from .base import FamilySpec, TextCounter, VisionTokenRule

__all__ = [
    "FAMILIES",
    "MAX_SETTING",
    "RULE_NAMES",
    "TOKEN_STRINGS",
    "UnknownRuleError",
    "family_of",
    "family_spec",
    "family_tokens",
    "get_rule",
    "rule_spec",
    "spec_of_family",
]

# the family modules, in the order their rules are listed; each exposes FAMILY, RULE_NAMES,
# TOKEN_STRINGS, SPECS (one per rule name, in order), CONFIG (its rule's settings class), spec,
# spec_of_rule, rule_defaults and make_rule: a new family is a module with these and one entry
# here
_MODULES: tuple[ModuleType, ...] = (qwen, internvl)
RULE_NAMES: tuple[str, ...] = tuple(n for m in _MODULES for n in m.RULE_NAMES)
FAMILIES: tuple[str, ...] = tuple(m.FAMILY for m in _MODULES)
# family -> template role -> token string, read-only ({"qwen": {"video_pad": "<|video_pad|>"}})
TOKEN_STRINGS = MappingProxyType(
    {m.FAMILY: MappingProxyType(dict(m.TOKEN_STRINGS)) for m in _MODULES}
)
MAX_SETTING = 2**31 - 1  # counts and pixel areas must fit the index's int32 columns
# (low, high) settings that must be ordered when both are given
_ORDERED = (
    ("min_frames", "max_frames"),
    ("video_min_pixels", "video_max_pixels"),
    ("image_min_pixels", "image_max_pixels"),
    ("min_dynamic_patch", "max_dynamic_patch"),
)


class UnknownRuleError(ConfigError):
    """A vision-rule (or family) name no family module defines; names the allowed ones."""


def _module(rule_name: str) -> ModuleType:
    for m in _MODULES:
        if rule_name in m.RULE_NAMES:
            return m
    raise UnknownRuleError(
        f"unknown vision rule {rule_name!r}; choose one of {', '.join(RULE_NAMES)}"
    )


def family_of(rule_name: str) -> str:
    """The template family of rule `rule_name`: "qwen" for qwen2-vl / qwen2.5-vl / qwen3-vl,
    "internvl" for internvl."""
    return str(_module(rule_name).FAMILY)


def family_spec(rule_name: str, patch_size: int | None = None) -> FamilySpec:
    """The spec of rule `rule_name`; `patch_size` is the rule config's (None: the rule's own
    default, 16 for Qwen3-VL, 14 for the others)."""
    spec: FamilySpec = _module(rule_name).spec(rule_name, patch_size)
    return spec


def rule_spec(rule: VisionTokenRule) -> FamilySpec:
    """The spec of a built rule (a Qwen rule's patch size comes from its config)."""
    spec: FamilySpec = _module(rule.name).spec_of_rule(rule)
    return spec


def family_tokens(family: str) -> dict[str, str]:
    """Template role -> token string of family `family` ("qwen", "internvl")."""
    return spec_of_family(family).token_strings()


def spec_of_family(family: str) -> FamilySpec:
    """The spec of family `family`'s first rule, for what every rule of a family shares (token
    strings, tokens and patches per encoder unit, tile side, payload shapes): a `MediaLayout`
    knows its family, not its rule."""
    for m in _MODULES:
        if family == m.FAMILY:
            spec: FamilySpec = m.SPECS[0]
            return spec
    raise UnknownRuleError(f"unknown vision family {family!r}; allowed: {', '.join(FAMILIES)}")


def _check_setting(rule: str, name: str, value: object, hint: object) -> None:
    """ConfigError naming the setting unless `value` fits its declared type and range.

    Overrides come from `--rule-option KEY=VALUE` (JSON) or Python; a list, a negative fps, or
    nan would otherwise be stored in the index header (nan as null: an index that cannot be
    opened) or crash the first video with a raw TypeError.
    """
    allowed = set(typing.get_args(hint)) or {hint}
    if value is None and type(None) in allowed:
        return
    if bool in allowed:
        if not isinstance(value, bool):
            raise ConfigError(f"rule {rule!r} setting {name}={value!r} must be true or false")
        return
    integral = int in allowed and float not in allowed
    ok = isinstance(value, numbers.Integral if integral else numbers.Real) and not isinstance(
        value, bool
    )
    if not ok or not math.isfinite(float(value)) or not 0 < float(value) <= MAX_SETTING:  # type: ignore[arg-type]
        kind = "an integer" if integral else "a finite number"
        raise ConfigError(
            f"rule {rule!r} setting {name}={value!r} must be {kind} in (0, {MAX_SETTING}]"
        )


def get_rule(
    name: str, *, text_counter: TextCounter | None = None, **overrides: object
) -> VisionTokenRule:
    """The rule called `name`, with config fields overridden by keyword (e.g. num_frames=8).

    `text_counter` counts template text (timestamps, frame labels) exactly with the model's
    tokenizer; by default Qwen2-family digit splitting is assumed.
    """
    family = _module(name)
    cls = family.CONFIG
    allowed = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(overrides) - allowed)
    if unknown:
        raise ConfigError(
            f"rule {name!r} has no setting {', '.join(unknown)}; "
            f"allowed: {', '.join(sorted(allowed))}"
        )
    hints = typing.get_type_hints(cls)
    for key, value in overrides.items():
        _check_setting(name, key, value, hints[key])
    cfg = cls(**{**family.rule_defaults(name), **overrides})
    for low, high in _ORDERED:
        lo, hi = getattr(cfg, low, None), getattr(cfg, high, None)
        if lo is not None and hi is not None and lo > hi:  # type: ignore[operator]
            raise ConfigError(f"rule {name!r}: {low}={lo} is above {high}={hi}")
    rule: VisionTokenRule = family.make_rule(name, cfg, text_counter)
    return rule
