"""FCPDataLoader: the DataLoader users swap in; yields zigzag-sharded MicroBatches with plans.

Planning runs in torch DataLoader worker processes: worker w of W plans and collates global
batches start+w, start+w+W, ... and torch hands their results back round-robin, so batch b+1
is planned (the paper's asynchronous CPU scheduling) while the training loop runs batch b. With
num_workers=0 the same code runs inline and yields identical micro-batches. (`fcp_exec` and its
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
        if mb.is_last_wave:
            fcp_exec.all_reduce_gradients(model)    # SUM the shares (docs/design.md)
            optimizer.step(); ckpt["loader"] = loader.state_dict()
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import multiprocessing
import warnings
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from ..collate import MicroBatch
from ..planner import Cluster, CostModel
from ..readers.rules_base import VisionTokenRule
from ..readers.text import as_tokenizer
from .encode import CustomEncoder, SampleEncoder, Tokenizer
from .global_batch import BatchBuilder, PlannedBatch, SampleReadError
from .handoff import one_buffer
from .sampler import GlobalBatchSampler
from .source import check_source_matches, open_source, resolve_rule, source_skipped
from .token_source import open_token_store
from .types import BatchMetrics, LoaderState, SampleSource

__all__ = ["FCPDataLoader", "LoaderOptions"]


@dataclass(kw_only=True, slots=True)
class LoaderOptions:
    """Less common knobs, kept out of the constructor's signature.

    on_error: "raise" stops at the first unreadable sample (the error names its key); "skip"
    masks it out of the loss, keeps the plan's shapes and reports it in BatchMetrics.skipped.
    on_too_long: "drop" lets the planner leave out samples no CP group can hold (counted).
    timeout_s: seconds the main process waits for a worker's batch before raising (0 = forever;
    a dead worker is detected by torch either way).
    metrics_history: how many global batches' BatchMetrics `FCPDataLoader.metrics_history` keeps
    (10,000 ~ a few MB; older ones are only in the log).
    """

    drop_last: bool = False
    shuffle: bool = True
    on_error: Literal["raise", "skip"] = "raise"
    on_too_long: Literal["raise", "drop"] = "raise"
    pad_id: int = 0
    eod_id: int = 0
    special_token_id: int = 0
    vision_token_id: int = 0
    text_field: str = "text"
    caption_field: str = "caption"
    decode_backend: str = "pyav"
    timeout_s: float = 0.0
    pin_memory: bool = False
    multiprocessing_context: str | None = None
    metrics_history: int = 10_000
    planner: Callable[..., Any] | None = None
    encode: Callable[[Mapping[str, Any]], np.ndarray] | None = None
    vision: Any = None
    """fcp_data.vision.VisionOptions: real templates, pixel payload and M-RoPE ids for media."""
    token_store: bool = True
    """Use the index's token store (`fcp index --store-tokens`) for text when it has one."""
    remote: Any = None
    """fcp_data.readers.remote.RemoteOptions for http(s)/s3 shards (retries, fsspec options)."""
    shard_cache: Any = None
    """fcp_data.readers.cache.ShardCache where pipe: shards are copied to be loaded."""


class _PlannedBatches(IterableDataset):
    """Global batches [start, stop) of one epoch, dealt round-robin to DataLoader workers."""

    def __init__(self, builder: BatchBuilder, epoch: int, start: int, stop: int) -> None:
        self.builder, self.epoch, self.start, self.stop = builder, epoch, start, stop

    def __iter__(self) -> Iterator[PlannedBatch]:
        info = get_worker_info()
        w, n = (0, 1) if info is None else (info.id, info.num_workers)
        order = self.builder.sampler.order(self.epoch)
        for b in range(self.start + w, self.stop, n):
            pb = self.builder.build(self.epoch, b, order)
            if info is not None:  # crossing a process boundary: one buffer per micro-batch
                pb.micro_batches = [one_buffer(mb) for mb in pb.micro_batches]
            yield pb


def _identity(x: PlannedBatch) -> PlannedBatch:
    return x


