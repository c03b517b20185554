"""Corpus formats: WebDataset tars, JSON Lines, Parquet, HF `save_to_disk`, megatron.

Each format is one module declaring a `format.CorpusFormat` (its suffixes, whether a member is
a byte range of the file, how a big file splits across index workers, its sample iterator and
how members are read back); `registry.MODULES` lists the modules, and the readers reach a
format only through the registry (`format_for(url)`, `format_named(name)`). `detect` expands
local paths into shards by those names and refuses what no format reads.

Keys count from 1 in every format ("line 1", "row 1", "doc 1"), as an editor, `nl` and SQL's
row_number() do; indexes written before rows and documents did (their shard entries lack
`meta["key_base"]`) named them from 0 and read as they are.

* `.tar`: WebDataset samples, members read by byte range; remote and `pipe:` too.
* `.jsonl` / `.ndjson`: a sample per non-blank line ("line N"), member `json` (the line's
  bytes), read by pread; remote: yes (a line is a byte range).
* `.jsonl.gz` / `.jsonl.zst`: the same at offsets in the decompressed stream, read from a
  decompressed copy in the shard cache; remote: refused.
* `.parquet`: a sample per row ("row N") of the `--text-field` column, member `txt` (a string
  column) or `json` (a chat column), read by row group; remote: refused.
* a HF `save_to_disk` directory (its `data-*.arrow`): rows as Parquet, memory-mapped; remote:
  refused.
* megatron `PREFIX.bin` + `PREFIX.idx`: a sample per document ("doc N"), member `npy` (its ids,
  a byte range of the .bin), lengths from the .idx alone; remote: yes (one range a document).

The scanner turns every format's samples into the same records as a tar's, so the length
index, the loader, resume and blending treat them alike. Names load lazily (PEP 562): the
format modules import the shard readers, which import this package.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "CorpusFormat",
    "UnreadableSourceError",
    "check_remote",
    "expand_local",
    "format_for",
    "format_named",
    "format_of",
    "formats",
    "hf_data_files",
    "prefix_shard",
    "readable",
]

_WHERE = {
    "CorpusFormat": "format",
    "UnreadableSourceError": "detect",
    "check_remote": "detect",
    "expand_local": "detect",
    "hf_data_files": "detect",
    "format_for": "registry",
    "format_named": "registry",
    "format_of": "registry",
    "formats": "registry",
    "prefix_shard": "registry",
    "readable": "registry",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
