"""The 6-process gloo job of tests/exec/test_ulysses.py: every case in one spawn.

Waves run every factorisation u x r of d = 2..6 through `cp_context` + `cp_attention` (two
groups at once where they fit, unsorted rings, MHA, GQA with u | H_kv and with K/V
replication, causal / full / mixed varlen packs, fp32 and one bf16 wave) against the float64
reference, and count the bytes every all-to-all and every ring send really moves; then the bad
inputs, each of which must raise on every member it concerns, with no hang.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from fcp_data.planner.cost.model import CostModel, ring_bytes_per_token
from fcp_data.planner.plan import RankPlan
from fcp_exec import CPGroupCache, PlanMismatchError, ReplicaRanks, cp_attention, cp_context
from fcp_exec.transport_bytes import (
    a2a_bytes_per_token,
    hybrid_ring_bytes_per_token,
    kv_heads_per_member,
)
from fcp_exec.verify import ShapeMismatchError

from ._reference import Pack, reference_attention, shard

__all__ = ["ulysses_worker"]


@dataclass(frozen=True)
class Group:
    """What `CPGroupCache.prepare` reads from a `CPGroup`: its replicas and transport."""

    replicas: tuple[int, ...]
    ulysses: int = 1
    heads: int = 4
    kv_heads: int = 4
    mode: str = "mixed"
    dtype: torch.dtype = torch.float32


ALL = (0, 1, 2, 3, 4, 5)
# every rank runs every wave in order; a rank in no group sits the wave out
WAVES: list[list[Group]] = [
    [Group((0, 1), 2, 4, 2), Group((2, 3, 4, 5), 2, 4, 4, "causal")],  # 2x1, 2x2
    [Group((0, 1, 2), 3, 6, 3), Group((3, 4, 5), 3, 3, 1, "full")],  # 3x1 split, replicate
    [Group((5, 3, 1, 0, 2, 4), 2, 4, 1)],  # 2x3, unsorted ring, K/V replicated
    [Group(ALL, 3, 6, 6)],  # 3x2 MHA
    [Group(ALL, 6, 12, 2, "causal")],  # 6x1 pure Ulysses, each K/V head on 3 members
    [Group((0, 1, 2, 3, 4), 5, 5, 5), Group((5,), 1)],  # 5x1, d = 1
    [Group((1, 3, 0, 2), 4, 8, 2), Group((4, 5), 1, 4, 2)],  # 4x1 replicate, 1x2
    [Group((0, 1, 2, 3), 4, 8, 4, "full"), Group((5, 4), 1, 4, 4, "causal")],  # 4x1 split
    [Group((0, 1, 2), 1, 4, 2), Group((3, 4, 5), 1, 4, 4, "full")],  # 1x3
    [Group((0, 1, 2, 3), 1, 4, 2), Group((4, 5), 2, 2, 2, "full")],  # 1x4
    [Group((0, 1, 2, 3, 4), 1, 4, 4, "causal")],  # 1x5
    [Group((4, 0, 5, 1, 3, 2), 1, 4, 2)],  # 1x6
    [Group(ALL, 2, 4, 2, "mixed", torch.bfloat16)],  # bf16, 2x3
]


def _pack(group: Group, seed: int) -> Pack:
    d = len(group.replicas)
    g = torch.Generator().manual_seed(seed)
    lens = [1, 2 * d + 1, *torch.randint(2, 30, (3,), generator=g).tolist()]
    flags = {"causal": [True] * 5, "full": [False] * 5}.get(group.mode, [bool(i % 2) for i in
                                                                         range(5)])  # fmt: skip
    return Pack(lens, d, flags, group.heads, group.kv_heads, 8, seed, group.dtype)


def _rank_plan(rank: int, group: Group | None, pack: Pack | None, wave: int,
               **over: Any) -> RankPlan:  # fmt: skip
    if group is None or pack is None:
        return RankPlan(replica=rank, wave=wave, num_waves=len(WAVES), group_replicas=(),
                        index_in_group=-1, degree=0, sequence_ids=(), seqlens=(), causal=(),
                        predicted_time=0.0, digest="t")  # fmt: skip
    fields: dict[str, Any] = {
        "replica": rank, "wave": wave, "num_waves": len(WAVES), "group_replicas": group.replicas,
        "index_in_group": group.replicas.index(rank), "degree": len(group.replicas),
        "sequence_ids": tuple(range(len(pack.seqlens))), "seqlens": tuple(pack.seqlens),
        "causal": tuple(pack.causal), "predicted_time": 0.0, "digest": "t",
        "ulysses": group.ulysses,
    }  # fmt: skip
    fields.update(over)
    return RankPlan(**fields)


class _Counter:
    """Bytes this rank really hands to all_to_all_single (the part for others) and isend."""

    def __init__(self) -> None:
        self.a2a = 0
        self.ring = 0
        self.p2p_groups: list[Any] = []  # the process group of every isend
        real_a2a, real_isend = dist.all_to_all_single, dist.isend

        def a2a(out: torch.Tensor, inp: torch.Tensor, *args: Any, **kw: Any) -> Any:
            u = dist.get_world_size(kw.get("group"))
            self.a2a += inp.numel() * inp.element_size() * (u - 1) // u
            return real_a2a(out, inp, *args, **kw)

        def isend(tensor: torch.Tensor, *args: Any, **kw: Any) -> Any:
            self.ring += tensor.numel() * tensor.element_size()
            self.p2p_groups.append(kw.get("group"))
            return real_isend(tensor, *args, **kw)

        dist.all_to_all_single = a2a  # type: ignore[assignment]
        dist.isend = isend  # type: ignore[assignment]


def _check(rank: int, group: Group, pack: Pack, wave: int, cache: CPGroupCache,
           counter: _Counter) -> float:  # fmt: skip
    tag = f"wave {wave} {group}"
    d, u = len(group.replicas), group.ulysses
    me = group.replicas.index(rank)
    q, k, v = (shard(t, pack, me).clone().requires_grad_() for t in (pack.q, pack.k, pack.v))
    before = (counter.a2a, counter.ring)
    counter.p2p_groups.clear()
    with cp_context(_rank_plan(rank, group, pack, wave), groups=cache) as cp:
        assert cp.ulysses == u and cp.degree == d and cp.index == me
        out = cp_attention(q, k, v, pack.cu, pack.cu_padded, binding=cp, causal=pack.causal)
        out.backward(shard(pack.dout, pack, me))
        ring_group, ring_ranks = cp.ring_group, cp.ring_ranks
    sent_a2a, sent_ring = counter.a2a - before[0], counter.ring - before[1]
    # the ring's P2P ran on the ring's own process group, never the world's
    if d // u > 1:
        assert ring_group is not None, f"{tag}: no ring group bound"
        assert sorted(dist.get_process_group_ranks(ring_group)) == sorted(ring_ranks)
        assert counter.p2p_groups and all(g is ring_group for g in counter.p2p_groups), tag
    else:
        assert not counter.p2p_groups, f"{tag}: a ring of one sent something"

    q64, k64, v64 = (t.double().requires_grad_() for t in (pack.q, pack.k, pack.v))
    ref = reference_attention(pack, q64, k64, v64, 1.0 / math.sqrt(pack.q.shape[-1]))
    ref.backward(pack.dout.double())
    fp32 = pack.q.dtype == torch.float32
    out_tol, grad_tol = (1e-5, 1e-4) if fp32 else (2.5e-2, 2.5e-2)
    real = shard(pack.real, pack, me)
    worst = 0.0
    for name, got, want, tol in (("out", out, ref, out_tol), ("dq", q.grad, q64.grad, grad_tol),
                                 ("dk", k.grad, k64.grad, grad_tol),
                                 ("dv", v.grad, v64.grad, grad_tol)):  # fmt: skip
        assert got is not None and want is not None
        assert torch.isfinite(got).all(), f"{tag}: NaN/inf in {name}"
        assert (got[~real] == 0).all(), f"{tag}: nonzero {name} on padding"
        err = (got.double() - shard(want.detach(), pack, me)).abs().max().item()
        assert err <= tol, f"{tag}: {name} error {err:.3g} > {tol}"
        worst = max(worst, err) if fp32 else worst

    # bytes: what the wire carried equals the formulas the cost model charges
    t_local = int(pack.cu_padded[-1]) // d
    a = pack.q.dtype.itemsize
    shape = {"kv_heads": group.kv_heads, "head_dim": 8, "activation_bytes": a}
    want_a2a = a2a_bytes_per_token(heads=group.heads, ulysses=u, **shape) * t_local
    assert sent_a2a == want_a2a, f"{tag}: all-to-all sent {sent_a2a} B, formula {want_a2a}"
    r = d // u
    want_ring = hybrid_ring_bytes_per_token(ulysses=u, ring_degree=r, **shape) * t_local
    assert sent_ring == want_ring, f"{tag}: ring sent {sent_ring} B, formula {want_ring}"
    kv_r = kv_heads_per_member(group.kv_heads, u)
    per_tok = ring_bytes_per_token(kv_heads=kv_r, head_dim=8, activation_bytes=a)
    model = CostModel(alpha1=1.0, alpha2=0.0, alpha3=per_tok).ring_bytes(pack.seqlens, r, unit=u)
    assert sent_ring == model, f"{tag}: ring sent {sent_ring} B, cost model {model}"
    return worst


def ulysses_worker(rank: int, world: int) -> None:
    """Every exactness wave, then every bad input (one spawn: each costs seconds)."""
    start = time.perf_counter()
    _exactness(rank, world)
    mid = time.perf_counter()
    _bad_inputs(rank, world)
    if rank == 0:
        print(f"exactness {mid - start:.1f} s, bad inputs {time.perf_counter() - mid:.1f} s")


def _exactness(rank: int, world: int) -> None:
    cache = CPGroupCache(ReplicaRanks(world_size=world))
    counter = _Counter()
    worst, ran = 0.0, 0
    for wave, groups in enumerate(WAVES):
        cache.prepare(groups)  # collective: every rank, same groups, same order
        group = next((g for g in groups if rank in g.replicas), None)
        if group is None:
            with cp_context(_rank_plan(rank, None, None, wave), groups=cache):
                pass
            continue
        pack = _pack(group, seed=100 * wave + min(group.replicas))
        worst = max(worst, _check(rank, group, pack, wave, cache, counter))
        ran += 1
    stats = cache.stats()  # live communicators: bounded (64 + the batch in flight), reported
    assert stats["live"] == len(cache) <= max(stats["capacity"], stats["peak_live"])
    assert stats["created"] == stats["live"] + stats["evicted"] and stats["created"] > 0
    dist.barrier()
    if rank == 0:
        print(f"worst fp32 error over {len(WAVES)} waves: {worst:.3g}; groups created "
              f"{cache.created} in {cache.create_seconds:.2f} s")  # fmt: skip


def _raises(exc: type[BaseException], text: str, fn: Any) -> str:
    try:
        fn()
    except exc as e:
        assert text in str(e), f"{exc.__name__} without {text!r}: {e}"
        return str(e)
    raise AssertionError(f"no {exc.__name__} ({text!r})")


def _bad_inputs(rank: int, world: int) -> None:
    cache = CPGroupCache(ReplicaRanks(world_size=world))
    four = Group((0, 1, 2, 3), 2, 4, 2)
    cache.prepare([four, Group((4, 5), 2)])
    pack = _pack(four, seed=7)
    if rank in four.replicas:
        me = four.replicas.index(rank)
        q, k, v = (shard(t, pack, me) for t in (pack.q, pack.k, pack.v))
        # members that disagree on u: PlanMismatchError on all four, before any K/V moves
        over = {"ulysses": 1} if rank == 2 else {}
        msg = _raises(PlanMismatchError, "transport (ulysses) differs", lambda: cp_context(
            _rank_plan(rank, four, pack, 0, **over), groups=cache).__enter__())  # fmt: skip
        assert "rank 2" in msg, msg
        # u not dividing the heads, or H_kv and u not dividing one another: local ValueError
        with cp_context(_rank_plan(rank, four, pack, 0), groups=cache) as cp:
            _raises(
                ValueError,
                "does not divide H=3",
                lambda: cp_attention(
                    q[:, :3], k[:, :1], v[:, :1], pack.cu, pack.cu_padded, binding=cp
                ),
            )
            _raises(RuntimeError, "fcp_exec.cp_attention", lambda: cp.ring)
        six = Group((0, 1, 2, 3), 4, 12, 6)
        with cp_context(_rank_plan(rank, six, pack, 0, ulysses=4), groups=cache) as cp:
            q6 = q.repeat(1, 3, 1)
            k6 = k.repeat(1, 3, 1)
            _raises(
                ValueError,
                "one must divide the other",
                lambda: cp_attention(q6, k6, k6, pack.cu, pack.cu_padded, binding=cp),
            )
        # a u that does not divide the degree: ValueError before any collective
        _raises(
            ValueError,
            "does not divide the CP degree 4",
            lambda: cp_context(
                _rank_plan(rank, four, pack, 0, ulysses=3), groups=cache
            ).__enter__(),
        )
    # members of a u = 2 pair that disagree on the head count: the same named error on both,
    # before the first all-to-all (was: a raw gloo error on one and a hang on the other)
    pair = Group((4, 5), 2, 4, 2)
    if rank in pair.replicas:
        pk = _pack(pair, seed=8)
        me = pair.replicas.index(rank)
        q, k, v = (shard(t, pk, me) for t in (pk.q, pk.k, pk.v))
        if rank == 5:
            q = q[:, :2]  # H = 2 here, 4 on rank 4: u = 2 divides both, so only the check sees it
        with cp_context(_rank_plan(rank, pair, pk, 0), groups=cache) as cp:
            msg = _raises(ShapeMismatchError, "different shapes", lambda: cp_attention(
                q, k, v, pk.cu, pk.cu_padded, binding=cp))  # fmt: skip
            assert "rank 4: H=4 H_kv=2" in msg and "rank 5: H=2 H_kv=2" in msg, msg
    # ... and the cache refuses to prepare such a group on every rank, before any new_group
    _raises(
        Exception, "does not divide the degree 4", lambda: cache.prepare([Group((0, 1, 2, 3), 3)])
    )
    dist.barrier()
