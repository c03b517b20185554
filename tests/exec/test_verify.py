"""Ring peers that disagree: every member raises before any K/V moves, nobody hangs.

One 3-process gloo job runs every disagreement kind in turn through `cp_context` with its
default check (no `verify=` argument): sequence lengths with the same total, causal flags, ring
order, plan digest, wave, and members that disagree on who is in the ring (a bounded wait, not
the process-group timeout). Each member asserts that it raised and that the message names the
field and the rank that differs; the job's deadline catches a hang.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from fcp_data.planner.plan import RankPlan
from fcp_exec import (
    CPGroupCache,
    PlanMismatchError,
    ReplicaRanks,
    RingFingerprint,
    cp_context,
    local_token_index,
    ring_attention,
    verify_ring,
)

from ._dist import run_distributed

BASE = {"ring": (0, 1, 2), "seqlens": (12, 20), "causal": (True, True), "wave": 0, "digest": "d0"}

# (name, {rank: overrides}, field named in the error, rank named in the error)
DISAGREEMENTS = [
    ("lengths, same total", {2: {"seqlens": (20, 12)}}, "sequence lengths differs", "rank 2"),
    ("causal flags", {1: {"causal": (True, False)}}, "causal flags differs", "rank 1"),
    ("ring order", {0: {"ring": (0, 2, 1)}}, "ring order differs", "rank 0"),
    ("plan digest", {2: {"digest": "d1"}}, "plan digest differs", "rank 2"),
    ("wave", {1: {"wave": 1}}, "wave differs", "rank 1"),
]


def _plan(
    rank: int,
    ring: tuple[int, ...],
    seqlens: tuple[int, ...] = (),
    causal: tuple[bool, ...] = (),
    wave: int = 0,
    digest: str = "d0",
) -> RankPlan:
    member = rank in ring
    return RankPlan(
        replica=rank, wave=wave, num_waves=2, group_replicas=ring if member else (),
        index_in_group=ring.index(rank) if member else -1, degree=len(ring) if member else 0,
        sequence_ids=tuple(range(len(seqlens))), seqlens=seqlens, causal=causal,
        predicted_time=0.0, digest=digest,
    )  # fmt: skip


def _agreeing_ring_runs(rank: int, cache: CPGroupCache) -> None:
    plan = _plan(rank, **BASE)  # type: ignore[arg-type]
    with cp_context(plan, groups=cache) as cp:
        cu = torch.tensor([0, 12, 32])
        cu_p = torch.tensor([0, 12, 36])
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(36, 2, 4, generator=g) for _ in range(3))
        idx = local_token_index(cu_p, 3, cp.index)
        out = ring_attention(q[idx], k[idx], v[idx], cu, cu_p, ring=cp.ring)
        assert torch.isfinite(out).all()


def _disagreements_raise_everywhere(rank: int, cache: CPGroupCache) -> None:
    for name, overrides, field, culprit in DISAGREEMENTS:
        plan = _plan(rank, **{**BASE, **overrides.get(rank, {})})  # type: ignore[arg-type]
        try:
            with cp_context(plan, groups=cache, verify_timeout_s=60):
                raise AssertionError(f"{name}: rank {rank} entered the micro-batch")
        except PlanMismatchError as e:
            msg = str(e)
            assert field in msg and culprit in msg, f"{name}: rank {rank} got {msg}"
            others = [f for _, _, f, _ in DISAGREEMENTS if f != field]
            assert not any(f in msg for f in others), f"{name}: extra fields named: {msg}"
            if name == "lengths, same total":
                assert "total tokens differs" not in msg


def _wrong_group_is_named(rank: int, cache: CPGroupCache) -> None:
    """A group that is not the ring's: every rank refuses before any collective."""
    three = RingFingerprint.from_rank_plan(_plan(rank, **BASE), (0, 1, 2))  # type: ignore[arg-type]
    two = RingFingerprint.from_rank_plan(_plan(rank, (0, 1)), (0, 1))
    for fp, group in ((three, cache.get((0, 1))), (two, None)):  # None: the world, 3 ranks
        try:
            verify_ring(fp, group=group)
            raise AssertionError(f"rank {rank}: a group that is not the ring was accepted")
        except PlanMismatchError as e:
            assert "pass the CP group of this ring" in str(e)


