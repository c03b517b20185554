"""Megatron-LM dev's dynamic context parallelism, as a baseline scored by fcp's cost model.

What it follows: Megatron-LM's dev branch (checked at commit d48bd6be, 2026-08-21),
`DefaultDynamicCPScheduler.get_groups_and_subsamples` in megatron/core/datasets/data_schedule.py
and the functions it calls in megatron/core/datasets/data_schedule_utils.py:
`next_hdp_group_packing_aware` (with its inner `fill_empty_gpus_once` and
`fill_with_full_dpxcp_group`) and `dcp_gpus_needed`. This module is a fresh implementation of
the same decisions on arrays (numba), not their code. Per global batch:

1. Sequences sorted longest first (their sort is stable: equal lengths keep data order).
2. One micro-batch at a time over the remaining sequences. The longest gets a new CP group of
   `dcp_gpus_needed` ranks (the smallest power of two holding it within the knob
   `max_seqlen_per_dp_cp_rank`), on ranks 0..c-1. Every later sequence considers, for each
   power of two c from its minimum up to N, joining each existing group of size c (if the
   group's per-rank tokens stay within the knob) and a new group of c free ranks (the lowest
   free ranks: their `sorted(free, key=exec_time)` over ranks that are all at 0 is stable);
   the option with the smallest projected busiest-rank workload wins (first of equals, in that
   order), but only if that stays within `tall · knob · 1.05` (tall: the micro-batch's longest
   sequence, `_DYNAMIC_CP_WORKLOAD_CAP_DELTA` = 0.05); else the sequence waits for the next
   micro-batch. Workload is their estimate s² / c per rank, not fcp's cost model.
3. `fill_empty_gpus_once`, repeated: while ranks are empty, the first group of the smallest
   size m is widened to min(2m, N) ranks and the groups after it shift right. When no group can
   be widened, `fill_with_full_dpxcp_group` throws the micro-batch away and instead runs one
   group of all N ranks holding, longest first, every remaining sequence that fits (the rest
   wait). So no rank ever idles: every micro-batch covers all N ranks.

Groups are contiguous windows in rank order, and every rank is in exactly one group of every
micro-batch, so micro-batch i is fcp's wave i. Execution implies no barrier beyond fcp's model:
each rank runs its micro-batches in order, a ring starts when its members are free (their
forward-backward loop has no collective over DP×CP between micro-batches; gradients are reduced
once after the last one). The Schedule therefore has no `barrier_after`, and is priced like
every other plan (placeholders never occur; `Cluster(sync_waves=True)` adds its barriers).

Deviations, each where their rule cannot be applied as is:
- Memory: they compare Σ padded_seq_len / c (the dataset's padded length) with the knob; here
  each sequence counts `shard_tokens(L, c, unit)`, the shard fcp's collator allocates at that
  degree, so a plan never exceeds memory under fcp's rule (at u = 1 this is L / c rounded up to
  an even count). `dcp_gpus_needed` is the smallest power of two meeting the same test.
- N not a power of two: their `dcp_gpus_needed` may exceed N (N = 6, a sequence needing 5
  ranks: 8) and then they assert; here such a sequence's minimum is N itself, the one
  non-power-of-two size their scheduler ever forms (a full DP×CP group, also reached when
  fill widens a group to min(2m, N)). Their fill can also index past the last rank when a
  group of size m is not the last one and fewer than m ranks are empty (N = 7: groups of 2
  then 4); that widening is skipped here and the next candidate or the full-group fallback is
  used.
- Sequences longer than N ranks hold are not given to it (the caller drops them, as for every
  strategy); they assert.

The knob `max_seqlen_per_dp_cp_rank` is required in Megatron-LM; its natural value, and the
default here, is the memory capacity `Problem.cap` (tokens per replica). A smaller value makes
sequences take wider groups and micro-batches smaller. `megatron_dynamic_tuned` tries
`KNOB_GRID` fractions of the capacity per batch and keeps the best under fcp's cost model:
an upper bound on what tuning that knob once per run could achieve.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from ...errors import ConfigError
from ..cost.problem import Problem
from ..kernels import shard_tokens
from .schedule import Schedule

__all__ = [
    "KNOB_GRID",
    "WORKLOAD_CAP_DELTA",
    "busy_bound",
    "megatron_dynamic",
    "megatron_dynamic_tuned",
]

WORKLOAD_CAP_DELTA = 0.05  # their _DYNAMIC_CP_WORKLOAD_CAP_DELTA
# Knob values tried by the tuned variant, as fractions of the memory capacity (1 = default).
KNOB_GRID = (1.0, 0.75, 0.5, 0.375, 0.25, 0.125)


@nb.njit(cache=True)
def _min_cp(length: int, n: int, knob: int, unit: int) -> int:
    """Smallest power of two c <= N whose shard holds `length` within `knob`; N when only the
    full (non-power-of-two) group does; 0 when nothing does."""
    c = 1
    while c <= n:
        if shard_tokens(length, c, unit) <= knob:
            return c
        c *= 2
    if shard_tokens(length, n, unit) <= knob:
        return n
    return 0


FREE = np.iinfo(np.int64).max  # per-rank tokens of an unused leaf: never fits


@nb.njit(cache=True)
def _bucket(c: int, last: int) -> int:
    """log2(c) for a power of two, `last` otherwise (the full group of a non-power-of-two N)."""
    if c & (c - 1):
        return last
    b = 0
    while c > 1:
        c >>= 1
        b += 1
    return b


@nb.njit(cache=True)
def _set_leaf(
    pack: np.ndarray, work: np.ndarray, b: int, size: int, j: int, tokens: int, load: float
) -> None:
    """Leaf j of bucket b's two min-trees (per-rank tokens, workload) set, ancestors updated."""
    i = size + j
    pack[b, i] = tokens
    work[b, i] = load
    i >>= 1
    while i >= 1:
        pack[b, i] = min(pack[b, 2 * i], pack[b, 2 * i + 1])
        work[b, i] = min(work[b, 2 * i], work[b, 2 * i + 1])
        i >>= 1


