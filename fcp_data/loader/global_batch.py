"""Planning and collating one global batch for one replica (runs inside DataLoader workers).

Every replica calls `BatchBuilder.build(epoch, b)` with the same inputs and gets the same plan
(the planner is pure and deterministic), then reads and tokenizes only the sequences of the CP
groups it belongs to and packs its zigzag shard of each. Nothing here talks to other replicas.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

import msgspec
import numpy as np

from ..collate import MicroBatch, PackedShard, VisionInput, pack_shard
from ..errors import ConfigError, DataError
from ..planner import Cluster, CostModel, Plan, RankPlan, Wave
from ..readers.remote import is_remote
from .encode import CustomEncoder, EncodedSample, SampleEncoder
from .payload import idle_payload, share_payload
from .read_ahead import AheadSource, ReadAhead, ReadProbe, remote_bytes
from .sampler import GlobalBatchSampler
from .time_limit import SampleTimeLimit, SampleTimeout
from .types import BatchMetrics, PlannedBatch, SampleSource

__all__ = ["BatchBuilder", "SampleReadError"]


class SampleReadError(DataError):
    """A sample of the plan could not be read or tokenized; names the key and index position."""

    def __init__(self, key: str, index: int | None = None, reason: str | None = None) -> None:
        # one argument: torch re-raising a worker's error in the main process with its text
        msg = key if index is None else f"sample {key!r} (index position {index}): {reason}"
        super().__init__(msg)
        self.key, self.index, self.reason = key, index, reason


@dataclass(kw_only=True, slots=True)
class BatchBuilder:
    """Everything a worker needs to turn (epoch, batch index) into this replica's micro-batches.

    Picklable: it travels to spawned DataLoader workers. `planner` has the signature of
    `fcp_data.planner.plan_global_batch`; `encoder(source, pos)` reads and tokenizes a sample.
    """

    source: SampleSource
    sampler: GlobalBatchSampler
    cluster: Cluster
    cost: CostModel
    replica: int
    planner: Callable[..., Plan]
    encoder: SampleEncoder | CustomEncoder
    strategy: str = "fcp"
    on_too_long: Literal["raise", "drop"] = "raise"
    on_error: Literal["raise", "skip"] = "raise"
    pad_id: int = 0
    time_limit: SampleTimeLimit = field(default_factory=lambda: SampleTimeLimit(0.0))
    index_skipped: int = 0
    read_ahead: ReadAhead | None = None
    """Remote shards: the next batch's samples fetched in the background (see `read_ahead`)."""
    stalled: dict[str, str] = field(default_factory=dict, repr=False)
    """Remote shards that stalled past sample_timeout_s in the batch being built (URL -> what
    timed out): their other samples in that batch fail at once instead of each waiting out
    its own whole limit (a stalled server answered none of 4 samples in 18 s at a 3 s limit).
    Reset at every build, so a server that recovers is read again in the next batch."""

    def plan(self, ids: np.ndarray) -> Plan:
        seqlens = np.asarray(self.source.seqlens)[ids].astype(np.int64)
        causal = np.asarray(self.source.causal)[ids].astype(bool)
        extra = {} if getattr(self.cost, "vision", None) is None else self._vision_work(ids)
        plan = self.planner(
            seqlens,
            self.cluster,
            self.cost,
            causal=causal,
            strategy=self.strategy,
            seed=self.sampler.seed,
            on_too_long=self.on_too_long,
            **extra,
        )
        if plan.num_waves == 0:  # every sequence dropped: one empty wave, as the planner does
            if len(plan.dropped) != len(ids):
                raise DataError(
                    f"the planner returned no wave for {len(ids)} sequences of which it dropped "
                    f"{len(plan.dropped)}: a plan must place every sequence it does not drop"
                )
            plan = msgspec.structs.replace(plan, waves=(Wave(groups=()),)).with_digest()
        return plan

    def _vision_work(self, ids: np.ndarray) -> dict[str, Any]:
        """`vision=` for the planner when the cost model has vision terms: the batch's encoder
        units from the index columns (none for a source without media columns)."""
        if not hasattr(self.source, "modality"):
            return {}
        from ..vision.work import vision_work_from_index

        enc = self.encoder
        vision_path = getattr(enc, "vision_encoder", None) is not None
        layout = "template" if vision_path else "specials-first"
        work = vision_work_from_index(
            self.source, ids, rule=getattr(enc, "rule", None), layout=layout
        )
        return {"vision": work}

    def _remote_shard(self, pos: int) -> str | None:
        """The URL of sample `pos`'s shard when it is remote (a stall there is the server's,
        shared by every sample of the shard), else None."""
        url = getattr(self.source, "shard_url", None)
        if not callable(url):
            return None
        try:
            shard = str(url(pos))
        except (IndexError, ValueError, TypeError):
            return None
        return shard if is_remote(shard) else None

    def _limited(self, what: str, pos: int, fn: Callable[[], Any]) -> Any:
        """`fn()` under the sample time limit; a remote shard that stalled earlier in this
        batch fails at once (SampleTimeout naming the earlier stall), and one that stalls now
        is remembered for the rest of the batch."""
        shard = self._remote_shard(pos)
        if shard is not None and shard in self.stalled:
            raise SampleTimeout(
                f"{what} was not tried: its shard {shard} stalled earlier in this global batch "
                f"({self.stalled[shard]}); the next batch reads the shard again"
            )
        try:
            return self.time_limit(what, fn)
        except SampleTimeout:
            if shard is not None:
                limit = self.time_limit.seconds
                self.stalled[shard] = f"{what} did not finish within sample_timeout_s={limit:g} s"
            raise

    def _read(self, pos: int, planned: int) -> tuple[EncodedSample, str | None]:
        """Sample at index position `pos`, or (padding, reason) when skipping a bad one; its
        members come from the read-ahead when it holds them (read and checked alike)."""
        key = str(self.source.keys[pos])
        src = self._reading()
        try:
            enc = self._limited(f"reading sample {key!r}", pos, lambda: self.encoder(src, pos))
        except Exception as e:  # any reader/decoder failure is this sample's, named by key
            return self._bad(key, pos, planned, e)
        if len(enc.tokens) != planned:
            raise SampleReadError(
                key,
                pos,
                f"tokenized to {len(enc.tokens)} tokens but the index says {planned}: the index "
                "was built with another tokenizer or vision rule than the loader's; rebuild it "
                "(fcp index --tokenizer ...) or pass the tokenizer it was built with",
            )
        return enc, None

    def _bad(self, key: str, pos: int, planned: int, e: Exception) -> tuple[EncodedSample, str]:
        """Apply on_error to a failed sample: raise naming it, or padding and the reason.

        A ConfigError (a missing PyAV, a text sample without a tokenizer) is the setup's
        fault, not the sample's: skipping would drop every such sample, so it always raises.
        """
        if isinstance(e, ConfigError):
            raise e
        reason = f"{type(e).__name__}: {e}"
        if self.on_error == "raise":
            raise SampleReadError(key, pos, reason) from e
        return EncodedSample(tokens=np.full(planned, self.pad_id, dtype=np.int64)), reason

    def _reading(self) -> Any:
        """The source this build reads through: the read-ahead's samples first, when it has
        any (`read_ahead.AheadSource`), else the source itself."""
        return self.source if self.read_ahead is None else AheadSource(self.source, self.read_ahead)

    # ---- the loss count of the global batch ----------------------------------------------
    def _global_loss(
        self, ids: np.ndarray, seqlens: np.ndarray, planned: Any, source: Any = None
    ) -> int:
        """Loss tokens of the whole global batch, from the index (a sample that may be a chat
        is read, from `source`: the build's reading source, or a `ReadProbe`)."""
        count = getattr(self.encoder, "loss_tokens", None)
        src = self._reading() if source is None else source
        if count is None:
            return int(sum(int(seqlens[s]) - 1 for s in planned))
        if isinstance(self.encoder, SampleEncoder):  # a chat it must read: bounded

            def limit(pos: int) -> Callable[[str, Callable[[], Any]], Any]:
                if isinstance(src, ReadProbe):
                    return ReadProbe.call
                return lambda what, fn: self._limited(what, pos, fn)

            return int(
                sum(count(src, int(ids[s]), int(seqlens[s]), limit(int(ids[s]))) for s in planned)
            )
        return int(sum(count(src, int(ids[s]), int(seqlens[s])) for s in planned))

    def _source_counts(self, ids: np.ndarray) -> tuple[int, ...]:
        count = getattr(self.source, "source_counts", None)
        return tuple(count(ids)) if callable(count) else ()

    def _fetched(self, pos: tuple[int, ...]) -> tuple[int, ...]:
        """The samples of `pos` whose reads fetch bytes (a token store serves stored text)."""
        store = getattr(self.encoder, "store", None)
        if store is None:
            return pos
        modality = self.source.modality
        return tuple(p for p in pos if int(modality[p]) != 0 or not store.has(p))

    def _prefetch(self, pos: tuple[int, ...]) -> None:
        """Let a source with remote shards fetch this replica's samples of the batch
        concurrently (one round of range requests); samples a token store serves are skipped."""
        prefetch = getattr(self.source, "prefetch", None)
        if prefetch is None or not getattr(self.source, "has_remote", False):
            return
        pos = self._fetched(pos)
        # under the sample time limit: a stalled server must not hold the batch; best effort,
        # each read fetches again under its own limit and names the fault
        with contextlib.suppress(SampleTimeout):
            if pos:
                self.time_limit(f"prefetching {len(pos)} samples", lambda: prefetch(pos))

    def _own(self, ids: np.ndarray, plan: Plan) -> tuple[int, ...]:
        """Index positions this replica reads in a planned batch, in reading order."""
        return tuple(
            int(ids[s])
            for w in range(plan.num_waves)
            for s in plan.for_replica(self.replica, w).sequence_ids
        )

    def _settle(self, epoch: int, batch_index: int) -> frozenset[int]:
        """The samples the read-ahead holds for this batch, once its fetches of them are done.

        Awaited at most sample_timeout_s and outside every sample's own limit: a read-ahead
        that is slow costs this batch at most that long and never a sample (what is still in
        flight then is read on demand as without a read-ahead; 0 = no limit, as for reads).
        """
        ra = self.read_ahead
        if ra is None:
            return frozenset()
        limit, board = self.time_limit.seconds, self.time_limit.board
        what = f"waiting for the read-ahead of global batch {batch_index}"
        if board is not None:  # a hung worker's error names what it waited for
            board.begin(what, limit)
        try:
            return ra.settle((epoch, batch_index), timeout=limit if limit > 0 else None)
        finally:
            if board is not None:
                board.end(what)

    def _read_ahead(self, epoch: int, batch_index: int, order: np.ndarray | None) -> None:
        """Plan batch `batch_index` now (the plan is kept for its build) and queue the whole
        reads its build will make for the background read-ahead, in reading order: the chats
        of the global batch its loss count reads (found by running that count on a
        `ReadProbe`, so no rule of it is repeated here), then this replica's samples."""
        ra = self.read_ahead
        if ra is None or ra.budget <= 0 or not getattr(self.source, "has_remote", False):
            return
        try:
            ids = self.sampler.batch(epoch, batch_index, order)
            t0 = time.perf_counter()
            plan = self.plan(ids)
            ra.keep_plan(epoch, batch_index, ids, plan, time.perf_counter() - t0)
            probe = ReadProbe(self.source)
            seqlens = np.asarray(self.source.seqlens)[ids].astype(np.int64)
            self._global_loss(ids, seqlens, plan.sequence_ids(), probe)
            reads = Counter(probe.whole + list(self._fetched(self._own(ids, plan))))
            items = [(p, remote_bytes(self.source, p), k) for p, k in reads.items()]
        except Exception:  # a batch that cannot be planned raises in its own build, named there
            return
        ra.submit(self.source, (epoch, batch_index), [i for i in items if i[1] > 0])

    def close(self) -> None:
        """End this process's read-ahead: drop what it holds, join its threads."""
        if self.read_ahead is not None:
            self.read_ahead.close()

    def own_keys(self, epoch: int, batch_index: int) -> list[str]:
        """Keys this replica reads in a global batch (to name suspects when a worker dies)."""
        ids = self.sampler.batch(epoch, batch_index)
        plan = self.plan(ids)
        return [
            str(self.source.keys[int(ids[s])])
            for w in range(plan.num_waves)
            for s in plan.for_replica(self.replica, w).sequence_ids
        ]

    def _micro_batch(
        self,
        rank_plan: RankPlan,
        ids: np.ndarray,
        wave_groups: tuple[tuple[int, ...], ...],
        global_loss: int,
        epoch: int,
        batch_index: int,
    ) -> tuple[MicroBatch, list[tuple[str, str]]]:
        """This replica's shard of one wave: read, pack, decode its frames; bad samples masked.

        Where a sample's tokens sit depends only on the plan's lengths, so frames are decoded
        after packing; samples whose frames fail are then padded and masked, and the shard is
        packed again (the other samples' frames keep their positions).
        """
        pos = tuple(int(ids[s]) for s in rank_plan.sequence_ids)
        keys = tuple(str(self.source.keys[p]) for p in pos)
        encs: list[EncodedSample] = []
        reasons: list[str | None] = []
        for p, L in zip(pos, rank_plan.seqlens):
            enc, reason = self._read(p, int(L))
            encs.append(enc)
            reasons.append(reason)

        def pack() -> PackedShard:
            return pack_shard(
                [e.tokens for e in encs],
                degree=rank_plan.degree,
                index=rank_plan.index_in_group,
                pad_id=self.pad_id,
                masked=[r is not None for r in reasons],
                targets=[e.targets for e in encs],
                unit=self.cluster.pad_unit,
            )

        packed, failed = pack(), False
        vision: list[VisionInput] = []
        for j, enc in enumerate(encs):
            if reasons[j] is not None:
                continue
            try:
                vi = self.time_limit(
                    f"decoding the frames of sample {keys[j]!r}",
                    partial(
                        self.encoder.vision_input,
                        enc,
                        sample_id=pos[j],
                        key=keys[j],
                        held=packed.global_positions[j],
                        offset=int(packed.local_cu_seqlens_padded[j]),
                    ),
                )
            except Exception as e:  # undecodable or short video: this sample's fault
                encs[j], reasons[j] = self._bad(keys[j], pos[j], int(rank_plan.seqlens[j]), e)
                failed = True
                continue
            if vi is not None:
                vision.append(vi)
        if failed:  # same lengths, same positions: the other samples' frames stay valid
            packed = pack()
        bad = [(k, r) for k, r in zip(keys, reasons) if r is not None]
        vision_encoder = getattr(self.encoder, "vision_encoder", None)
        payload = None
        if vision_encoder is not None:  # the vision path: pixels of the units held here
            payload = share_payload(
                vision_encoder,
                encs,
                packed,
                pos,
                keys,
                bad,
                time_limit=self.time_limit,
                on_bad=self._bad,
                pad_id=self.pad_id,
            )
        mb = MicroBatch.from_packed(
            packed,
            rank_plan=rank_plan,
            sample_ids=pos,
            keys=keys,
            global_num_loss_tokens=global_loss,
            wave_groups=wave_groups,
            epoch=epoch,
            batch_index=batch_index,
            skipped=tuple(bad),
            vision=tuple(vision),
            payload=payload,
        )
        return mb, bad

    def _idle(
        self,
        rank_plan: RankPlan,
        global_loss: int,
        wave_groups: tuple[tuple[int, ...], ...],
        epoch: int,
        batch_index: int,
    ) -> MicroBatch:
        """The micro-batch of a wave this replica sits out: a placeholder, or an empty one under
        `Cluster(idle="empty")` (the planner prices exactly what is emitted); on the
        vision path it carries an empty pixel payload and M-RoPE ids (its positions on all 3
        axes), so the model's own forward takes it like any text-only micro-batch."""
        common = {
            "global_num_loss_tokens": global_loss,
            "wave_groups": wave_groups,
            "epoch": epoch,
            "batch_index": batch_index,
        }
        if self.cluster.idle == "empty":  # the planner priced no placeholder either
            return MicroBatch.empty(rank_plan, **common)
        mb = MicroBatch.placeholder(
            rank_plan, unit=self.cluster.pad_unit, pad_id=self.pad_id, **common
        )
        vision_encoder = getattr(self.encoder, "vision_encoder", None)
        if vision_encoder is not None:
            idle_payload(vision_encoder, mb)
        return mb

    def build(
        self,
        epoch: int,
        batch_index: int,
        order: np.ndarray | None = None,
        *,
        next_batch: int | None = None,
    ) -> PlannedBatch:
        """This replica's micro-batches of a global batch. `next_batch`: the batch this process
        builds next (b + W in worker w of W), whose remote samples the read-ahead fetches while
        this one is decoded (None: none, e.g. at the epoch's end)."""
        ids = self.sampler.batch(epoch, batch_index, order)
        self.stalled.clear()  # a server that stalled in the last batch is tried again
        t0 = time.perf_counter()
        early = (
            None if self.read_ahead is None else self.read_ahead.early_plan(epoch, batch_index, ids)
        )
        if early is None:
            plan = self.plan(ids)
            planning_s = time.perf_counter() - t0
        else:  # planned while the previous batch was built (that time, not this lookup's)
            plan, planning_s = early
        seqlens = np.asarray(self.source.seqlens)[ids].astype(np.int64)
        planned_ids = plan.sequence_ids()
        skipped: list[tuple[str, str]] = [
            (str(self.source.keys[int(ids[s])]), f"too long for the cluster ({seqlens[s]} tokens)")
            for s in plan.dropped
        ]
        t1 = time.perf_counter()
        own = self._own(ids, plan)
        held = self._settle(epoch, batch_index)  # before the loss count: it may read chats
        global_loss = self._global_loss(ids, seqlens, planned_ids)
        self._prefetch(tuple(p for p in own if p not in held))
        t2 = time.perf_counter()
        if next_batch is not None:  # after this batch's own requests, before its decoding
            self._read_ahead(epoch, next_batch, order)
        ahead_s = time.perf_counter() - t2
        mbs: list[MicroBatch] = []
        for w in range(plan.num_waves):
            rank_plan = plan.for_replica(self.replica, w)
            wave_groups = tuple(g.replicas for g in plan.waves[w].groups)
            if rank_plan.is_empty:  # this replica sits the wave out
                mbs.append(self._idle(rank_plan, global_loss, wave_groups, epoch, batch_index))
                continue
            mb, bad = self._micro_batch(
                rank_plan, ids, wave_groups, global_loss, epoch, batch_index
            )
            skipped.extend(bad)
            mbs.append(mb)
        for w, mb in enumerate(mbs):  # head-parallel groups: the cache needs their blocks too
            us = tuple(g.ulysses for g in plan.waves[w].groups)
            if any(u != 1 for u in us):
                mb.wave_ulysses = us
        metrics = BatchMetrics(
            epoch=epoch,
            batch_index=batch_index,
            num_sequences=len(ids),
            num_tokens=int(seqlens.sum()),
            num_waves=plan.num_waves,
            degrees=tuple(plan.degrees),
            predicted_time=float(plan.predicted_time),
            lower_bound=float(plan.lower_bound),
            winner=plan.winner,
            planning_s=planning_s,
            load_s=time.perf_counter() - t1 - ahead_s,
            digest=plan.digest,
            skipped=tuple(skipped),
            index_skipped=self.index_skipped,
            source_counts=self._source_counts(ids),
        )
        return PlannedBatch(
            epoch=epoch, batch_index=batch_index, micro_batches=mbs, metrics=metrics
        )
