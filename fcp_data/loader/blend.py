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
from ..readers.index_format import IndexHeader, index_fingerprint
from ..readers.sample_source import SAMPLE_COLUMNS
from .sampler import global_batch
from .source import open_source

MAX_CURSOR_BATCHES = 2_000_000  # batches drawn to reach an epoch's start (BlendSampler.max_epoch)

__all__ = ["Blend", "BlendSampler", "read_fields_for"]


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

    @property
    def max_epoch(self) -> int:
        """The last epoch this sampler reaches in reasonable time.

        Epoch e starts where epochs 0..e-1 left each source, so reaching it draws the source
        counts of e x num_batches batches (~20 us each): capped at MAX_CURSOR_BATCHES (~1 min).
        A resume state or set_epoch past it is refused instead of hanging before batch one.
        """
        return max(1, MAX_CURSOR_BATCHES // self.num_batches())

    def _epoch_counts(self, epoch: int) -> np.ndarray:
        return np.stack([self.counts(epoch, b) for b in range(self.num_batches())])

    def _cursor(self, epoch: int) -> np.ndarray:
        """Samples each source gave in all epochs before `epoch` (cached per epoch)."""
        ok = isinstance(epoch, (int, np.integer)) and not isinstance(epoch, bool)
        if not ok or not 0 <= epoch <= self.max_epoch:
            raise ConfigError(
                f"epoch={epoch!r} must be an integer in [0, {self.max_epoch}] for this blend "
                f"({self.num_batches()} batches an epoch; MAX_CURSOR_BATCHES={MAX_CURSOR_BATCHES})"
            )
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

    batch = global_batch  # the one batch() of every sampler: a slice of the epoch's order


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
    """Several sources as one, mixed by weight (see the module docstring).

    Refused at construction (ConfigError / IndexMismatchError naming the source and the
    setting): weights that are not finite numbers >= 0 with a positive sum, a source with 0
    samples and a positive weight (it could never fill its quota), the same index twice (its
    weight would silently double), names that are missing, repeated or too few, sources counted
    with other tokenizers, and media sources indexed with other vision rules or rule settings
    (the loader builds every media sample with one rule: a qwen3-vl source in a qwen2.5-vl
    blend would get the wrong template and pixels). Text and caption fields may differ: each
    source is read with the fields it was indexed with (`read_fields`).
    """

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
        if names is not None and len(names) != len(sources):
            raise ConfigError(
                f"a blend needs one name per source: {len(sources)} sources, names {list(names)}"
            )
        self.names = (
            tuple(str(n) for n in names)
            if names is not None
            else tuple(f"source{k}" for k in range(len(sources)))
        )
        dup = sorted({n for n in self.names if self.names.count(n) > 1})
        if dup:
            raise ConfigError(f"blend source names {dup} repeat: names must be unique")
        w = _check_weights(weights, self.names)
        if batches_per_epoch is not None and (
            isinstance(batches_per_epoch, bool)
            or not isinstance(batches_per_epoch, (int, np.integer))
            or batches_per_epoch < 1
        ):
            raise ConfigError(f"batches_per_epoch={batches_per_epoch!r} must be an integer >= 1")
        self.weights = tuple(float(x) for x in w / w.sum())
        self.batches_per_epoch = batches_per_epoch
        self.sources = [open_source(s) for s in sources]
        self._check_sources()
        self.sizes = tuple(len(s.seqlens) for s in self.sources)
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)[:-1]]).astype(np.int64)
        self.keys = np.concatenate([np.asarray(s.keys).astype(str) for s in self.sources])
        for name in SAMPLE_COLUMNS:
            cols = [np.asarray(getattr(s, name)) for s in self.sources]
            setattr(self, name, np.concatenate(cols))
        # the loader takes the vision rule from the header: a media source's (all agree)
        media = [k for k, s in enumerate(self.sources) if _has_media(s)]
        self.header = self.sources[media[0] if media else 0].header
        self.skipped = [s for src in self.sources for s in src.skipped]
        self._fields = tuple(_fields(s) for s in self.sources)

    def with_sources(self, sources: Sequence[Any]) -> Blend:
        """This blend (weights, names, epoch length) over other objects for its sources, e.g.
        the loader's own copies of a caller's indexes; checked like any new blend."""
        return Blend(
            sources,
            weights=self.weights,
            names=self.names,
            batches_per_epoch=self.batches_per_epoch,
        )

    def _label(self, k: int) -> str:
        path = getattr(self.sources[k], "path", None)
        return f"{self.names[k]!r}" + (f" ({path})" if path is not None else "")

    def _check_sources(self) -> None:
        """Empty sources with weight, repeated sources, tokenizers and vision rules."""
        for k, src in enumerate(self.sources):
            if len(src.seqlens) == 0 and self.weights[k] > 0:
                lost = len(getattr(src, "skipped", ()))
                raise ConfigError(
                    f"blend source {self._label(k)} has 0 samples ({lost} left out at index "
                    f"time) but weight {self.weights[k]:.3g}: it could never fill its share "
                    "of a batch; fix or drop the source, or give it weight 0"
                )
        seen: dict[Any, int] = {}
        for k, src in enumerate(self.sources):
            ident = _identity(src)
            if ident in seen:
                raise ConfigError(
                    f"blend sources {self._label(seen[ident])} and {self._label(k)} are the same "
                    "data: its weight would silently count twice; pass it once with the summed "
                    "weight"
                )
            seen[ident] = k
        specs = {s.header.tokenizer for s in self.sources}
        if len(specs) > 1:

            def counted(src: Any) -> str:  # the tokenizer file too, where the index records it
                path = getattr(src.header, "tokenizer_file", "")
                return f"{path} ({src.header.tokenizer})" if path else repr(src.header.tokenizer)

            which = ", ".join(f"{self._label(k)}: {counted(s)}" for k, s in enumerate(self.sources))
            raise IndexMismatchError(
                f"blended sources were counted with different tokenizers {sorted(specs)} "
                f"({which}); index them all with the tokenizer the loader uses"
            )
        media = [k for k, s in enumerate(self.sources) if _has_media(s)]
        for k in media[1:]:
            first = media[0]
            a, b = _rule_settings(self.sources[first]), _rule_settings(self.sources[k])
            if a != b:
                diff = sorted(key for key in a.keys() | b.keys() if a.get(key) != b.get(key))
                shown = ", ".join(f"{key}: {a.get(key)!r} vs {b.get(key)!r}" for key in diff)
                raise IndexMismatchError(
                    f"blend source {self._label(k)} was indexed with another vision rule than "
                    f"{self._label(first)} ({shown}); the loader builds every media sample "
                    "with one rule (template, pixels, positions): re-index it with the same "
                    "--vision-rule and overrides, or blend only sources of one rule"
                )

    def read_fields(self, p: int) -> tuple[str, str]:
        """(text_field, caption_field) blend position `p`'s source was indexed with."""
        k = int(self.source_of(np.asarray([p]))[0])
        return self._fields[k]

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

    def members(self, p: int) -> dict[str, tuple[int, int]] | None:
        """Blend position `p`'s member table (extension -> (offset, size)) from its source's
        index, or None when that source keeps none (read it to know)."""
        k = int(self.source_of(np.asarray([p]))[0])
        table = getattr(self.sources[k], "members", None)
        return table(int(p) - int(self.offsets[k])) if callable(table) else None

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


