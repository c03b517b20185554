"""FCPDataLoader: the DataLoader users swap in; yields zigzag-sharded MicroBatches with plans.

Planning runs ahead in torch DataLoader worker processes (see `prefetch`); with num_workers=0
the same code runs inline and yields identical micro-batches. (`fcp_exec` and its
megatron adapter `packed_seq_params` are the training side; this module does not import them.)

    loader = FCPDataLoader(index_dir, cluster=cluster, cost=cost, replica=my_replica,
                           global_batch_size=256, tokenizer=tok, vision_rule="qwen2.5-vl")
    loader.load_state_dict(ckpt["loader"])           # exact or elastic resume
    for mb in loader:
        with fcp_exec.cp_context(mb.rank_plan, groups=cache, wave_groups=mb.wave_groups) as cp:
            if not mb.is_empty:                     # an empty wave is a no-op
                mb = mb.to(device)
                loss = (model(mb.tokens, mb.position_ids, labels=mb.labels,
                              packed_seq_params=packed_seq_params(mb)) * mb.loss_mask).sum()
                (loss / mb.global_num_loss_tokens).backward()   # a share of the global mean
            fcp_exec.all_reduce_gradients(model)    # SUM the shares (docs/design.md)
        if mb.is_last_wave:
            optimizer.step(); ckpt["loader"] = loader.state_dict()
"""

from __future__ import annotations

import logging
import multiprocessing
import numbers
from collections import deque
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..collate import MicroBatch
from ..errors import ConfigError
from ..planner import Cluster, CostModel
from ..planner.api import check_strategy
from ..readers.length_index import LengthIndex
from ..readers.text import as_tokenizer, self_contained
from ..vision.families import VisionTokenRule
from .blend import Blend
from .encode import CustomEncoder, SampleEncoder, Tokenizer
from .global_batch import BatchBuilder
from .make_encoder import make_encoder
from .options import LoaderOptions, check_int
from .prefetch import planned_batches
from .read_ahead import ReadAhead
from .resume import plan_settings, resume_point, sampler_settings, source_fingerprint
from .sampler import GlobalBatchSampler
from .source import check_source_matches, open_source, source_skipped, with_access
from .time_limit import SampleTimeLimit
from .types import BatchMetrics, LoaderState, PlannedBatch, SampleSource
from .workers import WorkerBoard

__all__ = ["FCPDataLoader", "LoaderOptions"]


