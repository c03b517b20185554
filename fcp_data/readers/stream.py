"""Streaming mode: metadata records for shards that have no index.

`stream_records` yields `SampleRecord`s in shard order (token counts, modality, member
offsets) without decoding any pixel, so a planning window of, say, 512 samples can be formed
from metadata alone; `record.fetch()` reads the payload later by seeking (local shards) or from
memory (pipe: shards, whose members are kept because a pipe cannot be re-read).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from typing import Any

from .errors import EmptyIndexError, SkippedSample, empty_scan_message
from .scan import SampleRecord, ScanConfig, Scanner
from .shards import expand_shards
from .text import TokenCounter

__all__ = ["SkippedSamplesWarning", "stream_records"]


class SkippedSamplesWarning(UserWarning):
    """`stream_records` skipped samples and the caller passed no `skipped` list to hold them."""


def stream_records(
    shards: Sequence[str] | str,
    *,
    config: ScanConfig | None = None,
    counter: TokenCounter | Any = None,
    skipped: list[SkippedSample] | None = None,
) -> Iterator[SampleRecord]:
    """Records of every sample of `shards` in order; bad ones follow `config.on_error`.

    Pass a list as `skipped` to receive (shard, key, reason) for each skipped sample. Without
    one the skips are not dropped in silence (they were): a scan that yields no record at all
    raises EmptyIndexError naming them, and one that skipped some warns once at its end
    (SkippedSamplesWarning) with their count and the first reasons.
    """
    urls = expand_shards(shards)
    mine: list[SkippedSample] = [] if skipped is None else skipped
    count = 0
    with Scanner(config or ScanConfig(), counter) as scanner:
        for url in urls:
            for record in scanner.scan(url):
                count += 1
                yield record
            mine.extend(scanner.log.skipped)
            scanner.log.skipped.clear()
    if skipped is not None:
        return  # the caller holds the skips
    if count == 0:
        raise EmptyIndexError(empty_scan_message("", urls, mine))
    if mine:
        first = "; ".join(f"{s.shard}: {s.key!r}: {s.reason}" for s in mine[:3])
        more = "; ..." if len(mine) > 3 else ""
        warnings.warn(
            f"stream_records skipped {len(mine)} sample(s) ({first}{more}); pass skipped=[] "
            "to receive them",
            SkippedSamplesWarning,
            stacklevel=2,
        )