def _check_weights(weights: Sequence[Any], names: Sequence[str]) -> np.ndarray:
    """float64 weights, or ConfigError naming the first bad one (nan, inf, < 0, not a number)."""
    out = np.empty(len(weights), dtype=np.float64)
    for k, x in enumerate(weights):
        ok = isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(
            x, (bool, np.bool_)
        )
        if not ok or not np.isfinite(float(x)) or float(x) < 0:
            raise ConfigError(
                f"blend weight {x!r} of source {names[k]!r} must be >= 0, finite and a number "
                f"(weights {list(weights)})"
            )
        out[k] = float(x)
    if out.sum() <= 0:
        raise ConfigError(f"blend weights {list(weights)} are all 0: they must have a positive sum")
    return out


def _has_media(source: Any) -> bool:
    return bool(np.any(np.asarray(source.modality) != 0))


def _rule_settings(source: Any) -> dict[str, Any]:
    """What fixes a media sample's tokens: the rule's settings and the scan's overrides."""
    header = source.header
    scan = getattr(header, "scan", None)
    overrides = dict(getattr(scan, "rule_overrides", {}) or {})
    return {**dict(header.rule), **{f"override {k}": v for k, v in overrides.items()}}


def _fields(source: Any, default: tuple[str, str] = ("text", "caption")) -> tuple[str, str]:
    """The fields `source` was indexed with (its header's scan), else `default`."""
    scan = getattr(source.header, "scan", None)
    return (
        str(getattr(scan, "text_field", default[0])),
        str(getattr(scan, "caption_field", default[1])),
    )


def _identity(source: Any) -> Any:
    """What makes two sources the same data: the same shards and counts (an index's
    fingerprint: a copy of an index at another path is the same data), else the object."""
    if isinstance(source.header, IndexHeader):
        return ("index", index_fingerprint(source.header))
    return ("object", id(source))


def read_fields_for(source: Any, text_field: str, caption_field: str) -> tuple[str, str]:
    """The (text, caption) fields to read `source` with: the ones it was indexed with.

    LoaderOptions' defaults ("text", "caption") give way to the index's record; a field set to
    something else that differs from what a source was indexed with raises ConfigError naming
    it (its token counts were taken from the other field: the plan would not fit).
    """
    parts = getattr(source, "sources", None)
    subs = list(parts) if isinstance(parts, list) else [source]
    names = getattr(source, "names", None) or [f"source{k}" for k in range(len(subs))]
    given = (text_field, caption_field)
    for k, sub in enumerate(subs):
        have = _fields(sub, given)  # a source without a scan record: the options
        for what, want, default, got in (
            ("text_field", text_field, "text", have[0]),
            ("caption_field", caption_field, "caption", have[1]),
        ):
            if want != default and want != got:
                where = f"blend source {names[k]!r}" if parts is not None else "the source"
                raise ConfigError(
                    f"LoaderOptions({what}={want!r}) but {where} "
                    f"{getattr(sub, 'path', '')} was indexed with {what} {got!r}: its token "
                    f"counts come from {got!r}; leave {what} unset or re-index with --"
                    f"{what.replace('_', '-')} {want}"
                )
    return _fields(subs[0], given)
