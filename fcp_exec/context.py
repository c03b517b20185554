"""`cp_context(rank_plan)`: make megatron-core see this micro-batch's CP group, then restore.

megatron-core keeps its process groups in module globals of `parallel_state` and fixes the CP
group at initialisation. FCP changes the group every micro-batch, so for the duration of one
micro-batch we swap exactly the CP entries megatron reads during forward and backward (the CP
group, its global ranks, the combined TP x CP group) and put the previous values back on exit,
also when the body raises. TP, PP, DP and the DP x CP group (gradient all-reduce) are never
touched. A switch between cached groups is a few attribute writes (~microseconds); creating a
missing group is the expensive part and happens in `CPGroupCache.prepare`.

By default the members of the bound ring first check, with one small all-gather on the CP group
(`fcp_exec.verify.verify_ring`, ~0.1-0.3 ms on gloo), that they hold the same plan digest, wave,
ring order, sequence lengths and causal flags; a disagreement raises `PlanMismatchError` on
every member before any K/V is exchanged. Empty plans and d = 1 skip it (nothing to agree on).

A replica that sits a wave out (an empty RankPlan) is bound as a degree-1 ring of itself and
megatron-core keeps its initial CP state (size 1): the loader's placeholder micro-batch then
runs the model locally, so the replica joins every collective of its framework.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

import torch.distributed as dist

from fcp_exec.groups import CPGroupCache
from fcp_exec.verify import DEFAULT_VERIFY_TIMEOUT_S, RingFingerprint, verify_ring

if TYPE_CHECKING:  # the planner package costs ~2 s to import (numba); types only
    from fcp_data.planner.plan import RankPlan

__all__ = ["MEGATRON_CP_STATE", "CPBinding", "cp_context"]

# parallel_state globals swapped by cp_context (and only these).
MEGATRON_CP_STATE = (
    "_CONTEXT_PARALLEL_GROUP",
    "_CONTEXT_PARALLEL_GLOBAL_RANKS",
    "_TENSOR_AND_CONTEXT_PARALLEL_GROUP",
)


@dataclass(frozen=True, slots=True)
class CPBinding:
    """What cp_context bound: ring = global ranks in ring order (pass it to ring_attention).

    index is this rank's position in the ring (= RankPlan.index_in_group, the zigzag chunk
    index). For a wave the replica sits out the ring is this rank alone (a placeholder runs
    at degree 1) and group is None. megatron's get_context_parallel_rank() is group.rank(),
    the position in sorted global-rank order; the two agree when the plan lists group
    replicas in ascending order.
    """

    rank_plan: RankPlan
    ring: tuple[int, ...]
    index: int
    group: dist.ProcessGroup | None
    tp_cp_group: dist.ProcessGroup | None

    @property
    def degree(self) -> int:
        return len(self.ring)


def _parallel_state() -> ModuleType | None:
    """megatron-core's parallel_state if the training program imported it, else None.

    Never imported here: a plain PyTorch or FSDP job with megatron-core merely installed would
    pay its import (6 s on an idle core, ~30 s on a loaded one) for nothing to bind.
    """
    return sys.modules.get("megatron.core.parallel_state")


@contextmanager
def cp_context(
    rank_plan: RankPlan,
    *,
    groups: CPGroupCache,
    wave_groups: Sequence[Sequence[int]] | None = None,
    verify: bool = True,
    verify_timeout_s: float = DEFAULT_VERIFY_TIMEOUT_S,
) -> Iterator[CPBinding]:
    """Bind `rank_plan`'s CP group into megatron-core for one micro-batch.

    groups: the cache holding the wave's groups; wave_groups: every group's replicas for this
    wave (then the cache is prepared here, a collective every rank must enter, empty plans
    included); verify: check that every member of the ring holds the same plan and layout (one
    all-gather on the CP group, collective among the ring's members; off only when another
    check already covers it); verify_timeout_s: how long a member waits for its peers to join
    that check before it raises (gloo; a member that never comes means the plans disagree).
    """
    if wave_groups is not None:
        groups.prepare(wave_groups)
    rank = dist.get_rank() if dist.is_initialized() else 0
    if rank_plan.is_empty:  # a placeholder (or empty) micro-batch: degree 1, this rank alone
        yield CPBinding(rank_plan, (rank,), 0, None, None)
        return
    if len(rank_plan.group_replicas) != rank_plan.degree:
        raise ValueError(
            f"RankPlan for replica {rank_plan.replica} has degree {rank_plan.degree} but "
            f"group_replicas {rank_plan.group_replicas}; the plan is corrupt"
        )
    replica = groups.ranks.position(rank)[0]
    if replica != rank_plan.replica:
        raise ValueError(
            f"global rank {rank} is replica {replica} but got the RankPlan of replica "
            f"{rank_plan.replica}; pass plan.for_replica({replica}, wave)"
        )
    ring = groups.ranks.ring(rank_plan.group_replicas, rank)
    group = groups.get(ring)
    tp_cp = groups.get(groups.ranks.tp_cp_ranks(rank_plan.group_replicas, rank))
    binding = CPBinding(rank_plan, ring, rank_plan.index_in_group, group, tp_cp)
    if verify:
        fingerprint = RingFingerprint.from_rank_plan(rank_plan, ring)
        verify_ring(fingerprint, group=group, timeout_s=verify_timeout_s)
    ps = _parallel_state()
    if ps is None:
        yield binding
        return
    saved = {name: getattr(ps, name) for name in MEGATRON_CP_STATE}
    try:
        ps._CONTEXT_PARALLEL_GROUP = group
        ps._CONTEXT_PARALLEL_GLOBAL_RANKS = list(ring)
        ps._TENSOR_AND_CONTEXT_PARALLEL_GROUP = tp_cp
        yield binding
    finally:
        for name, value in saved.items():
            setattr(ps, name, value)
