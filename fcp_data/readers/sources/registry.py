"""The corpus formats fcp reads: one tuple of modules, each declaring its `FORMATS`.

A shard's format is decided by its name: the format owning the suffix the name ends with,
else the first format of `MODULES` (WebDataset tars, which also read `pipe:` streams and, after
a content check at expansion, local files named for no format). Everything the readers do
differently per format goes through what the format declares (`format.CorpusFormat`), so a new
format is its module plus its line here.
"""

from __future__ import annotations

from . import jsonl, megatron, tables, tar
from .format import CorpusFormat

__all__ = [
    "MODULES",
    "fallback",
    "format_for",
    "format_named",
    "format_of",
    "formats",
    "match",
    "prefix_shard",
    "readable",
]

# tar first: the format of names no suffix claims
MODULES = (
    tar,
    jsonl,
    tables,
    megatron,
)


def formats() -> tuple[CorpusFormat, ...]:
    """Every registered format, in `MODULES` order."""
    return tuple(f for module in MODULES for f in module.FORMATS)


def _name(url: str) -> str:
    """The lower-cased name of `url` without a query string (`s3://b/x.jsonl?v=2`)."""
    base = url.split("?", 1)[0] if "://" in url else url
    return base.lower()


def match(url: str) -> CorpusFormat | None:
    """The format whose suffix `url`'s name ends with (the longest such suffix), or None."""
    if url.startswith("pipe:"):
        return None
    name = _name(url)
    best: tuple[int, CorpusFormat] | None = None
    for fmt in formats():
        for ends in fmt.suffixes:
            if name.endswith(ends) and (best is None or len(ends) > best[0]):
                best = (len(ends), fmt)
    return best[1] if best is not None else None


def format_for(url: str) -> CorpusFormat:
    """The format of shard `url` by its name; `pipe:` and unclaimed names: the first one."""
    return match(url) or fallback()


def fallback() -> CorpusFormat:
    """The format of `pipe:` streams and of names no suffix claims: the first of `MODULES`."""
    return formats()[0]


def format_of(url: str) -> str:
    """The name of shard `url`'s format (what an index records)."""
    return format_for(url).name


def format_named(name: str) -> CorpusFormat:
    """The format an index recorded as `name`; ConfigError for one this fcp does not know."""
    for fmt in formats():
        if fmt.name == name:
            return fmt
    from ...errors import ConfigError

    known = ", ".join(f.name for f in formats())
    raise ConfigError(
        f"shard format {name!r} is not one this fcp reads ({known}); the index was written by "
        "another fcp: rebuild it with `fcp index`"
    )


def prefix_shard(path: str) -> str:
    """The shard a name that is no file stands for (a megatron prefix), or ""."""
    for fmt in formats():
        if fmt.prefix is not None:
            shard = fmt.prefix(path)
            if shard:
                return shard
    return ""


def readable() -> str:
    """The formats fcp reads, as error messages list them."""
    return ", ".join(f.title for f in formats() if f.title)