_COLLECTIVES = (
    "all_gather", "all_gather_into_tensor", "all_gather_object", "all_reduce", "all_to_all",
    "all_to_all_single", "barrier", "batch_isend_irecv", "broadcast", "broadcast_object_list",
    "gather", "gather_object", "irecv", "isend", "monitored_barrier", "new_group", "recv",
    "reduce", "reduce_scatter", "reduce_scatter_tensor", "scatter", "scatter_object_list", "send",
)  # fmt: skip


@contextlib.contextmanager
def _counted_collectives() -> Iterator[list[str]]:
    """Every torch.distributed call made inside, by name (verify_ring and the group cache call
    them through the module, so the wrappers see each one)."""
    calls: list[str] = []
    saved = {n: getattr(dist, n) for n in _COLLECTIVES if hasattr(dist, n)}

    def counted(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            calls.append(name)
            return fn(*args, **kwargs)

        return call

    for name, fn in saved.items():
        setattr(dist, name, counted(name, fn))
    try:
        yield calls
    finally:
        for name, fn in saved.items():
            setattr(dist, name, fn)


def _no_collective_without_a_ring(rank: int, cache: CPGroupCache) -> None:
    """d = 1 and empty replicas return at once: no collective at all (one would wait for the
    other ranks), counted rather than timed."""
    with _counted_collectives() as calls, cp_context(_plan(rank, **BASE), groups=cache):
        pass  # all 3 ranks: the counter sees the check a real ring makes
    assert "all_gather" in calls, calls
    plans = {0: _plan(0, (0,), (8,), (True,)), 1: _plan(1, (0,)), 2: _plan(2, (2,), (4,), (True,))}
    with (
        _counted_collectives() as calls,
        cp_context(plans[rank], groups=cache, verify_timeout_s=0.2) as b,
    ):
        assert b.degree == 1
    assert calls == [], f"rank {rank}: collectives without a ring: {calls}"


def _members_disagree_on_the_ring(rank: int, cache: CPGroupCache) -> None:
    """Rank 0 thinks the ring is (0, 1), ranks 1 and 2 run (1, 2): rank 0 cannot see the
    others' rows and stops after verify_timeout_s, naming the ring; 1 and 2 agree and run."""
    ring = (0, 1) if rank == 0 else (1, 2)
    plan = _plan(rank, ring, (8,), (True,))
    try:  # a wait for the 240 s process-group timeout instead would miss the job's deadline
        with cp_context(plan, groups=cache, verify_timeout_s=2.0):
            assert rank != 0, "rank 0 passed a check its ring never joined"
    except PlanMismatchError as e:
        assert rank == 0 and "did not complete within 2 s" in str(e) and "(0, 1)" in str(e)


def _verify_worker(rank: int, world: int) -> None:
    cache = CPGroupCache(ReplicaRanks(world_size=world))
    cache.prepare([(0, 1, 2), (0, 1), (1, 2), (0,), (1,), (2,)])
    _agreeing_ring_runs(rank, cache)
    _disagreements_raise_everywhere(rank, cache)
    _wrong_group_is_named(rank, cache)
    _no_collective_without_a_ring(rank, cache)
    dist.barrier()
    _members_disagree_on_the_ring(rank, cache)  # last: leaves group (0, 1) with a stale gather


def test_every_disagreement_raises_on_every_member_and_nobody_hangs() -> None:
    run_distributed(_verify_worker, 3, timeout=180)


def test_plan_and_layout_fingerprints_agree() -> None:
    """A caller without a plan fingerprints ring_attention's inputs; the same data from a
    RankPlan gives the same row, and each field moves only its own entry."""
    plan = _plan(0, (0, 1), (828, 936), (True, False), wave=3, digest="abc")
    fp = RingFingerprint.from_rank_plan(plan, (0, 1))
    cu = torch.tensor([0, 828, 1764], dtype=torch.int32)
    layout = RingFingerprint.from_layout(cu, (0, 1), [True, False], digest="abc", wave=3)
    assert fp == layout and fp.row() == layout.row()
    swapped = RingFingerprint.from_layout([0, 936, 1764], (0, 1), [True, False], digest="abc",
                                          wave=3)  # fmt: skip
    changed = [i for i, (a, b) in enumerate(zip(fp.row(), swapped.row())) if a != b]
    assert changed == [5]  # sequence lengths only; the total (index 7) is the same
