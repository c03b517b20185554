"""Streaming mode: metadata records for shards that have no index.

`stream_records` yields `SampleRecord`s in shard order (token counts, modality, member
offsets) without decoding any pixel, so a planning window of, say, 512 samples can be formed
from metadata alone; `record.fetch()` reads the payload later by seeking (local shards) or from
memory (pipe: shards, whose members are kept because a pipe cannot be re-read).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from .errors import SkippedSample
from .scan import SampleRecord, ScanConfig, Scanner
from .shards import expand_shards
from .text import TokenCounter

__all__ = ["stream_records"]


def stream_records(
    shards: Sequence[str] | str,
    *,
    config: ScanConfig | None = None,
    counter: TokenCounter | Any = None,
    skipped: list[SkippedSample] | None = None,
) -> Iterator[SampleRecord]:
    """Records of every sample of `shards` in order; bad ones follow `config.on_error`.

    Pass a list as `skipped` to receive (shard, key, reason) for each skipped sample.
    """
    urls = expand_shards(shards)
    with Scanner(config or ScanConfig(), counter) as scanner:
        for url in urls:
            yield from scanner.scan(url)
            if skipped is not None:
                skipped.extend(scanner.log.skipped)
                scanner.log.skipped.clear()
