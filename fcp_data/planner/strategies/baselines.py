"""Baselines scored by the same simulator as fcp.

- `static_megatron`: context parallelism as Megatron-LM runs it. One CP degree for the whole
  run; it must divide N (world = DP × CP) and hold the longest sequence. The global batch is
  split over the N/d data-parallel CP groups in data order (sample i to group i mod N/d, so
  every group gets the same number of samples, ±1, as Megatron's data-parallel sampler does),
  and each group packs its samples in data order (next fit) into micro-batches of up to
  d × tokens_per_replica tokens. Packing the whole batch first and dealing micro-batches would
  leave most groups idle on short-document corpora (9 micro-batches of C4 for 64 groups), a
  weaker baseline than Megatron really is. The best such degree under the cost model is used.
- `megatron_hybrid`: megatron-core's own hybrid-CP scheduler (`BalancedCPScheduler` in
  megatron/core/pipeline_parallel/hybrid_cp_schedule.py) turned into a plan: each sample is its
  own micro-batch on a power-of-two CP group, and every scheduler "group" ends with a barrier
  over the DP×CP domain, as its forward-backward loop does.
- static-balanced lives in `lanes.py`, pow2 is the fcp planner with power-of-two degrees.
"""

from __future__ import annotations

import warnings

import numba as nb
import numpy as np

from ...errors import MissingDependencyError
from ..cost.problem import Problem
from ..kernels import shard_tokens
from .schedule import Schedule

__all__ = ["megatron_hybrid", "static_megatron"]


@nb.njit(cache=True)
def _next_fit(
    lens: np.ndarray, ids: np.ndarray, d: int, cap: int, groups: int, unit: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Data-parallel split then per-group next-fit packing in data order.

    Returns (micro-batch of each sequence, CP group of each micro-batch, its rank in the group);
    micro-batches are numbered group by group.
    """
    mb = np.empty(ids.size, np.int64)
    mb_group = np.empty(ids.size, np.int64)
    mb_rank = np.empty(ids.size, np.int64)
    cur = -1
    for g in range(groups):
        used = 0
        rank = -1
        for j in range(g, ids.size, groups):
            loc = shard_tokens(lens[ids[j]], d, unit)
            if rank < 0 or used + loc > cap:
                cur += 1
                rank += 1
                used = 0
                mb_group[cur] = g
                mb_rank[cur] = rank
            used += loc
            mb[j] = cur
    return mb, mb_group[: cur + 1].copy(), mb_rank[: cur + 1].copy()


def static_megatron(prob: Problem, units: np.ndarray | None = None) -> Schedule | None:
    ids = np.sort(prob.order if units is None else units)  # data order
    lo = int(prob.dmin[ids].max())
    best: Schedule | None = None
    for d in range(max(1, lo), prob.num_replicas + 1):
        if prob.num_replicas % d or not prob.allowed[d]:
            continue
        mb, mb_group, mb_rank = _next_fit(
            prob.lens, ids, d, prob.cap, prob.num_replicas // d, prob.unit
        )
        # execution order: round by round (k-th micro-batch of every group), as in lockstep
        order = np.lexsort((mb_group, mb_rank))
        pos = np.empty_like(order)
        pos[order] = np.arange(order.size)
        sch = Schedule(
            name=f"static(d={d})",
            starts=mb_group[order] * d,
            degs=np.full(order.size, d, np.int64),
            units=ids,
            unit_group=pos[mb],
        ).score(prob)
        if best is None or sch.makespan < best.makespan:
            best = sch
    return best


class _DomainSize:
    """The one thing BalancedCPScheduler asks of its DP×CP process group: its size."""

    def __init__(self, n: int) -> None:
        self._n = n

    def size(self) -> int:
        return self._n


def megatron_hybrid(prob: Problem, units: np.ndarray | None = None) -> Schedule:
    try:
        # its import warns five times that TransformerEngine and Apex are absent (a CPU run of
        # `fcp view` printed them before its own table); the scheduler needs neither
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=UserWarning, module=r"megatron\.")
            from megatron.core.pipeline_parallel.hybrid_cp_schedule import BalancedCPScheduler
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingDependencyError(
            "strategy='megatron-hybrid' needs megatron-core: pip install 'fcp[megatron]'"
        ) from exc
    ids = prob.order if units is None else units
    # megatron-core sizes a sample's group by L / d <= max_seq_len_per_rank. Under sequence
    # parallel (pad unit u > 1) a member holds 2u·ceil(L / 2du) tokens, which fits `cap` iff
    # L / d <= 2u·(cap // 2u): that is the limit it is given then (cap 10000 at TP = 8: 9984).
    # At u = 1 megatron's own rule is kept as it runs.
    unit = prob.unit
    per_rank = prob.cap if unit == 1 else 2 * unit * (prob.cap // (2 * unit))
    sched = BalancedCPScheduler(
        max_seq_len_per_rank=per_rank, dp_cp_group=_DomainSize(prob.num_replicas)
    )
    pairs = [(int(i), int(prob.lens[i])) for i in ids]
    _, sample_id_groups = sched.get_groups_and_subsamples(pairs, None)
    members: list[np.ndarray] = []
    reps: list[np.ndarray] = []
    barrier: list[bool] = []
    for phase in sample_id_groups:
        per_gpu = [list(x) for x in phase] + [[] for _ in range(prob.num_replicas - len(phase))]
        owners: dict[int, list[int]] = {}
        for gpu, lst in enumerate(per_gpu):
            for sid in lst:
                owners.setdefault(int(sid), []).append(gpu)
        emitted: set[int] = set()
        depth = max((len(x) for x in per_gpu), default=0)
        for k in range(depth):
            for lst in per_gpu:
                if k < len(lst) and int(lst[k]) not in emitted:
                    sid = int(lst[k])
                    emitted.add(sid)
                    members.append(np.array([sid], np.int64))
                    reps.append(np.array(sorted(owners[sid]), np.int64))
                    barrier.append(False)
        if barrier:
            barrier[-1] = True
    got = np.sort(np.concatenate(members)) if members else np.zeros(0, np.int64)
    if not np.array_equal(got, np.sort(ids)):
        raise RuntimeError("megatron-core's BalancedCPScheduler lost or duplicated samples")
    return Schedule(
        name="megatron-hybrid",
        starts=np.array([r[0] for r in reps], np.int64),
        degs=np.array([r.size for r in reps], np.int64),
        units=np.concatenate(members),
        unit_group=np.arange(len(members)),
        barrier_after=barrier,
        replica_sets=reps,
    ).score(prob)
