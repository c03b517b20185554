"""Blending: several sources mixed with weights into one stream of global batches.

    blend = Blend([text_index, video_index], weights=[0.7, 0.3], names=["text", "video"])
    loader = FCPDataLoader(blend, cluster=..., cost=..., replica=r, global_batch_size=256)

Global batch b of epoch e takes floor(w_k * G) samples from source k plus the G - sum(floor)
leftover slots dealt by fractional part with a draw seeded by (seed, e, b): every batch is
within one sample of the weights and the expected mix is exact. Each source keeps its own
cursor: the samples source k has given so far (all earlier batches of all earlier epochs) fix
where it is in its own sequence of permutations, one per pass over it, seeded by (seed, k,
pass). A 10-sample source with weight 0.5 thus starts its 2nd pass while a 10,000-sample one
is still in its 1st: epochs of the sources advance independently. Everything is a pure
function of (seed, epoch, batch), so exact and elastic resume work as for one source (state is
the loader's few integers). An epoch of the blend is `batches_per_epoch` global batches
(default: as many as the sources' total size needs).

Positions are numbered source after source (offset[k] + position in source k); `Blend` has the
source interface (arrays, `read`, `prefetch`, a token store view) and counts per-source samples
per batch for `BatchMetrics.source_counts`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ConfigError, IndexMismatchError
from ..readers.sample_source import SAMPLE_COLUMNS
from .source import open_source

__all__ = ["Blend", "BlendSampler"]


@dataclass(kw_only=True, slots=True)
class BlendSampler:
    """Global batches of a blend (see the module docstring); the GlobalBatchSampler interface."""

    sizes: tuple[int, ...]
    weights: tuple[float, ...]
    global_batch_size: int
    seed: int = 0
    drop_last: bool = False
    shuffle: bool = True
    batches_per_epoch: int | None = None
    _cursors: dict[int, np.ndarray] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @property
    def num_samples(self) -> int:
        return int(sum(self.sizes))

    def num_batches(self) -> int:
        if self.batches_per_epoch is not None:
            return int(self.batches_per_epoch)
        n, g = self.num_samples, self.global_batch_size
        return max(1, n // g if self.drop_last else -(-n // g))

    def counts(self, epoch: int, index: int) -> np.ndarray:
        """Samples of each source in global batch `index` of `epoch` (sums to G)."""
        g = self.global_batch_size
        quota = np.asarray(self.weights) * g
        base = np.floor(quota + 1e-9).astype(np.int64)  # 0.7 * 10 is 7, not 6.999...
        while base.sum() > g:  # the 1e-9 nudge rounded one quota up too far
            base[int(np.argmax(base - quota))] -= 1
        left = g - int(base.sum())
        if left > 0:
            frac = np.clip(quota - base, 0.0, None)
            rng = np.random.default_rng([int(self.seed), int(epoch), int(index), 1])
            pick = rng.choice(len(base), size=left, replace=False, p=frac / frac.sum())
            base[pick] += 1
        return base

    def _epoch_counts(self, epoch: int) -> np.ndarray:
        return np.stack([self.counts(epoch, b) for b in range(self.num_batches())])

    def _cursor(self, epoch: int) -> np.ndarray:
        """Samples each source gave in all epochs before `epoch` (cached per epoch)."""
        if epoch not in self._cursors:
            e0 = max((e for e in self._cursors if e < epoch), default=0)
            start = self._cursors.get(e0, np.zeros(len(self.sizes), dtype=np.int64))
            self._cursors[e0] = start
            for e in range(e0, int(epoch)):
                start = start + self._epoch_counts(e).sum(axis=0)
                self._cursors[e + 1] = start
        return self._cursors[epoch]

    def _draw(self, k: int, first: int, n: int) -> np.ndarray:
        """Draws first..first+n-1 of source k: pass p = draw // size, permuted per pass."""
        size = self.sizes[k]
        out = np.empty(n, dtype=np.int64)
        done = 0
        while done < n:
            c = first + done
            p, at = divmod(c, size)
            take = min(n - done, size - at)
            perm = (
                np.random.default_rng([int(self.seed), k, p, 2]).permutation(size)
                if self.shuffle
                else np.arange(size)
            )
            out[done : done + take] = perm[at : at + take]
            done += take
        return out

    def order(self, epoch: int) -> np.ndarray:
        """The epoch's batches back to back, in blend positions (offset[k] + position).

        Each source's draws for the whole epoch are taken at once (one permutation per pass
        touched, not one per batch), then dealt to the batches in order.
        """
        counts = self._epoch_counts(epoch)
        cursor = self._cursor(epoch)
        offsets = np.concatenate([[0], np.cumsum(self.sizes)[:-1]])
        streams = [
            offsets[k] + self._draw(k, int(cursor[k]), int(counts[:, k].sum()))
            for k in range(len(self.sizes))
        ]
        at = np.zeros(len(self.sizes), dtype=np.int64)
        parts = []
        for row in counts:
            for k, n in enumerate(row):
                parts.append(streams[k][at[k] : at[k] + n])
                at[k] += n
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def batch(self, epoch: int, index: int, order: np.ndarray | None = None) -> np.ndarray:
        nb = self.num_batches()
        if not 0 <= index < nb:
            raise IndexError(f"batch index={index} is outside [0, {nb}) for this epoch")
        o = self.order(epoch) if order is None else order
        g = self.global_batch_size
        return o[index * g : (index + 1) * g]


