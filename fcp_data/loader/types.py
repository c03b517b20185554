"""Small data types of the loader: resume state, per-batch metrics, a planned batch, and the
sample-source contract (`SampleSource`, defined with the sources in `fcp_data.readers`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from ..collate import MicroBatch
from ..readers.sample_source import SampleSource

__all__ = ["BatchMetrics", "LoaderState", "PlannedBatch", "SampleSource"]


class LoaderState(msgspec.Struct, frozen=True, kw_only=True):
    """Exact resume point: a few integers, no sample buffers.

    `batch` global batches of `epoch` are done and `wave` micro-batches of the next one were
    yielded. `num_replicas` and `global_batch_size` are kept only to detect a changed cluster
    (elastic resume: same samples, new plans) or a changed batch size (warned).
    `source_fingerprint` (a digest of every key and length) and `sampler` (the settings that
    change the sample order) refuse a resume over another dataset of the same size or another
    order; states saved without them are accepted with a warning.
    """

    epoch: int
    batch: int
    wave: int
    seed: int
    global_batch_size: int
    num_samples: int
    num_replicas: int
    source_fingerprint: str = ""
    sampler: str = ""
    plan: str = ""
    """The settings that decide each batch's plan (`resume.plan_settings`): a state saved
    mid-batch continues at its wave only under the same plan."""


class BatchMetrics(msgspec.Struct, frozen=True, kw_only=True):
    """What planning one global batch produced, for logs and dashboards.

    `planning_s` is wall time spent in the planner (inside the worker, overlapped with training
    when num_workers > 0); `load_s` reading, tokenizing and packing this replica's share.
    `skipped` lists (key, reason) of samples left out of this batch: too long for the cluster
    (dropped by the planner) or unreadable (masked out by this replica's group).
    `index_skipped` counts samples the index build or shard scan left out of the source (the
    same number every batch, so a dashboard never shows 0 while samples are missing).
    """

    epoch: int
    batch_index: int
    num_sequences: int
    num_tokens: int
    num_waves: int
    degrees: tuple[int, ...]
    predicted_time: float
    lower_bound: float
    winner: str
    planning_s: float
    load_s: float
    digest: str
    skipped: tuple[tuple[str, str], ...] = ()
    source_counts: tuple[int, ...] = ()
    """Samples of each blended source in this batch (loader.blend.Blend; empty otherwise)."""
    index_skipped: int = 0

    def dropped_note(self, shown: int = 4) -> str:
        """`skipped` for a step line: "dropped 0", or "dropped 6 (too long for the cluster):
        a.py, b.py, c.py, d.py +2 more" (the distinct reasons, then at most `shown` keys)."""
        if not self.skipped:
            return "dropped 0"
        reasons = sorted({reason.split(" (")[0] for _, reason in self.skipped})
        keys = [key for key, _ in self.skipped]
        more = f" +{len(keys) - shown} more" if len(keys) > shown else ""
        return f"dropped {len(keys)} ({'; '.join(reasons)}): {', '.join(keys[:shown])}{more}"

    @property
    def ratio_to_bound(self) -> float:
        return self.predicted_time / self.lower_bound if self.lower_bound > 0 else 1.0

    def as_dict(self) -> dict[str, Any]:
        d = msgspec.structs.asdict(self)
        d["ratio_to_bound"] = self.ratio_to_bound
        return d


@dataclass(kw_only=True, slots=True)
class PlannedBatch:
    """One global batch as one replica sees it: its micro-batches (one per wave) + metrics."""

    epoch: int
    batch_index: int
    micro_batches: list[MicroBatch]
    metrics: BatchMetrics

    def pin_memory(self) -> PlannedBatch:
        """Called by torch's DataLoader (pin_memory=True) in its pinning thread."""
        self.micro_batches = [mb.pin_memory() for mb in self.micro_batches]
        return self
