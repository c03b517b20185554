"""Lane plans: CP groups held for the whole global batch, each working through a queue.

A lane is a window of replicas at one degree. Sequences are dealt to lanes longest first, each
to the lane where it finishes first (LPT on uniform machines), optionally refined by moving
sequences off the last lane to finish, then each lane's queue is packed into micro-batches
(best-fit decreasing at the lane's degree). With equal degrees this is the static-balanced
baseline; the fcp lane candidate mixes degrees, found by a dual approximation: for a target
makespan M, the lanes each sequence needs to finish within M (`kernels.lanes_for_target`),
bisected to the smallest feasible M. A *prologue* (groups run first, e.g. sequences that need
most of the cluster, which can only start when everyone is free) may precede the lanes: lanes
then start when their replicas leave the prologue.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from ..cost.problem import Problem
from ..kernels import deal_lpt, pack_lanes, refine_moves, smallest_lane_target
from .placement import place_degrees
from .schedule import Schedule

__all__ = ["lane_candidates", "lane_schedule", "static_balanced"]


@dataclass(slots=True)
class _Deal:
    starts: np.ndarray
    degs: np.ndarray
    lane_of: np.ndarray
    load: np.ndarray


def _free_after(prob: Problem, prologue: Schedule | None) -> np.ndarray:
    free = np.zeros(prob.num_replicas)
    if prologue is not None:
        for g, t in enumerate(prologue.times):
            r = prologue.replicas(g)
            free[r] = free[r].max() + t
    return free


def _deal(
    prob: Problem, degs: np.ndarray, units: np.ndarray, refine: bool, free: np.ndarray
) -> _Deal | None:
    starts = place_degrees(degs, prob.num_replicas, prob.replicas_per_node, free)
    inter = (starts // prob.replicas_per_node) != ((starts + degs - 1) // prob.replicas_per_node)
    if prob.cluster.heterogeneous:
        speed = np.array([prob.speed[s : s + d].min() for s, d in zip(starts, degs)])
    else:
        speed = np.ones(degs.size)
    load0 = (
        np.array([free[s : s + d].max() for s, d in zip(starts, degs)])
        if free.any()
        else np.zeros(degs.size)
    )
    over = prob.overhead
    lane_of, load = deal_lpt(
        prob.att,
        prob.lin,
        prob.comm,
        prob.dmin,
        units,
        degs,
        inter,
        speed,
        over,
        load0,
        prob.cost_params,
    )
    if np.any(lane_of[units] < 0):
        return None
    if refine:
        budget = int(min(400, max(8, 3e7 // max(1, units.size * degs.size))))
        lane_of, load = refine_moves(
            prob.att,
            prob.lin,
            prob.comm,
            prob.dmin,
            over,
            lane_of,
            load,
            degs,
            inter,
            speed,
            budget,
            prob.cost_params,
        )
    return _Deal(starts=starts, degs=degs, lane_of=lane_of, load=load)


def _finish(
    prob: Problem, deal: _Deal, units: np.ndarray, name: str, prologue: Schedule | None
) -> Schedule:
    mb_of, mb_lane, mb_rank = pack_lanes(
        prob.lens, deal.lane_of, deal.degs, units, prob.cap, deal.degs.size, prob.unit
    )
    # Execution order: round by round (k-th micro-batch of every lane), lanes left to right.
    exec_order = np.lexsort((deal.starts[mb_lane], mb_rank))
    pos = np.empty_like(exec_order)
    pos[exec_order] = np.arange(exec_order.size)
    grp = pos[mb_of[units]]
    lanes = mb_lane[exec_order]
    starts, degs = deal.starts[lanes], deal.degs[lanes]
    if prologue is not None:
        starts = np.concatenate([prologue.starts, starts])
        degs = np.concatenate([prologue.degs, degs])
        grp = np.concatenate([prologue.unit_group, grp + prologue.starts.size])
        units = np.concatenate([prologue.units, units])
    return Schedule(name=name, starts=starts, degs=degs, units=units, unit_group=grp).score(prob)


def lane_schedule(
    prob: Problem,
    lane_degs: list[int] | np.ndarray,
    name: str,
    *,
    refine: bool = True,
    units: np.ndarray | None = None,
    prologue: Schedule | None = None,
) -> Schedule | None:
    """Deal `units` (default: all sequences) onto lanes of the given degrees; None if some
    sequence fits no lane."""
    degs = np.asarray(lane_degs, dtype=np.int64)
    if degs.size == 0 or degs.sum() > prob.num_replicas:
        return None
    ids = prob.order if units is None else units
    deal = _deal(prob, degs, ids, refine, _free_after(prob, prologue))
    return None if deal is None else _finish(prob, deal, ids, name, prologue)


def _degree_candidates(prob: Problem, lo: int) -> list[int]:
    """Fixed degrees worth trying: lo .. lo + 3, then powers of two and N."""
    out = {d for d in range(lo, min(prob.num_replicas, lo + 3) + 1) if prob.allowed[d]}
    d = 1
    while d <= prob.num_replicas:
        if d >= lo and prob.allowed[d]:
            out.add(d)
        d *= 2
    if prob.allowed[prob.num_replicas]:
        out.add(prob.num_replicas)
    return sorted(out)


def static_balanced(prob: Problem, units: np.ndarray | None = None) -> Schedule | None:
    """Best fixed degree, sequences dealt longest-first to the least-loaded group (no refining).

    Every degree is dealt; the two with the lowest dealt load are packed and scored exactly.
    """
    ids = prob.order if units is None else units
    lo = int(prob.dmin[ids].max())
    free = np.zeros(prob.num_replicas)
    dealt = []
    for d in _degree_candidates(prob, lo):
        deal = _deal(prob, np.full(prob.num_replicas // d, d, np.int64), ids, False, free)
        if deal is not None:
            dealt.append((float(deal.load.max()), d, deal))
    dealt.sort(key=lambda x: (x[0], x[1]))
    best: Schedule | None = None
    for _, d, deal in dealt[:2]:
        sch = _finish(prob, deal, ids, f"static-balanced(d={d})", None)
        if best is None or sch.makespan < best.makespan:
            best = sch
    return best


def _pow2_mask(prob: Problem) -> np.ndarray:
    mask = np.zeros_like(prob.allowed)
    d = 1
    while d <= prob.num_replicas:
        mask[d] = prob.allowed[d]
        d *= 2
    return mask


def _smallest_target(
    prob: Problem, lower: float, credit: float, units: np.ndarray, allowed: np.ndarray
) -> tuple[np.ndarray, float] | None:
    """Smallest target makespan whose lanes fit N replicas: (wide degrees, target) or None."""
    wide, target = smallest_lane_target(
        prob.att,
        prob.lin,
        prob.comm,
        prob.dmin,
        prob.overhead,
        units,
        lower,
        prob.num_replicas,
        prob.replicas_per_node,
        allowed,
        prob.cost_params,
        credit,
    )
    return None if target >= 1e299 else (wide, target)


def lane_candidates(
    prob: Problem,
    lower: float,
    units: np.ndarray | None = None,
    prologue: Schedule | None = None,
    credits: tuple[float, ...] = (0.0, 0.8),
    keep: int = 2,
) -> list[Schedule]:
    """Mixed-degree lanes from the dual approximation.

    For each credit setting, and with degrees as they are or rounded up to powers of two (wider
    lanes, which can balance better once real times replace the target), the smallest
    feasible target M is bisected; the distinct lane sets are dealt and the `keep` best by
    dealt load are packed and scored. (Lane sets for looser targets, 1.04 M and 1.1 M, never
    won over the 252-cell grid and were dropped: they cost ~0.7 ms of a 5 ms budget.)
    """
    ids = prob.order if units is None else units
    free = _free_after(prob, prologue)
    tag = "" if prologue is None else f"{prologue.name}+"
    configs: dict[tuple[int, ...], str] = {}
    masks = [("", prob.allowed)]
    pow2 = _pow2_mask(prob)
    if not np.array_equal(pow2, prob.allowed):
        masks.append(("pow2-", pow2))  # rounding degrees up to powers of two: wider lanes
    for (mname, mask), credit in itertools.product(masks, credits):
        found = _smallest_target(prob, max(lower - float(free.mean()), 0.0), credit, ids, mask)
        if found is None:
            continue
        key = tuple(sorted(found[0].tolist(), reverse=True))
        configs.setdefault(key, f"{tag}{mname}lanes(credit={credit})")
    dealt = []
    for key, name in configs.items():
        degs = np.array([*key, *[1] * (prob.num_replicas - sum(key))], np.int64)
        deal = _deal(prob, degs, ids, True, free)
        if deal is not None:
            dealt.append((float(deal.load.max()), name, deal))
    dealt.sort(key=lambda x: (x[0], x[1]))
    return [_finish(prob, deal, ids, name, prologue) for _, name, deal in dealt[:keep]]