class _BlendStore:
    """The sources' token stores behind blend positions (a source without one: none)."""

    def __init__(self, stores: list[Any], offsets: np.ndarray) -> None:
        self.stores, self.offsets = stores, offsets

    def _at(self, p: int) -> tuple[Any, int]:
        k = int(np.searchsorted(self.offsets, p, side="right")) - 1
        return self.stores[k], p - int(self.offsets[k])

    def has(self, p: int) -> bool:
        store, q = self._at(p)
        return store is not None and store.has(q)

    def tokens(self, p: int, *, eod: int, eod_id: int) -> Any:
        store, q = self._at(p)
        if store is None:
            raise KeyError(f"blend position {p} has no token store")
        return store.tokens(q, eod=eod, eod_id=eod_id)


class Blend:
    """Several sources as one, mixed by weight (see the module docstring)."""

    def __init__(
        self,
        sources: Sequence[Any],
        *,
        weights: Sequence[float],
        names: Sequence[str] | None = None,
        batches_per_epoch: int | None = None,
    ) -> None:
        if len(sources) < 1 or len(weights) != len(sources):
            raise ConfigError(
                f"a blend needs one weight per source: {len(sources)} sources, "
                f"{len(weights)} weights"
            )
        w = np.asarray(weights, dtype=np.float64)
        if not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
            raise ConfigError(f"blend weights {list(weights)} must be >= 0 with a positive sum")
        self.weights = tuple(float(x) for x in w / w.sum())
        self.names = (
            tuple(names) if names is not None else tuple(f"source{k}" for k in range(len(sources)))
        )
        self.batches_per_epoch = batches_per_epoch
        self.sources = [open_source(s) for s in sources]
        specs = {s.header.tokenizer for s in self.sources}
        if len(specs) > 1:
            raise IndexMismatchError(
                f"blended sources were counted with different tokenizers {sorted(specs)}; "
                "index them all with the tokenizer the loader uses"
            )
        self.sizes = tuple(len(s.seqlens) for s in self.sources)
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)[:-1]]).astype(np.int64)
        self.keys = np.concatenate([np.asarray(s.keys).astype(str) for s in self.sources])
        for name in SAMPLE_COLUMNS:
            cols = [np.asarray(getattr(s, name)) for s in self.sources]
            setattr(self, name, np.concatenate(cols))
        self.header = self.sources[0].header  # one tokenizer for all (checked above)
        self.skipped = [s for src in self.sources for s in src.skipped]

    def make_sampler(self, **kw: Any) -> BlendSampler:
        """The loader's sampler for this blend (global_batch_size, seed, drop_last, shuffle)."""
        return BlendSampler(
            sizes=self.sizes,
            weights=self.weights,
            batches_per_epoch=self.batches_per_epoch,
            **kw,
        )

    def source_of(self, positions: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.offsets, np.asarray(positions), side="right") - 1

    def source_counts(self, positions: np.ndarray) -> tuple[int, ...]:
        """Samples of each source among `positions` (per-source counts for the metrics)."""
        return tuple(
            int(c) for c in np.bincount(self.source_of(positions), minlength=len(self.sources))
        )

    def read(self, p: int, exts: list[str] | None = None) -> dict[str, bytes]:
        k = int(self.source_of(np.asarray([p]))[0])
        src, q = self.sources[k], int(p) - int(self.offsets[k])
        return src.read(q) if exts is None else src.read(q, exts)

    @property
    def has_remote(self) -> bool:
        return any(getattr(s, "has_remote", False) for s in self.sources)

    def prefetch(self, positions: Sequence[int]) -> None:
        ks = self.source_of(np.asarray(positions, dtype=np.int64))
        for k, src in enumerate(self.sources):
            fn = getattr(src, "prefetch", None)
            mine = [int(p) - int(self.offsets[k]) for p, kk in zip(positions, ks) if kk == k]
            if fn is not None and mine:
                fn(mine)

    def token_store(self) -> _BlendStore | None:
        """A view of the sources' token stores, or None when no source has one."""
        from .token_source import open_token_store

        stores = [open_token_store(s) for s in self.sources]
        return None if all(s is None for s in stores) else _BlendStore(stores, self.offsets)

    def __len__(self) -> int:
        return int(sum(self.sizes))

    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuild, (self.sources, self.weights, self.names, self.batches_per_epoch)


def _rebuild(sources: list[Any], weights: Any, names: Any, batches: int | None) -> Blend:
    return Blend(sources, weights=weights, names=names, batches_per_epoch=batches)
