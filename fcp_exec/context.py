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
ring order, sequence lengths, causal flags and transport (u); a disagreement raises
`PlanMismatchError` on every member before any K/V is exchanged. Empty plans and d = 1 skip it
(nothing to agree on). A u that does not divide the degree is a ValueError raised before any
collective. For u > 1 the binding also carries the all-to-all block's group (created by
`CPGroupCache.prepare*` with the CP groups) and its r-ring; the whole binding is published on
parallel_state as `_FCP_CP_BINDING` for fcp's megatron attention, restored on exit.

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

from fcp_data.errors import ConfigError, ExecError
from fcp_exec.groups import CPGroupCache, wave_specs
from fcp_exec.runtime import ExecRuntime
from fcp_exec.verify import DEFAULT_VERIFY_TIMEOUT_S, RingFingerprint, verify_ring

if TYPE_CHECKING:  # the planner package costs ~2 s to import (numba); types only
    from fcp_data.planner.plan import RankPlan

__all__ = ["MEGATRON_CP_STATE", "CPBinding", "check_transport", "cp_context"]

# parallel_state globals swapped by cp_context (and only these).
MEGATRON_CP_STATE = (
    "_CONTEXT_PARALLEL_GROUP",
    "_CONTEXT_PARALLEL_GLOBAL_RANKS",
    "_TENSOR_AND_CONTEXT_PARALLEL_GROUP",
)
# The whole binding, for fcp's megatron attention (the transport is more than a rank list);
# set on parallel_state next to the entries above and removed on exit.
FCP_BINDING_ATTR = "_FCP_CP_BINDING"
_MISSING = object()


@dataclass(frozen=True, slots=True)
class CPBinding:
    """What cp_context bound; pass it to `fcp_exec.cp_attention(..., binding=cp)`.

    members: the group's global ranks in ring order (position p holds zigzag chunks p and
    2d-1-p); index: this rank's position (= RankPlan.index_in_group). ulysses = u: the
    transport, 1 for the ring over all members, u > 1 for the hybrid u x r (`fcp_exec.ulysses`):
    this rank's all-to-all block is `a2a_ranks` (positions j*u .. j*u+u-1, block order, with
    its u-member process group `a2a_group`) and its r-ring is `ring_ranks` (positions
    {j*u + index % u}, in ring order). `ring` is the ring of `ring_attention` and exists only
    for u = 1: with u > 1 ring attention over all members would compute wrong attention.
    For a wave the replica sits out, members is this rank alone (a placeholder runs at degree
    1) and group is None. megatron's get_context_parallel_rank() is group.rank(), the position
    in sorted global-rank order; the two agree when the plan lists replicas in ascending order.
    ring_group is the process group the ring's P2P runs on (the CP group for u = 1, the r-ring's
    own group for 1 < u < d, None for a ring of one); runtime the job's `ExecRuntime` (kernel
    choice, communication streams; None: chosen per micro-batch, no streams).
    """

    rank_plan: RankPlan | None
    members: tuple[int, ...]
    index: int
    group: dist.ProcessGroup | None
    tp_cp_group: dist.ProcessGroup | None
    ulysses: int = 1
    ring_ranks: tuple[int, ...] = ()
    a2a_ranks: tuple[int, ...] = ()
    a2a_group: dist.ProcessGroup | None = None
    ring_group: dist.ProcessGroup | None = None
    runtime: ExecRuntime | None = None

    @property
    def degree(self) -> int:
        return len(self.members)

    @property
    def ring_degree(self) -> int:
        """r = degree / ulysses: members of this rank's ring."""
        return self.degree // self.ulysses

    @property
    def ring(self) -> tuple[int, ...]:
        """The global ranks of the ring (u = 1 only); RuntimeError for a hybrid transport."""
        if self.ulysses != 1:
            raise ExecError(
                f"this CP group runs the hybrid transport u={self.ulysses} x "
                f"r={self.ring_degree} (all-to-all over heads, then a ring): "
                "ring_attention(ring=cp.ring) would attend over the wrong shards. Call "
                "fcp_exec.cp_attention(q, k, v, cu_seqlens, cu_seqlens_padded, binding=cp)"
            )
        return self.members

    @classmethod
    def of(
        cls,
        members: Sequence[int],
        index: int,
        *,
        ulysses: int = 1,
        group: dist.ProcessGroup | None = None,
        a2a_group: dist.ProcessGroup | None = None,
        rank_plan: RankPlan | None = None,
        tp_cp_group: dist.ProcessGroup | None = None,
        ring_group: dist.ProcessGroup | None = None,
        runtime: ExecRuntime | None = None,
    ) -> CPBinding:
        """A binding from ring-ordered members (what cp_context builds; tests and benches
        without a plan use it directly). ValueError when u does not divide the degree."""
        members = tuple(int(r) for r in members)
        d = len(members)
        check_transport(d, ulysses)
        if not 0 <= index < d:
            raise ConfigError(f"index={index} outside the group of {d} members {members}")
        j, m = divmod(index, ulysses)
        if ring_group is None and ulysses == 1:
            ring_group = group
        return cls(
            rank_plan,
            members,
            index,
            group,
            tp_cp_group,
            ulysses,
            ring_ranks=members[m::ulysses],
            a2a_ranks=members[j * ulysses : (j + 1) * ulysses],
            a2a_group=a2a_group,
            ring_group=ring_group,
            runtime=runtime,
        )


