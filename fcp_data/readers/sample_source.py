"""The sample-source contract: what the loader and the planner read from a length index.

Two sources satisfy it: `LengthIndex` (an index directory on disk, memory-mapped) and
`ScannedSource` (shards scanned into memory when there is no index). Any object with these
attributes can be handed to `FCPDataLoader` as well: every array is indexed by sample number
and has one entry per sample.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import numpy as np

    from .errors import SkippedSample
    from .scan import ScanConfig

__all__ = ["SAMPLE_COLUMNS", "SampleSource", "SourceHeader"]

# The per-sample arrays every source has (one row per sample), in the protocol's order.
SAMPLE_COLUMNS = (
    "seqlens",
    "causal",
    "modality",
    "text_tokens",
    "vision_tokens",
    "special_tokens",
    "num_frames",
    "fps",
    "width",
    "height",
)


class SourceHeader(Protocol):
    """How the lengths were counted: checked against the loader's tokenizer and vision rule.

    `tokenizer` is the counter's spec ("bytes:4", "hf:tokenizer.json", ...); `rule` the vision
    rule's `settings()` (its name and every constant that changes a count); `scan` the rest of
    the scan settings (text fields, special tokens, rule overrides). `IndexHeader` has them.
    """

    @property
    def tokenizer(self) -> str: ...

    @property
    def rule(self) -> Mapping[str, Any]: ...

    @property
    def scan(self) -> ScanConfig: ...


@runtime_checkable
class SampleSource(Protocol):
    """Per-sample arrays in sample order, the header, the left-out samples, and `read(i)`.

    `seqlens[i]` is sample i's planned token count (`text_tokens + vision_tokens +
    special_tokens`), `causal[i]` its attention kind, `modality[i]` 0 text / 1 video / 2 image;
    `num_frames`, `fps`, `width`, `height` describe the media (0 for text) so that vision
    tokens can be recomputed without decoding. `read(i)` returns sample i's members
    (extension -> bytes).
    """

    @property
    def keys(self) -> np.ndarray: ...

    @property
    def seqlens(self) -> np.ndarray: ...

    @property
    def causal(self) -> np.ndarray: ...

    @property
    def modality(self) -> np.ndarray: ...

    @property
    def text_tokens(self) -> np.ndarray: ...

    @property
    def vision_tokens(self) -> np.ndarray: ...

    @property
    def special_tokens(self) -> np.ndarray: ...

    @property
    def num_frames(self) -> np.ndarray: ...

    @property
    def fps(self) -> np.ndarray: ...

    @property
    def width(self) -> np.ndarray: ...

    @property
    def height(self) -> np.ndarray: ...

    @property
    def header(self) -> SourceHeader: ...

    @property
    def skipped(self) -> Sequence[SkippedSample]: ...

    def read(self, i: int) -> Mapping[str, bytes]: ...