class FCPDataLoader:
    """Yields this replica's MicroBatch for every wave of every global batch, in order.

    `source`: a length index (`fcp_data.readers.LengthIndex` or its directory) or shard specs
    (scanned once into an in-memory `fcp_data.readers.ScannedSource`). `replica` is this
    replica's index in [0, cluster.num_replicas); every replica builds its own loader with the
    same arguments but its replica index, and all of them agree on every plan (MicroBatch.digest).
    `tokenizer` turns text into ids and must be the one the index was counted with: a
    `tokenizers.Tokenizer`, a transformers tokenizer, any spec `fcp index --tokenizer` takes (a
    local tokenizer.json or directory, `bytes:R`, `py:module:callable`), or a callable str -> ids
    (see readers.text.as_tokenizer). Its `spec` is checked against the index header
    (IndexMismatchError naming both, and their files), as is `vision_rule`. Without one, an
    index counted with `bytes:R` (a plain `fcp index`) tokenizes with `BytesTokenizer` (exactly
    the ids it counted), and one with a token store needs none for its stored text.
    """

    def __init__(
        self,
        source: SampleSource | str | Path,
        *,
        cluster: Cluster,
        cost: CostModel,
        replica: int,
        global_batch_size: int,
        seed: int = 0,
        num_workers: int = 2,
        prefetch_factor: int = 2,
        tokenizer: Tokenizer | Any = None,
        vision_rule: VisionTokenRule | str | None = None,
        strategy: str = "fcp",
        options: LoaderOptions | None = None,
    ) -> None:
        self.options = opts = _check_options(options)
        self.cluster, self.cost = _check_model(cluster, cost)
        self.replica = _check_replica(replica, cluster)
        check_int("global_batch_size", global_batch_size, low=1, what=" (sequences per step)")
        seed = check_int("seed", seed)
        self.num_workers = check_int("num_workers", num_workers, what=" (0 = plan inline)")
        self.prefetch_factor = check_int("prefetch_factor", prefetch_factor, low=1)
        if opts.planner is None:
            check_strategy(strategy)
        tokenizer = None if tokenizer is None else as_tokenizer(tokenizer)  # ids + spec
        self.source = self._open_source(source, tokenizer, vision_rule)
        tokenizer = self._default_tokenizer(tokenizer)
        self.sampler = self._make_sampler(global_batch_size, seed)
        self._fingerprint: str | None = None
        self._plan_settings = plan_settings(
            strategy=strategy,
            planner=opts.planner,
            cluster=cluster,
            cost=cost,
            on_too_long=opts.on_too_long,
        )
        encoder = make_encoder(self.source, tokenizer, vision_rule, opts)
        self._builder = self._make_batch_step(encoder, strategy)
        self._epoch, self._batch, self._wave = 0, 0, 0
        self.metrics: BatchMetrics | None = None
        self._warm = False
        self.metrics_history: deque[BatchMetrics] = deque(maxlen=opts.metrics_history)

    # ---- set-up steps (each reads what the caller passed, never changes it) --------------
    def _open_source(
        self,
        source: SampleSource | str | Path,
        tokenizer: Any,
        vision_rule: VisionTokenRule | str | None,
    ) -> SampleSource:
        """The source this loader reads: opened, checked against the loader's tokenizer and
        vision rule, and reaching its shards with the loader's options (`with_access`: a
        caller's LengthIndex, or Blend of them, is never changed; where an option differs the
        loader reads through its own copy)."""
        opts = self.options
        src = open_source(
            source,
            tokenizer=tokenizer,
            vision_rule=vision_rule,
            on_error=opts.on_error,
            fields=(opts.text_field, opts.caption_field),  # a scan counts the loader's fields
        )
        self.source_skipped = source_skipped(src)
        if self.source_skipped:
            logging.getLogger(__name__).warning(
                "%d samples were left out of the source (corrupt, empty or undecodable; counted "
                "in BatchMetrics.index_skipped), e.g. %s",
                len(self.source_skipped),
                self.source_skipped[:3],
            )
        check_source_matches(src, tokenizer, vision_rule)
        if isinstance(src, LengthIndex):  # how to reach non-local shards
            src = with_access(
                src,
                owned=src is not source,
                remote=opts.remote,
                shard_cache=opts.shard_cache,
                allow_pipe=opts.allow_pipe,
            )
        if isinstance(src, Blend):  # its indexes run `pipe:` commands only when allowed
            own = [
                with_access(
                    s, owned=False, remote=None, shard_cache=None, allow_pipe=opts.allow_pipe
                )
                if isinstance(s, LengthIndex)
                else s
                for s in src.sources
            ]
            if any(a is not b for a, b in zip(own, src.sources)):
                src = src.with_sources(own)  # the caller's blend and indexes stay as they were
        return src

    def _default_tokenizer(self, tokenizer: Any) -> Any:
        """The tokenizer given, or for an index counted with `bytes:R` (and no vision path)
        the one it counted with: exactly its ids, no file needed."""
        recorded = str(getattr(self.source.header, "tokenizer", "") or "")
        if tokenizer is None and self.options.vision is None and self_contained(recorded):
            return as_tokenizer(recorded)
        return tokenizer

    def _make_sampler(self, global_batch_size: int, seed: int) -> GlobalBatchSampler:
        """Sample ids of every global batch; a Blend mixes its sources by weight."""
        opts = self.options
        sampling = {"global_batch_size": global_batch_size, "seed": seed}
        sampling.update(drop_last=opts.drop_last, shuffle=opts.shuffle)
        make_sampler = getattr(self.source, "make_sampler", None)
        if callable(make_sampler):
            return make_sampler(**sampling)
        return GlobalBatchSampler(num_samples=len(self.source.seqlens), **sampling)

    def _make_batch_step(
        self, encoder: SampleEncoder | CustomEncoder, strategy: str
    ) -> BatchBuilder:
        """What turns (epoch, batch index) into this replica's micro-batches, in a worker."""
        opts = self.options
        planner = opts.planner
        if planner is None:
            from ..planner import plan_global_batch  # type: ignore[attr-defined]

            planner = plan_global_batch
        return BatchBuilder(
            source=self.source,
            sampler=self.sampler,
            cluster=self.cluster,
            cost=self.cost,
            replica=self.replica,
            planner=planner,
            encoder=encoder,
            strategy=strategy,
            on_too_long=opts.on_too_long,
            on_error=opts.on_error,
            pad_id=opts.pad_id,
            time_limit=SampleTimeLimit(opts.sample_timeout_s, board=self._worker_board()),
            index_skipped=len(self.source_skipped),
            read_ahead=self._read_ahead(),
        )

    # ---- sizes -------------------------------------------------------------------------
    @property
    def num_batches(self) -> int:
        """Global batches per epoch (an optimizer step each)."""
        return self.sampler.num_batches()

    def __len__(self) -> int:
        """Refused with the reason: an epoch yields `plan.num_waves` micro-batches per global
        batch, and a batch's wave count is known only once it is planned (1 to 6 waves a batch
        in the README's corpus), so no count of micro-batches exists up front. TypeError, which
        `list()`, `tqdm` and length hints read as "no length"; the counts that do exist are
        `num_batches` (global batches per epoch) and `progress`."""
        raise TypeError(
            f"len(FCPDataLoader) is unknowable: an epoch of {self.num_batches} global batches "
            "yields plan.num_waves micro-batches per batch, known only once each batch is "
            "planned; use loader.num_batches (global batches per epoch, an optimizer step each) "
            "or loader.progress (epoch, batches done, batches per epoch)"
        )

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def progress(self) -> tuple[int, int, int]:
        """(epoch, global batches done in it, global batches per epoch) for progress bars.

        There is no __len__: the micro-batch count of an epoch depends on every batch's plan.
        """
        return self._epoch, self._batch, self.num_batches

    # ---- state ---------------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Start `epoch` from its first batch (a no-op when already in it, e.g. after resume).

        `epoch` must be a whole number >= 0 (int(1.5) would silently be 1) and, for a Blend,
        at most its sampler's `max_epoch` (reaching a far epoch would hang before batch one).
        """
        epoch = check_int("epoch", epoch)
        limit = getattr(self.sampler, "max_epoch", None)
        if limit is not None and epoch > limit:
            raise ConfigError(f"epoch={epoch} is past {limit}, the last epoch this blend reaches")
        if epoch != self._epoch:
            self._epoch, self._batch, self._wave = epoch, 0, 0

    @property
    def source_fingerprint(self) -> str:
        """Digest of every key and length of the source (computed once, on first use)."""
        if self._fingerprint is None:
            self._fingerprint = source_fingerprint(self.source.keys, self.source.seqlens)
        return self._fingerprint

    def state_dict(self) -> dict[str, int | str]:
        """Where the next micro-batch comes from: a few integers and two fingerprints."""
        s = LoaderState(
            epoch=self._epoch,
            batch=self._batch,
            wave=self._wave,
            seed=self.sampler.seed,
            global_batch_size=self.sampler.global_batch_size,
            num_samples=self.sampler.num_samples,
            num_replicas=self.cluster.num_replicas,
            source_fingerprint=self.source_fingerprint,
            sampler=sampler_settings(self.sampler),
            plan=self._plan_settings,
        )
        return {f: getattr(s, f) for f in s.__struct_fields__}

    def load_state_dict(self, state: Mapping[str, int | str]) -> None:
        """Resume exactly (same cluster) or elastically (other replica count: same samples).

        Every field is checked (StateError names it): types and ranges, the batch within the
        epoch, the wave within the batch's plan, and the dataset and sampler settings.
        """

        def waves(sampler: GlobalBatchSampler, epoch: int, batch: int) -> int:
            self._builder.sampler = sampler
            try:
                return self._builder.plan(sampler.batch(epoch, batch)).num_waves
            finally:
                self._builder.sampler = self.sampler

        sampler, self._epoch, self._batch, self._wave = resume_point(
            state,
            sampler=self.sampler,
            num_replicas=self.cluster.num_replicas,
            fingerprint=self.source_fingerprint,
            num_waves=waves,
            plan=self._plan_settings,
        )
        self.sampler = self._builder.sampler = sampler

    # ---- iteration -----------------------------------------------------------------------
    def _read_ahead(self) -> ReadAhead | None:
        """The read-ahead of each building process (remote shards only: a local read has no
        round trip to hide); the budget is the loader's, split evenly among its workers."""
        budget = self.options.read_ahead_bytes // max(1, self.num_workers)
        if budget <= 0 or not getattr(self.source, "has_remote", False):
            return None
        return ReadAhead(budget)

    def _worker_board(self) -> WorkerBoard | None:
        """Where workers say which sample they are in, so a hung one's error names it."""
        if not self.num_workers:
            return None
        board = WorkerBoard()
        board.locate = self._shard_of_key
        return board

    def _shard_of_key(self, epoch: int, batches: list[int], key: str) -> str | None:
        """The shard of sample `key` of these global batches (keys may repeat across shards,
        so a batch's positions are searched first), for naming a hung worker's sample."""
        keys = self.source.keys
        hits = [int(p) for b in batches for p in self.sampler.batch(epoch, b) if keys[p] == key]
        if not hits:
            hits = np.flatnonzero(np.asarray(keys) == key).tolist()[:1]
        return _shard_of(self.source, hits[0]) if hits else None

    def _planned(self, epoch: int, start: int, stop: int) -> Iterator[PlannedBatch]:
        if start >= stop:
            return
        board = self._builder.time_limit.board
        if board is not None:
            board.reset()  # records of earlier workers must not be read as the new ones'
        opts = self.options
        method = multiprocessing.get_context(opts.multiprocessing_context).get_start_method()
        if self.num_workers and not self._warm and method == "fork":
            # forked workers inherit the planner's compiled kernels: ~0.6 s of numba loading
            # paid once here instead of once per worker per epoch
            self._builder.plan(self.sampler.batch(epoch, start))
            self._warm = True
        yield from planned_batches(
            self._builder,
            epoch,
            start,
            stop,
            num_workers=self.num_workers,
            prefetch_factor=self.prefetch_factor,
            options=opts,
        )

    def __iter__(self) -> Iterator[MicroBatch]:
        epoch, start, skip = self._epoch, self._batch, self._wave
        log = logging.getLogger(__name__)
        for pb in self._planned(epoch, start, self.num_batches):
            self.metrics = m = pb.metrics
            self.metrics_history.append(m)
            log.info(
                "epoch %d batch %d: %d seqs, %d tokens, %d waves, degrees %s, predicted %.4gs "
                "(%.3fx bound), planned in %.1f ms, %d skipped",
                m.epoch,
                m.batch_index,
                m.num_sequences,
                m.num_tokens,
                m.num_waves,
                list(m.degrees),
                m.predicted_time,
                m.ratio_to_bound,
                1e3 * m.planning_s,
                len(m.skipped),
            )
            n = len(pb.micro_batches)
            for w in range(skip, n):
                if w + 1 == n:
                    self._batch, self._wave = pb.batch_index + 1, 0
                else:
                    self._batch, self._wave = pb.batch_index, w + 1
                yield pb.micro_batches[w]
            skip = 0
        if self._epoch == epoch and self._batch >= self.num_batches:
            self._epoch, self._batch, self._wave = epoch + 1, 0, 0


