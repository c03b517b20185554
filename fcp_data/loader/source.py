"""Sources for the loader: a length index on disk, or shards scanned into one in memory.

Planning needs every sample's length before a batch is formed, and elastic, exactly resumable
global batches need a fixed sample numbering. Shards without an index are therefore scanned
once when the loader is built (metadata only: text is counted, video headers or sidecars are
read, no pixel is decoded) into an in-memory index with the LengthIndex interface; samples are
later fetched by tar offset. Samples the scan rejects are listed in `skipped` and reported.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import IndexMismatchError

__all__ = [
    "ScannedSource",
    "check_source_matches",
    "open_source",
    "resolve_rule",
    "source_skipped",
]


class ScannedSource:
    """An in-memory length index over shards (see the module docstring)."""

    def __init__(self, records: list[Any], header: dict[str, Any], skipped: list[Any]) -> None:
        if not records:
            raise ValueError(
                f"the shards hold no usable sample ({len(skipped)} skipped: "
                f"{[tuple(s) for s in skipped[:3]]}); check the shard paths and on_error"
            )
        self.records = records
        self.header = header
        self.skipped = skipped
        self.keys = np.array([r.key for r in records])
        self.seqlens = np.array([r.seqlen for r in records], dtype=np.int64)
        self.causal = np.array([r.causal for r in records], dtype=bool)
        for name in (
            "modality",
            "text_tokens",
            "vision_tokens",
            "special_tokens",
            "num_frames",
            "width",
            "height",
        ):
            setattr(self, name, np.array([getattr(r, name) for r in records], dtype=np.int64))
        self.fps = np.array([r.fps for r in records], dtype=np.float64)

    @classmethod
    def scan(
        cls,
        shards: Sequence[str] | str,
        *,
        tokenizer: Any = None,
        vision_rule: str | None = None,
        config: Any = None,
    ) -> ScannedSource:
        """Scan shard specs (paths, globs, braces, pipe:) with the readers' Scanner."""
        import msgspec

        from ..readers import ScanConfig, stream_records
        from ..readers.text import CallableCounter, TokenCounter

        cfg = config or ScanConfig()
        if vision_rule is not None and isinstance(vision_rule, str):
            cfg = msgspec.structs.replace(cfg, vision_rule=vision_rule)
        counter = None
        if tokenizer is not None:
            counter = (
                tokenizer
                if isinstance(tokenizer, TokenCounter)
                else CallableCounter(tokenizer, spec=getattr(tokenizer, "spec", ""))
            )
        skipped: list[Any] = []
        records = list(stream_records(shards, config=cfg, counter=counter, skipped=skipped))
        header = {
            "tokenizer": getattr(counter, "spec", None) or cfg.tokenizer,
            "rule": {"name": cfg.vision_rule},
            "scan": cfg,
        }
        return cls(records, header, skipped)

    def read(self, i: int) -> dict[str, bytes]:
        return self.records[i].fetch()


def _is_index(path: str | os.PathLike[str]) -> bool:
    from ..readers.index_format import HEADER_NAME

    return (Path(path) / HEADER_NAME).is_file()


def open_source(
    source: Any, *, tokenizer: Any = None, vision_rule: Any = None, on_error: str = "skip"
) -> Any:
    """A LengthIndex for an index directory; shards (specs) are scanned (a bad sample raises
    under `on_error="raise"`, is skipped and listed under "skip"); objects pass through."""
    if isinstance(source, (str, os.PathLike)) and _is_index(source):
        from ..readers import LengthIndex

        return LengthIndex.open(source)
    if isinstance(source, (str, os.PathLike)) or (
        isinstance(source, (list, tuple)) and all(isinstance(s, (str, os.PathLike)) for s in source)
    ):
        one = isinstance(source, (str, os.PathLike))
        specs = [str(source)] if one else [str(s) for s in source]
        rule = vision_rule if isinstance(vision_rule, str) else getattr(vision_rule, "name", None)
        from ..readers import ScanConfig

        config = ScanConfig(on_error=on_error)
        return ScannedSource.scan(specs, tokenizer=tokenizer, vision_rule=rule, config=config)
    return source


def source_skipped(source: Any) -> list[tuple[str, str]]:
    """(key, reason) of samples the index or scan left out (corrupt, empty, undecodable)."""
    out = []
    for s in getattr(source, "skipped", None) or []:
        key = getattr(s, "key", None)
        reason = getattr(s, "reason", None)
        if key is None and isinstance(s, (tuple, list)):
            key, reason = s[1], s[2]
        out.append((str(key), str(reason)))
    return out


def _header_value(source: Any, *names: str) -> Any:
    header = getattr(source, "header", None)
    for n in names:
        v = getattr(header, n, None) if header is not None else None
        if v is None and isinstance(header, Mapping):
            v = header.get(n)
        if v is not None:
            return v
    return None


def _spec(obj: Any) -> Any:
    """What identifies a tokenizer or rule in an index header: a spec string or settings dict."""
    if obj is None or isinstance(obj, (str, dict)):
        return obj
    settings = getattr(obj, "settings", None)
    if callable(settings):
        return dict(settings())
    return getattr(obj, "spec", None) or getattr(obj, "name", None)


def resolve_rule(source: Any, rule: Any) -> Any:
    """The VisionTokenRule object for video samples: given, by name, or the index's own."""
    if rule is not None and not isinstance(rule, str):
        return rule
    name = rule or (_header_value(source, "rule") or {}).get("name")
    has_media = hasattr(source, "modality") and bool(np.any(np.asarray(source.modality) != 0))
    if name is None or not has_media:
        return None
    from ..readers import get_rule

    scan = _header_value(source, "scan")
    overrides = dict(getattr(scan, "rule_overrides", None) or {}) if rule is None else {}
    return get_rule(name, **overrides)


def check_source_matches(source: Any, tokenizer: Any, vision_rule: Any) -> None:
    """Raise when the index was counted with another tokenizer or vision rule than the loader's."""
    for want, names, what in (
        (_spec(tokenizer), ("tokenizer", "text_counter", "counter"), "tokenizer"),
        (_spec(vision_rule), ("vision_rule", "rule"), "vision rule"),
    ):
        have = _spec(_header_value(source, *names))
        if isinstance(want, str) and isinstance(have, dict):
            have = have.get("name")
        if want is not None and have is not None and want != have:
            raise IndexMismatchError(
                f"the index was built with {what} {have!r} but the loader has {want!r}: "
                "token counts would not match the plan; rebuild the index with the "
                f"loader's {what} or pass the one the index was built with"
            )