@nb.njit(cache=True)
def _full(t_pack: np.ndarray, b_count: np.ndarray, shortest: int, knob: int, unit: int) -> bool:
    """Whether no group has room for the shortest remaining sequence (at its own size)."""
    for b in range(b_count.size):
        if b_count[b] == 0:
            continue
        c = 1 << b if b < b_count.size - 1 else -1
        if c < 0:
            return False  # the full non-power-of-two group: not worth a special case
        if t_pack[b, 1] + shard_tokens(shortest, c, unit) <= knob:
            return False
    return True


@nb.njit(cache=True)
def _all_fit(lens: np.ndarray, n: int, knob: int, unit: int) -> bool:
    """Whether every sequence fits some group of at most N ranks under `knob`."""
    ok = True
    for i in range(lens.size):
        ok = ok and _min_cp(lens[i], n, knob, unit) > 0
    return ok


@nb.njit(cache=True)
def _schedule(
    lens: np.ndarray, n: int, knob: int, unit: int, delta: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Run the scheduler on lengths sorted longest first.

    Returns (start, size) of every group in execution order (micro-batch by micro-batch, rank
    order within one) and the group of every sequence. Assumes `_min_cp(L) > 0` for all L.

    Same decisions as their scan of every group and rank per option, in about O(log N) per
    size tried. Every rank of a group carries the group's workload and free ranks none, so
    joining group g projects max(work_g + w, top) as the busiest rank (top: the largest
    workload now; for the group holding it, work_g + w is already larger) and a new group
    max(w, top). Groups of one size sit in one bucket in creation order under two min-trees
    (per-rank tokens, workload); a left-to-right search skips subtrees with no room or no
    strictly better projection, so it finds their choice, the first of the smallest, and
    nothing can project below `top`, so reaching it ends the search.
    """
    k = lens.size
    seq_group = np.full(k, -1, np.int64)
    out_start = np.empty(k, np.int64)
    out_size = np.empty(k, np.int64)
    out_n = 0
    remaining = np.arange(k)
    n_rem = k
    cmin = np.empty(k, np.int64)
    for i in range(k):
        cmin[i] = _min_cp(lens[i], n, knob, unit)
    last = 1  # buckets: log2 of the size 0..log2(N), then one for a full non-power-of-two N
    while (1 << last) <= n:
        last += 1
    size = 1
    while size < n:
        size *= 2
    g_start = np.empty(n, np.int64)
    g_size = np.empty(n, np.int64)
    g_pack = np.empty(n, np.int64)
    g_exec = np.empty(n, np.float64)
    g_pos = np.empty(n, np.int64)  # position of a group in its bucket
    bucket = np.empty((last + 1, n), np.int64)
    b_count = np.zeros(last + 1, np.int64)
    t_pack = np.full((last + 1, 2 * size), FREE, np.int64)
    t_work = np.full((last + 1, 2 * size), np.inf)
    stack = np.empty(2 * (last + 2), np.int64)
    local = np.empty(k, np.int64)  # group (in this micro-batch) of each remaining position
    while n_rem > 0:
        for b in range(last + 1):  # clear the buckets used by the previous micro-batch
            for j in range(b_count[b]):
                _set_leaf(t_pack, t_work, b, size, j, FREE, np.inf)
            b_count[b] = 0
        tall = lens[remaining[0]]
        cap_w = float(tall) * float(knob) * (1.0 + delta)
        ng = 0
        used = 0
        top = 0.0
        for p in range(n_rem):
            s = remaining[p]
            length = lens[s]
            best_val = np.inf
            best_c = 0
            best_g = -2  # -2: none, -1: a new group, >= 0: join that group
            if p == 0:  # the longest opens the micro-batch on ranks 0..c-1
                best_c = cmin[s]
                best_g = -1
            c = cmin[s]
            while p > 0 and c <= n and best_val > top:
                w = float(length) * float(length) / c
                limit = knob - shard_tokens(length, c, unit)
                b = _bucket(c, last)
                sp = 0
                if b_count[b] > 0:
                    stack[0] = 1
                    sp = 1
                while sp > 0:
                    sp -= 1
                    i = stack[sp]
                    if t_pack[b, i] > limit:
                        continue
                    bound = max(t_work[b, i] + w, top)
                    if bound >= best_val or bound > cap_w:
                        continue
                    if i >= size:  # a group with room and a strictly better projection
                        best_val = bound
                        best_c = c
                        best_g = bucket[b, i - size]
                        if best_val <= top:
                            break
                    else:
                        stack[sp] = 2 * i + 1  # right after left: creation order
                        stack[sp + 1] = 2 * i
                        sp += 2
                if n - used >= c and best_val > top:
                    proj = max(w, top)  # free ranks are at 0
                    if proj <= cap_w and proj < best_val:
                        best_val = proj
                        best_c = c
                        best_g = -1
                c *= 2
            if best_g == -2:
                local[p] = -1  # waits for the next micro-batch
                if used == n and _full(t_pack, b_count, lens[remaining[n_rem - 1]], knob, unit):
                    local[p + 1 : n_rem] = -1  # no rank free, no room for even the shortest
                    break
                continue
            if best_g == -1:
                best_g = ng
                g_start[ng] = used
                g_size[ng] = best_c
                g_pack[ng] = 0
                g_exec[ng] = 0.0
                b = _bucket(best_c, last)
                g_pos[ng] = b_count[b]
                bucket[b, b_count[b]] = ng
                b_count[b] += 1
                used += best_c
                ng += 1
            g_pack[best_g] += shard_tokens(length, best_c, unit)
            g_exec[best_g] += float(length) * float(length) / best_c
            b = _bucket(best_c, last)
            _set_leaf(t_pack, t_work, b, size, g_pos[best_g], g_pack[best_g], g_exec[best_g])
            local[p] = best_g
            top = max(top, g_exec[best_g])
        # fill_empty_gpus_once until no rank is empty, else one full DP x CP group
        full = False
        while used < n:
            m = n
            for g in range(ng):
                m = min(m, g_size[g])
            wider = min(2 * m, n)
            need = wider - m
            done = False
            for g in range(ng):
                if g_size[g] != m:
                    continue
                end = g_start[g] + m - 1
                if end + need >= n or need > n - used:
                    continue
                for h in range(ng):
                    if g_start[h] > end:
                        g_start[h] += need
                g_size[g] = wider
                used += need
                done = True
                break
            if not done:
                full = True
                break
        base = out_n
        n_next = 0
        if full:
            out_start[out_n] = 0
            out_size[out_n] = n
            out_n += 1
            packed = 0
            for p in range(n_rem):
                s = remaining[p]
                sh = shard_tokens(lens[s], n, unit)
                if packed + sh <= knob:
                    packed += sh
                    seq_group[s] = base
                else:
                    remaining[n_next] = s
                    n_next += 1
        else:
            for g in range(ng):
                out_start[out_n] = g_start[g]
                out_size[out_n] = g_size[g]
                out_n += 1
            for p in range(n_rem):
                s = remaining[p]
                if local[p] < 0:
                    remaining[n_next] = s
                    n_next += 1
                else:
                    seq_group[s] = base + local[p]
        n_rem = n_next
    return out_start[:out_n].copy(), out_size[:out_n].copy(), seq_group


def _sorted_units(prob: Problem, units: np.ndarray | None) -> np.ndarray:
    """Longest first, equal lengths in data order (their stable `sorted(..., reverse=True)`)."""
    ids = np.sort(prob.order if units is None else np.asarray(units, np.int64))
    return ids[np.argsort(-prob.lens[ids], kind="stable")]


@nb.njit(cache=True)
def _busy(
    work: np.ndarray,
    starts: np.ndarray,
    degs: np.ndarray,
    unit_group: np.ndarray,
    n: int,
    beta1: float,
    speed: float,
) -> float:
    """`busy_bound` on arrays: `work[i]` is unit i's attention + per-token-layer seconds."""
    per = np.zeros(starts.size)
    for i in range(work.size):
        per[unit_group[i]] += work[i]
    busy = np.zeros(n)
    for g in range(starts.size):
        t = (per[g] / degs[g] + beta1) / speed
        for r in range(starts[g], starts[g] + degs[g]):
            busy[r] += t
    return busy.max()


def busy_bound(
    prob: Problem, starts: np.ndarray, degs: np.ndarray, units: np.ndarray, unit_group: np.ndarray
) -> float:
    """A lower bound on the makespan of windows run in order: the busiest replica's Σ over its
    groups of (attention + per-token layers) / d + β1, at the fastest speed.

    Every transport's time is at least that (ring: L + max(A, C) + β1; a Ulysses hybrid adds
    its all-to-all), vision work and placeholders only add, and a replica runs its groups one
    after another.
    """
    work = prob.att[units] + prob.lin_llm[units]
    return float(
        _busy(
            work,
            starts,
            degs,
            unit_group,
            prob.num_replicas,
            float(prob.cost.beta1),
            float(prob.speed.max()),
        )
    )


def _run(
    prob: Problem, ids: np.ndarray, knob: int, prune_above: float, work: np.ndarray | None
) -> Schedule | None:
    """The scheduler on `ids` (sorted as `_sorted_units` does) at one knob, scored."""
    lens = prob.lens[ids]
    n = prob.num_replicas
    if not _all_fit(lens, n, knob, prob.unit):
        return None
    starts, sizes, group = _schedule(lens, n, knob, prob.unit, WORKLOAD_CAP_DELTA)
    if work is not None:
        bound = _busy(
            work,
            starts,
            sizes,
            group,
            n,
            float(prob.cost.beta1),
            float(prob.speed.max()),
        )
        if bound >= prune_above:
            return None
    name = "megatron-dynamic" if knob == prob.cap else f"megatron-dynamic(knob={knob})"
    return Schedule(name=name, starts=starts, degs=sizes, units=ids, unit_group=group).score(prob)


def megatron_dynamic(
    prob: Problem,
    units: np.ndarray | None = None,
    knob: int | None = None,
    *,
    prune_above: float = np.inf,
) -> Schedule | None:
    """Megatron-LM dev's `DefaultDynamicCPScheduler` plan for these sequences, scored.

    `knob` is `max_seqlen_per_dp_cp_rank` in tokens (default `prob.cap`, the memory capacity;
    at most `prob.cap`, so the plan always fits). None when some sequence fits no group of at
    most N ranks under that knob (only possible below the capacity), or when `busy_bound`
    shows it cannot be faster than `prune_above` (a candidate that cannot win is not scored).
    """
    knob = prob.cap if knob is None else int(knob)
    if knob > prob.cap or knob < 1:
        raise ConfigError(f"knob={knob} must be in [1, cap={prob.cap}]")
    ids = _sorted_units(prob, units)
    if ids.size == 0:
        return None
    work = None if prune_above == np.inf else prob.att[ids] + prob.lin_llm[ids]
    return _run(prob, ids, knob, prune_above, work)


def megatron_dynamic_tuned(
    prob: Problem, units: np.ndarray | None = None, *, prune_above: float = np.inf
) -> list[Schedule]:
    """`megatron_dynamic` at every knob of `KNOB_GRID` × capacity that holds every sequence
    (distinct knobs only), in grid order; the caller keeps the fastest. Plans that cannot beat
    `prune_above` are left out."""
    ids = _sorted_units(prob, units)
    if ids.size == 0:
        return []
    work = None if prune_above == np.inf else prob.att[ids] + prob.lin_llm[ids]
    out: list[Schedule] = []
    seen: set[int] = set()
    for frac in KNOB_GRID:
        knob = max(1, int(prob.cap * frac))
        if knob in seen:
            continue
        seen.add(knob)
        sch = _run(prob, ids, knob, prune_above, work)
        if sch is not None:
            out.append(sch)
    return out
