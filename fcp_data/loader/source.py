"""The loader's source: open what the user passed, and check it against the loader's settings.

`open_source` turns an index directory into a `LengthIndex`, shard specs into a
`ScannedSource` (both in `fcp_data.readers`) and passes any other `SampleSource` through.
`check_source_matches` refuses a source counted with another tokenizer or vision rule than the
loader's: its token counts would not match the sequences the loader builds. `with_access`
gives the loader a length index that reaches its shards the loader's way (remote options, a
shard cache, `pipe:` commands allowed) without changing the index the caller passed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from ..errors import ConfigError, IndexMismatchError
from ..readers.index_format import HEADER_NAME
from ..readers.length_index import LengthIndex
from ..readers.sample_source import SAMPLE_COLUMNS, SampleSource
from ..readers.scan import ScanConfig
from ..readers.scanned import ScannedSource
from ..readers.text import TokenCounter, Tokenizer, as_counter, tokenizer_label
from ..vision.families import VisionTokenRule, get_rule
from ..vision.modality import Modality

__all__ = [
    "check_source_matches",
    "open_source",
    "resolve_rule",
    "source_skipped",
    "tokenizer_hint",
    "with_access",
]

# A vision rule as the loader takes it: a rule object or a registered rule's name.
RuleArg = VisionTokenRule | str | None
# The attributes of `SampleSource`, named in the error for an object that lacks some.
_CONTRACT = ("keys", *SAMPLE_COLUMNS, "header", "skipped", "read")


def _is_index(path: str | os.PathLike[str]) -> bool:
    return (Path(path) / HEADER_NAME).is_file()


def _counter(tokenizer: object) -> TokenCounter | None:
    """The scan's text counter for the loader's tokenizer (its `spec` names it)."""
    return None if tokenizer is None else as_counter(tokenizer)


def open_source(
    source: SampleSource | str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    tokenizer: object = None,
    vision_rule: RuleArg = None,
    on_error: str = "skip",
    fields: tuple[str, str] = ("text", "caption"),
) -> SampleSource:
    """A LengthIndex for an index directory; shards (specs) are scanned (a bad sample raises
    under `on_error="raise"`, is skipped and listed under "skip"); sources pass through.
    `fields` (text_field, caption_field): what a scan of shard specs counts (LoaderOptions')."""
    if isinstance(source, (str, os.PathLike)) and _is_index(source):
        return LengthIndex.open(source)
    if isinstance(source, (str, os.PathLike)) or (
        isinstance(source, (list, tuple)) and all(isinstance(s, (str, os.PathLike)) for s in source)
    ):
        specs = (
            [str(source)] if isinstance(source, (str, os.PathLike)) else [str(s) for s in source]
        )
        config = ScanConfig(on_error=on_error, text_field=fields[0], caption_field=fields[1])
        rule_name = vision_rule if isinstance(vision_rule, str) else None
        if isinstance(vision_rule, VisionTokenRule):
            rule_name = vision_rule.name
        if rule_name is not None:
            config = msgspec.structs.replace(config, vision_rule=rule_name)
        return ScannedSource.scan(specs, counter=_counter(tokenizer), config=config)
    if not isinstance(source, SampleSource):
        missing = [name for name in _CONTRACT if not hasattr(source, name)]
        raise ConfigError(
            f"source={type(source).__name__} is not a sample source (missing {missing}): pass "
            "an index directory, shard specs, a fcp_data.readers.LengthIndex or an object with "
            "the attributes of fcp_data.readers.SampleSource"
        )
    return source


def with_access(
    index: LengthIndex, *, owned: bool, remote: Any, shard_cache: Any, allow_pipe: bool
) -> LengthIndex:
    """`index` reaching its shards with these options (None: the index's own), pipes checked.

    An index the loader opened itself (`owned`) is configured in place; one the caller passed is
    never changed: when an option differs the loader reads through its own index over the same
    directory (what a DataLoader worker gets anyway when the index is pickled to it), so two
    loaders with other options can share one caller's index. PipeNotAllowedError when the
    index lists `pipe:` shards and neither it nor `allow_pipe` allows them.
    """
    remote = index.remote if remote is None else remote
    shard_cache = index.shard_cache if shard_cache is None else shard_cache
    allow = index.allow_pipe or allow_pipe
    same = (remote, shard_cache, allow) == (index.remote, index.shard_cache, index.allow_pipe)
    if not owned and not same:
        own = LengthIndex.open(index.path, verify=False, allow_pipe=allow)
        own.verify_checksums = index.verify_checksums
        index, owned = own, True
    if owned:
        index.remote, index.shard_cache, index.allow_pipe = remote, shard_cache, allow
    index.refuse_pipes()
    return index


def source_skipped(source: SampleSource) -> list[tuple[str, str]]:
    """(key, reason) of samples the index or scan left out (corrupt, empty, undecodable)."""
    return [(s.key, s.reason) for s in source.skipped]


def resolve_rule(source: SampleSource, rule: RuleArg) -> VisionTokenRule | None:
    """The VisionTokenRule for media samples: given, by name, or the source's own.

    A name or the source's rule is built with the source's rule overrides only when no rule is
    given (a named rule means that rule's defaults).
    """
    if isinstance(rule, VisionTokenRule):
        return rule
    name = rule or source.header.rule.get("name")
    if name is None or not bool(np.any(np.asarray(source.modality) != Modality.TEXT)):
        return None
    overrides = dict(source.header.scan.rule_overrides) if rule is None else {}
    return get_rule(str(name), **overrides)


def _tokenizer_spec(tokenizer: object) -> str | None:
    """What names a tokenizer in a source header: a spec string, or the tokenizer's `spec`."""
    if isinstance(tokenizer, str):
        return tokenizer
    if isinstance(tokenizer, (Tokenizer, TokenCounter)):
        return tokenizer.spec or None
    return None


def _recorded_file(source: SampleSource) -> str:
    """The tokenizer file an index was counted with, as its header records it ("" if none)."""
    header = getattr(source, "header", None)
    return str(getattr(header, "tokenizer_file", "") or "")


def tokenizer_hint(source: SampleSource) -> str:
    """What the loader's "no tokenizer=" error suggests: the index's own tokenizer."""
    header = getattr(source, "header", None)
    spec = str(getattr(header, "tokenizer", "") or "")
    if not spec:
        return ""
    path = _recorded_file(source)
    if path:
        return f"tokenizer={path!r}, the file the index was counted with ({spec})"
    return f"the tokenizer the index was counted with ({spec})"


def check_source_matches(source: SampleSource, tokenizer: object, vision_rule: RuleArg) -> None:
    """Raise when the source was counted with another tokenizer or vision rule than the loader's.

    A tokenizer mismatch names both sides by file when there is one (the index header's
    `tokenizer_file`, the loader's tokenizer's `source`), not only by their hashes."""
    header = source.header
    built_rule: Mapping[str, Any] = header.rule
    want = _tokenizer_spec(tokenizer)
    have = header.tokenizer or None
    if want is not None and have is not None and want != have:
        path = _recorded_file(source)
        index_side = f"{path} ({have})" if path else repr(have)
        raise IndexMismatchError(
            f"the index was built with tokenizer {index_side} but the loader has "
            f"{tokenizer_label(tokenizer, want)}: token counts would not match the plan; "
            "pass the tokenizer the index was built with, or rebuild the index with the "
            "loader's (fcp index --tokenizer ...)"
        )
    checks: list[tuple[object, object, str]] = []
    if isinstance(vision_rule, str):
        checks.append((vision_rule, built_rule.get("name"), "vision rule"))
    elif vision_rule is not None and built_rule:
        checks.append((dict(vision_rule.settings()), dict(built_rule), "vision rule"))
    for want, have, what in checks:
        if want is not None and have is not None and want != have:
            raise IndexMismatchError(
                f"the index was built with {what} {have!r} but the loader has {want!r}: "
                "token counts would not match the plan; rebuild the index with the "
                f"loader's {what} or pass the one the index was built with"
            )
