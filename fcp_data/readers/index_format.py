"""On-disk layout of a length index: a directory of .npy arrays plus a msgspec JSON header.

Arrays are loaded with `np.load(mmap_mode="r")`, so opening a 100M-sample index costs page
faults, not a parse. Per-sample arrays share the sample order; members (one row per tar member)
are addressed by `member_start[i] : member_start[i] + member_count[i]`.
"""

from __future__ import annotations

from typing import Any

import msgspec

from .errors import SkippedSample
from .scan import ScanConfig

__all__ = [
    "FORMAT_VERSION",
    "HEADER_NAME",
    "MEMBER_ARRAYS",
    "SAMPLE_ARRAYS",
    "IndexHeader",
    "ShardEntry",
]

FORMAT_VERSION = 1
HEADER_NAME = "header.json"
# name -> dtype of the per-sample arrays (keys are stored as a fixed-width unicode array).
SAMPLE_ARRAYS: dict[str, str] = {
    "shard": "int32",
    "modality": "int8",
    "text_tokens": "int64",
    "vision_tokens": "int64",
    "special_tokens": "int64",
    "seqlens": "int64",
    "causal": "bool",
    "member_start": "int64",
    "member_count": "int32",
    "num_frames": "int32",
    "fps": "float64",
    "width": "int32",
    "height": "int32",
}
MEMBER_ARRAYS: dict[str, str] = {"member_offset": "int64", "member_size": "int64"}


class ShardEntry(msgspec.Struct, frozen=True, kw_only=True):
    """`url` is relative to the index directory when the shard is a local file."""

    url: str
    fingerprint: str
    size: int
    num_samples: int


class IndexHeader(msgspec.Struct, frozen=True, kw_only=True):
    format_version: int
    num_samples: int
    scan: ScanConfig
    rule: dict[str, Any]  # the rule's settings(): name and every constant that changes a count
    tokenizer: str  # the counter's spec, e.g. "bytes:4" or "hf:tokenizer.json"
    shards: list[ShardEntry]
    skipped: list[SkippedSample]
    fcp_version: str = ""
