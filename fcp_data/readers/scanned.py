"""`ScannedSource`: shards scanned into an in-memory length index (no index directory).

Planning needs every sample's length before a batch is formed, and elastic, exactly resumable
global batches need a fixed sample numbering. Shards without an index are therefore scanned
once when the loader is built (metadata only: text is counted, video headers or sidecars are
read, no pixel is decoded) into the arrays a `LengthIndex` has; samples are later fetched by tar
offset (or from memory for pipe: shards). Samples the scan rejects are listed in `skipped`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np

from ..errors import DataError
from .errors import SkippedSample
from .scan import SampleRecord, ScanConfig, Scanner
from .stream import stream_records
from .text import TokenCounter

__all__ = ["ScanHeader", "ScannedSource"]


class ScanHeader(msgspec.Struct, frozen=True, kw_only=True):
    """How a scan counted (the `SourceHeader` of a `ScannedSource`)."""

    tokenizer: str
    rule: dict[str, Any]
    scan: ScanConfig


class ScannedSource:
    """An in-memory length index over shards (see the module docstring)."""

    def __init__(
        self, records: list[SampleRecord], header: ScanHeader, skipped: list[SkippedSample]
    ) -> None:
        if not records:
            raise DataError(
                f"the shards hold no usable sample ({len(skipped)} skipped: "
                f"{[(s.key, s.reason) for s in skipped[:3]]}); check the shard paths and on_error"
            )
        self.records = records
        self.header = header
        self.skipped = skipped
        self.keys = np.array([r.key for r in records])
        self.seqlens = np.array([r.seqlen for r in records], dtype=np.int64)
        self.causal = np.array([r.causal for r in records], dtype=bool)
        self.modality = np.array([r.modality for r in records], dtype=np.int64)
        self.text_tokens = np.array([r.text_tokens for r in records], dtype=np.int64)
        self.vision_tokens = np.array([r.vision_tokens for r in records], dtype=np.int64)
        self.special_tokens = np.array([r.special_tokens for r in records], dtype=np.int64)
        self.num_frames = np.array([r.num_frames for r in records], dtype=np.int64)
        self.width = np.array([r.width for r in records], dtype=np.int64)
        self.height = np.array([r.height for r in records], dtype=np.int64)
        self.fps = np.array([r.fps for r in records], dtype=np.float64)

    @classmethod
    def scan(
        cls,
        shards: Sequence[str] | str,
        *,
        counter: TokenCounter | None = None,
        config: ScanConfig | None = None,
    ) -> ScannedSource:
        """Scan shard specs (paths, globs, braces, pipe:) with the readers' Scanner.

        `counter` counts text (default: the config's tokenizer spec, "bytes:4").
        """
        cfg = config or ScanConfig()
        skipped: list[SkippedSample] = []
        records = list(stream_records(shards, config=cfg, counter=counter, skipped=skipped))
        scanner = Scanner(cfg, counter)
        header = ScanHeader(tokenizer=scanner.counter.spec, rule=scanner.rule.settings(), scan=cfg)
        return cls(records, header, skipped)

    def __len__(self) -> int:
        return len(self.records)

    def read(self, i: int) -> dict[str, bytes]:
        return self.records[i].fetch()

    def __repr__(self) -> str:
        return (
            f"ScannedSource(samples={len(self)}, rule={self.header.rule.get('name')!r}, "
            f"skipped={len(self.skipped)})"
        )
