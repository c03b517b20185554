"""Readers: corpus shards in every format fcp reads, and the length index over them.

    from fcp_data.readers import LengthIndex, build_index, stream_records
    from fcp_data.vision.decode import decode_index_video     # vision has its own face
    index = build_index("shards/video-{000000..000009}.tar", "index", workers=4)
    index = LengthIndex.open("index", expect_rule="qwen2.5-vl")   # memory-mapped, verified
    planner_input = index.seqlens, index.causal                    # int64, bool per sample
    members = index.read(i)                                        # {"mp4": b..., "json": b...}
    source = ScannedSource.scan("shards/text-*.tar")               # no index: scanned in memory
    frames = decode_index_video(index, i, token_range=(0, 4096))   # uint8 (T, H, W, 3)
    for rec in stream_records("pipe:curl -s URL/shard-{0..9}.tar"):  # no index: metadata only
        rec.seqlen, rec.causal, rec.fetch()

Submodules are imported lazily (PEP 562) so `import fcp_data.readers` does no work.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "CompressedShardError",
    "ErrorPolicy",
    "LengthIndex",
    "RatioCounter",
    "RuleMismatchError",
    "SampleError",
    "SampleRecord",
    "SampleSource",
    "ScanConfig",
    "ScanHeader",
    "ScannedSource",
    "SourceHeader",
    "StaleIndexError",
    "TokenStore",
    "TooManyFailures",
    "build_index",
    "expand_shards",
    "load_counter",
    "make_shards",
    "stream_records",
]

_WHERE = {
    "CompressedShardError": "errors",
    "ErrorPolicy": "errors",
    "SampleError": "errors",
    "TooManyFailures": "errors",
    "LengthIndex": "length_index",
    "TokenStore": "token_store",
    "RuleMismatchError": "length_index",
    "StaleIndexError": "length_index",
    "RatioCounter": "text",
    "load_counter": "text",
    "SampleRecord": "scan",
    "SampleSource": "sample_source",
    "SourceHeader": "sample_source",
    "ScanConfig": "scan",
    "ScanHeader": "scanned",
    "ScannedSource": "scanned",
    "build_index": "build",
    "expand_shards": "shards",
    "make_shards": "synth",
    "stream_records": "stream",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
