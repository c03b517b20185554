"""One global batch to plan and draw: its lengths, attention kinds, origin and a saved plan.

Sources, as `fcp view` / `fcp plan` take them: a saved Plan JSON (its groups record every
sequence's length; a file from `fcp plan -o` also the cost model and cluster it was made with,
`saved.py`), a length index or shard specs (one global batch drawn by the loader's own sampler,
so the picture is the batch training would see at that step), or a list of lengths.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import ConfigError
from ..planner import Cluster, CostModel, Plan

__all__ = [
    "Batch",
    "batch_from_index",
    "batch_from_lengths",
    "batch_from_plan",
    "batch_from_shards",
]


@dataclass(kw_only=True, slots=True, frozen=True)
class Batch:
    """One global batch to plan: lengths, attention kinds, where it came from, a saved plan and
    the cost model and cluster that plan was made with (None when its file records none)."""

    seqlens: np.ndarray
    causal: np.ndarray
    label: str
    saved: Plan | None = None
    saved_cost: CostModel | None = None
    saved_cluster: Cluster | None = None


def batch_from_lengths(lengths: Sequence[int] | np.ndarray, label: str = "lengths") -> Batch:
    """A batch of causal sequences with these token counts."""
    lens = np.asarray(lengths, np.int64)
    if lens.ndim != 1 or lens.size == 0 or np.any(lens < 1):
        raise ConfigError(
            f"{label}: lengths must be a non-empty list of positive token counts, got "
            f"{lens.size} value(s) (min {int(lens.min()) if lens.size else 'n/a'})"
        )
    return Batch(seqlens=lens, causal=np.ones(lens.size, bool), label=label)


def batch_from_plan(path: str | Path) -> Batch:
    """The sequences a saved plan (`fcp plan -o plan.json`) places; the plan rides along, with
    the cost model and cluster it was made with when the file records them."""
    from .saved import read_saved_plan

    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"--plan {p}: no such file (write one with `fcp plan -o {p}`)")
    saved = read_saved_plan(p.read_bytes(), f"--plan {p}")
    plan = saved.plan
    if plan.dropped:
        raise ConfigError(
            f"{p}: the plan dropped sequences {list(plan.dropped)[:5]} whose lengths it does not "
            "record; re-plan with on_too_long='raise' to view it"
        )
    n = max(plan.sequence_ids(), default=-1) + 1
    lens, causal = np.zeros(n, np.int64), np.ones(n, bool)
    for g in plan.groups:
        lens[list(g.sequence_ids)] = g.seqlens
        causal[list(g.sequence_ids)] = g.causal
    return Batch(
        seqlens=lens,
        causal=causal,
        label=f"plan {p}",
        saved=plan,
        saved_cost=saved.cost,
        saved_cluster=saved.cluster,
    )


def _draw(src: object, label: str, batch_size: int, seed: int, batch_index: int) -> Batch:
    from ..loader.sampler import GlobalBatchSampler

    seqlens = np.asarray(src.seqlens)  # type: ignore[attr-defined]
    if batch_size < 1 or batch_index < 0:
        raise ConfigError(f"--batch {batch_size} must be >= 1 and --batch-index {batch_index} >= 0")
    sampler = GlobalBatchSampler(
        num_samples=len(seqlens), global_batch_size=min(batch_size, len(seqlens)), seed=seed
    )
    if batch_index >= sampler.num_batches():
        raise ConfigError(
            f"--batch-index {batch_index}: {label} has {sampler.num_batches()} global batches of "
            f"{sampler.global_batch_size} in an epoch (0..{sampler.num_batches() - 1})"
        )
    ids = np.sort(sampler.batch(0, batch_index))
    return Batch(
        seqlens=np.asarray(seqlens[ids], np.int64),
        causal=np.asarray(src.causal)[ids],  # type: ignore[attr-defined]
        label=f"{label}, global batch {batch_index}",
    )


def batch_from_index(
    path: str | Path, *, batch_size: int = 512, seed: int = 0, batch_index: int = 0
) -> Batch:
    """Global batch `batch_index` of epoch 0 of a length index, as the loader samples it."""
    from ..readers import LengthIndex

    p = Path(path)
    if not p.is_dir():
        raise ConfigError(f"--index {p}: no such directory (build one with `fcp index ... -o {p}`)")
    return _draw(LengthIndex.open(p), f"index {p}", batch_size, seed, batch_index)


def batch_from_shards(
    specs: Sequence[str], *, batch_size: int = 512, seed: int = 0, batch_index: int = 0
) -> Batch:
    """Like `batch_from_index`, for shard specs scanned in memory (default tokenizer and rule)."""
    from ..loader.source import open_source

    src = open_source([str(s) for s in specs])
    return _draw(src, f"{len(specs)} shard spec(s)", batch_size, seed, batch_index)