def _shard_of(src: Any, pos: int) -> str | None:
    """The shard URL of sample `pos` when the source records it (LengthIndex, ScannedSource,
    Blend), else None."""
    if hasattr(src, "sources") and callable(getattr(src, "source_of", None)):  # a Blend
        k = int(src.source_of(np.asarray([pos]))[0])
        return _shard_of(src.sources[k], pos - int(src.offsets[k]))
    if callable(getattr(src, "shard_url", None)):
        return str(src.shard_url(pos))
    records = getattr(src, "records", None)
    if records is not None and hasattr(records[pos], "url"):
        return str(records[pos].url)
    return None


def _check_options(options: LoaderOptions | None) -> LoaderOptions:
    opts = options or LoaderOptions()
    if not isinstance(opts, LoaderOptions):
        raise ConfigError(f"options={opts!r} must be a LoaderOptions")
    return opts


def _check_model(cluster: Cluster, cost: CostModel) -> tuple[Cluster, CostModel]:
    if not isinstance(cluster, Cluster) or not isinstance(cost, CostModel):
        raise ConfigError(
            f"cluster= must be a fcp_data.planner.Cluster and cost= a CostModel, got "
            f"{type(cluster).__name__} and {type(cost).__name__}"
        )
    return cluster, cost


def _check_replica(replica: int, cluster: Cluster) -> int:
    n = cluster.num_replicas
    whole = isinstance(replica, (numbers.Integral, np.integer))
    if isinstance(replica, (bool, np.bool_)) or not whole or not 0 <= replica < n:
        raise ConfigError(
            f"replica={replica!r} is outside [0, {n}) or not an integer: it is this replica's "
            "index in the DP x CP domain (the cluster's num_replicas)"
        )
    return int(replica)