def check_transport(degree: int, ulysses: int) -> None:
    """ValueError unless 1 <= u and u divides the degree (checked before any collective)."""
    if isinstance(ulysses, bool) or not isinstance(ulysses, int) or ulysses < 1:
        raise ConfigError(f"ulysses={ulysses!r} must be an integer >= 1")
    if degree % ulysses:
        raise ConfigError(
            f"ulysses={ulysses} does not divide the CP degree {degree}: the hybrid transport "
            "needs degree = u * r; the plan is corrupt (CPGroup.ulysses must divide degree)"
        )


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
    wave_ulysses: Sequence[int] | None = None,
    verify: bool = True,
    verify_timeout_s: float = DEFAULT_VERIFY_TIMEOUT_S,
) -> Iterator[CPBinding]:
    """Bind `rank_plan`'s CP group into megatron-core for one micro-batch.

    groups: the cache holding the wave's groups; wave_groups: every group's replicas for this
    wave (then the cache is prepared here, a collective every rank must enter, empty plans
    included); wave_ulysses: each of those groups' transport (`MicroBatch.wave_ulysses`; empty
    or None: all rings), so head-parallel groups get their all-to-all blocks; verify: check
    that every member of the ring holds the same plan and layout (one all-gather on the CP
    group, collective among the ring's members; off only when another check covers it);
    verify_timeout_s: how long a member waits for its peers to join that check before it
    raises (gloo; a member that never comes means the plans disagree).
    """
    if wave_groups is not None:
        groups.prepare(wave_specs(wave_groups, wave_ulysses))
    rank = dist.get_rank() if dist.is_initialized() else 0
    if rank_plan.is_empty:  # a placeholder (or empty) micro-batch: degree 1, this rank alone
        yield CPBinding.of((rank,), 0, rank_plan=rank_plan, runtime=groups.runtime)
        return
    if len(rank_plan.group_replicas) != rank_plan.degree:
        raise ConfigError(
            f"RankPlan for replica {rank_plan.replica} has degree {rank_plan.degree} but "
            f"group_replicas {rank_plan.group_replicas}; the plan is corrupt"
        )
    check_transport(rank_plan.degree, rank_plan.ulysses)  # local, before any collective
    replica = groups.ranks.position(rank)[0]
    if replica != rank_plan.replica:
        raise ConfigError(
            f"global rank {rank} is replica {replica} but got the RankPlan of replica "
            f"{rank_plan.replica}; pass plan.for_replica({replica}, wave)"
        )
    ring = groups.ranks.ring(rank_plan.group_replicas, rank)
    group = groups.get(ring)
    tp_cp = groups.get(groups.ranks.tp_cp_ranks(rank_plan.group_replicas, rank))
    if verify:  # before the a2a group is looked up: a member that disagrees on u raises here
        fingerprint = RingFingerprint.from_rank_plan(rank_plan, ring)
        verify_ring(fingerprint, group=group, timeout_s=verify_timeout_s)
    u = rank_plan.ulysses
    index = rank_plan.index_in_group
    j = index // u
    try:
        a2a = groups.get(ring[j * u : (j + 1) * u]) if u > 1 else None
        r_ring = ring[index % u :: u]
        ring_group = groups.get(r_ring) if 1 < u < len(ring) else None
    except LookupError as e:  # every member of the group misses it alike: no one waits
        raise LookupError(
            f"{e}. This group runs u={u}: its all-to-all blocks and r-rings are created when the "
            "cache is "
            "prepared with the wave's transports: cp_context(..., wave_groups=mb.wave_groups, "
            "wave_ulysses=mb.wave_ulysses), or prepare_plan(plan), not bare replica tuples"
        ) from None
    binding = CPBinding.of(
        ring,
        index,
        ulysses=u,
        group=group,
        a2a_group=a2a,
        rank_plan=rank_plan,
        tp_cp_group=tp_cp,
        ring_group=ring_group,
        runtime=groups.runtime,
    )
    ps = _parallel_state()
    if ps is None:
        yield binding
        return
    saved = {name: getattr(ps, name) for name in MEGATRON_CP_STATE}
    saved_binding = getattr(ps, FCP_BINDING_ATTR, _MISSING)
    try:
        ps._CONTEXT_PARALLEL_GROUP = group
        ps._CONTEXT_PARALLEL_GLOBAL_RANKS = list(ring)
        ps._TENSOR_AND_CONTEXT_PARALLEL_GROUP = tp_cp
        setattr(ps, FCP_BINDING_ATTR, binding)
        yield binding
    finally:
        for name, value in saved.items():
            setattr(ps, name, value)
        if saved_binding is _MISSING:
            delattr(ps, FCP_BINDING_ATTR)
        else:
            setattr(ps, FCP_BINDING_ATTR, saved_binding)