class FCPDataLoader:
    """Yields this replica's MicroBatch for every wave of every global batch, in order.

    `source`: a length index (`fcp_data.readers.LengthIndex` or its directory) or shard specs
    (scanned once into an in-memory `fcp_data.readers.ScannedSource`). `replica` is this
    replica's index in [0, cluster.num_replicas); every replica builds its own loader with the
    same arguments but its replica index, and all of them agree on every plan (MicroBatch.digest).
    `tokenizer` turns text into ids and must be the one the index was counted with: a
    `tokenizers.Tokenizer`, a transformers tokenizer, a local tokenizer.json or directory, or a
    callable str -> ids (see readers.text.as_tokenizer). Its `spec` is checked against the index
    header (IndexMismatchError naming both), as is `vision_rule`.
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
        self.options = opts = options or LoaderOptions()
        if isinstance(replica, bool) or not 0 <= int(replica) < cluster.num_replicas:
            raise ValueError(
                f"replica={replica!r} is outside [0, {cluster.num_replicas}): it is this "
                "replica's index in the DP x CP domain (the cluster's num_replicas)"
            )
        if num_workers < 0 or prefetch_factor < 1:
            raise ValueError(
                f"num_workers={num_workers} must be >= 0 and prefetch_factor={prefetch_factor} >= 1"
            )
        tokenizer = None if tokenizer is None else as_tokenizer(tokenizer)  # ids + spec
        self.source = src = open_source(source, tokenizer=tokenizer, vision_rule=vision_rule)
        self.source_skipped = source_skipped(src)
        if self.source_skipped:
            logging.getLogger(__name__).warning(
                "%d samples were left out of the source (corrupt, empty or undecodable), e.g. %s",
                len(self.source_skipped),
                self.source_skipped[:3],
            )
        check_source_matches(src, tokenizer, vision_rule)
        if hasattr(src, "shard_cache"):  # a LengthIndex: how to reach non-local shards
            src.remote = opts.remote if opts.remote is not None else src.remote
            src.shard_cache = opts.shard_cache if opts.shard_cache is not None else src.shard_cache
        self.cluster, self.cost, self.replica = cluster, cost, int(replica)
        self.num_workers, self.prefetch_factor = int(num_workers), int(prefetch_factor)
        sampling = {"global_batch_size": global_batch_size, "seed": seed}
        sampling.update(drop_last=opts.drop_last, shuffle=opts.shuffle)
        make_sampler = getattr(src, "make_sampler", None)  # a Blend mixes its sources by weight
        self.sampler = (
            make_sampler(**sampling)
            if callable(make_sampler)
            else GlobalBatchSampler(num_samples=len(src.seqlens), **sampling)
        )
        planner = opts.planner
        if planner is None:
            from ..planner import plan_global_batch  # type: ignore[attr-defined]

            planner = plan_global_batch
        encoder: SampleEncoder | CustomEncoder
        if opts.encode is not None:
            encoder = CustomEncoder(fn=opts.encode)
        else:
            rule = resolve_rule(src, vision_rule)
            token_ids, text = None, tokenizer
            if opts.vision is not None and rule is not None:
                from ..vision import SpecialTokenIds, TokenizerText

                token_ids = opts.vision.token_ids or SpecialTokenIds.from_tokenizer(
                    tokenizer, rule.name
                )
                text = TokenizerText(tokenizer) if tokenizer is not None else None
                if text is not None and hasattr(rule, "text_counter"):
                    # template text (timestamps, frame labels) counted by the loader's tokenizer,
                    # as the index counted it with its exact counter
                    rule = copy.copy(rule)
                    rule.text_counter = text.count
            encoder = SampleEncoder(
                tokenizer=text,
                vision=opts.vision if rule is not None else None,
                token_ids=token_ids,
                rule=rule,
                text_field=opts.text_field,
                caption_field=opts.caption_field,
                eod_id=opts.eod_id,
                special_token_id=opts.special_token_id,
                vision_token_id=opts.vision_token_id,
                decode_backend=opts.decode_backend,
            )
            if opts.token_store:
                encoder.store = open_token_store(src)
        self._builder = BatchBuilder(
            source=src,
            sampler=self.sampler,
            cluster=cluster,
            cost=cost,
            replica=self.replica,
            planner=planner,
            encoder=encoder,
            strategy=strategy,
            on_too_long=opts.on_too_long,
            on_error=opts.on_error,
            pad_id=opts.pad_id,
        )
        self._epoch, self._batch, self._wave = 0, 0, 0
        self.metrics: BatchMetrics | None = None
        self._warm = False
        self.metrics_history: deque[BatchMetrics] = deque(maxlen=opts.metrics_history)

    # ---- sizes -------------------------------------------------------------------------
    @property
    def num_batches(self) -> int:
        """Global batches per epoch (an optimizer step each)."""
        return self.sampler.num_batches()

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
        """Start `epoch` from its first batch (a no-op when already in it, e.g. after resume)."""
        if int(epoch) != self._epoch:
            self._epoch, self._batch, self._wave = int(epoch), 0, 0

    def state_dict(self) -> dict[str, int]:
        """Where the next micro-batch comes from: a few integers, no sample buffers."""
        s = LoaderState(
            epoch=self._epoch,
            batch=self._batch,
            wave=self._wave,
            seed=self.sampler.seed,
            global_batch_size=self.sampler.global_batch_size,
            num_samples=self.sampler.num_samples,
            num_replicas=self.cluster.num_replicas,
        )
        return {
            k: int(v)
            for k, v in zip(s.__struct_fields__, (getattr(s, f) for f in s.__struct_fields__))
        }

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Resume exactly (same cluster) or elastically (other replica count: same samples)."""
        s = LoaderState(**{k: int(state[k]) for k in LoaderState.__struct_fields__})
        if s.num_samples != self.sampler.num_samples:
            raise ValueError(
                f"the state was saved over {s.num_samples} samples but the source holds "
                f"{self.sampler.num_samples}: resume needs the same index"
            )
        batch, wave = s.batch, s.wave
        g = self.sampler.global_batch_size
        if s.global_batch_size != g:
            consumed = s.batch * s.global_batch_size
            batch, wave = consumed // g, 0
            warnings.warn(
                f"global_batch_size changed on resume ({s.global_batch_size} -> {g}): "
                f"continuing at batch {batch} of the new size ({consumed} samples were "
                f"consumed{'; ' + str(consumed % g) + ' are seen again' if consumed % g else ''})",
                stacklevel=2,
            )
        if s.num_replicas != self.cluster.num_replicas and wave:
            warnings.warn(
                f"resumed on {self.cluster.num_replicas} replicas (saved on {s.num_replicas}) "
                f"in the middle of a global batch (wave {wave}): the batch is re-planned and "
                "restarts at its first wave",
                stacklevel=2,
            )
            wave = 0
        if s.seed != self.sampler.seed:
            self.sampler = dataclasses.replace(self.sampler, seed=s.seed)
            self._builder.sampler = self.sampler
        self._epoch, self._batch, self._wave = s.epoch, batch, wave

    # ---- iteration -----------------------------------------------------------------------
    def _planned(self, epoch: int, start: int, stop: int) -> Iterator[PlannedBatch]:
        ds = _PlannedBatches(self._builder, epoch, start, stop)
        if start >= stop:
            return
        if self.num_workers == 0:
            yield from ds
            return
        opts = self.options
        method = multiprocessing.get_context(opts.multiprocessing_context).get_start_method()
        if not self._warm and method == "fork":
            # forked workers inherit the planner's compiled kernels: ~0.6 s of numba loading
            # paid once here instead of once per worker per epoch
            self._builder.plan(self.sampler.batch(epoch, start))
            self._warm = True
        dl = DataLoader(
            ds,
            batch_size=None,
            num_workers=min(self.num_workers, max(stop - start, 1)),
            prefetch_factor=self.prefetch_factor,
            collate_fn=_identity,
            pin_memory=opts.pin_memory,
            timeout=opts.timeout_s,
            multiprocessing_context=opts.multiprocessing_context,
        )
        pending: dict[int, PlannedBatch] = {}
        nxt = start
        it = iter(dl)
        while True:
            try:
                pb = next(it)
            except StopIteration:
                break
            except SampleReadError:
                raise
            except RuntimeError as e:  # a worker died (segfaulting decoder, OOM kill, timeout)
                raise RuntimeError(self._suspects(e, epoch, nxt, stop)) from e
            pending[pb.batch_index] = pb  # torch returns workers' items round-robin
            while nxt in pending:
                yield pending.pop(nxt)
                nxt += 1
        if pending or nxt != stop:
            raise RuntimeError(f"DataLoader workers delivered batches up to {nxt}, need {stop}")

    def _suspects(self, err: Exception, epoch: int, first: int, stop: int) -> str:
        last = min(stop, first + self.num_workers * self.prefetch_factor)  # batches in flight
        keys: list[str] = []
        for b in range(first, last):
            keys += self._builder.own_keys(epoch, b)
        return (
            f"{err}\nwhile loading global batches {first}..{last - 1} of epoch {epoch} on "
            f"replica {self.replica}; this replica's samples there: {keys[:32]}"
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
