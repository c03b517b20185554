"""4-process megatron-core job: cp_context state, digest check, GPTModel with FCP vs no CP."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from megatron.core import parallel_state as ps
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer.transformer_config import TransformerConfig

from fcp_data.errors import ConfigError
from fcp_data.planner.plan import CPGroup, Plan, RankPlan, Wave
from fcp_exec import CPGroupCache, ReplicaRanks, cp_context, local_token_index
from fcp_exec.context import MEGATRON_CP_STATE
from fcp_exec.megatron import (
    FCPCoreAttention,
    FCPPackedSeqParams,
    fcp_process_groups,
    keep_rotary_on_cpu,
)
from fcp_exec.verify import PlanMismatchError

__all__ = ["megatron_worker"]

VOCAB = 64
# Micro-batches of one global batch: per wave, (rings, per ring (seqlens, causal flags)).
WAVES = [
    ([(0, 1, 2, 3)], [([37, 9, 1], [True, True, True])]),
    ([(0, 2), (3, 1)], [([21, 4], [True, False]), ([13], [True])]),
    ([(2, 0, 1), (3,)], [([16, 3, 30], [True, True, True]), ([7, 2], [False, True])]),
    # head-parallel transports (4 heads, 2 query groups): 2 x 2, then all-to-all over 2
    # beside a ring, then all-to-all over 4 with the K/V heads replicated
    ([(0, 1, 2, 3)], [([33, 6], [True, False])]),
    ([(1, 0), (2, 3)], [([19, 5], [True, True]), ([11], [False])]),
    ([(3, 1, 0, 2)], [([26, 8], [True, True])]),
]
ULYSSES = [(1,), (1, 1), (1, 1), (2,), (2, 1), (4,)]  # per wave, per ring: the transport u


def _rank_plan(replica: int, wave: int, ring: tuple[int, ...], seqlens: list[int],
               causal: list[bool], digest: str = "d") -> RankPlan:  # fmt: skip
    return RankPlan(
        replica=replica, wave=wave, num_waves=len(WAVES), group_replicas=ring,
        index_in_group=ring.index(replica), degree=len(ring),
        sequence_ids=tuple(range(len(seqlens))), seqlens=tuple(seqlens), causal=tuple(causal),
        predicted_time=0.0, digest=digest,
    )  # fmt: skip


def _plan() -> Plan:
    """WAVES as a real fcp_data Plan (with digest), the object every replica holds."""
    waves = tuple(
        Wave(groups=tuple(
            CPGroup(replicas=ring, degree=len(ring), sequence_ids=tuple(range(len(sl))),
                    seqlens=tuple(sl), causal=tuple(cz), predicted_time=0.0, ulysses=u)
            for ring, (sl, cz), u in zip(rings, seqs, us, strict=True)
        ))
        for (rings, seqs), us in zip(WAVES, ULYSSES, strict=True)
    )  # fmt: skip
    return Plan(num_replicas=4, waves=waves, predicted_time=0.0, lower_bound=0.0,
                strategy="test", winner="test").with_digest()  # fmt: skip


def _model() -> GPTModel:
    torch.manual_seed(1234)
    config = TransformerConfig(
        num_layers=2, hidden_size=32, num_attention_heads=4, num_query_groups=2,
        use_cpu_initialization=True, attention_dropout=0.0, hidden_dropout=0.0,
        params_dtype=torch.float32, pipeline_dtype=torch.float32,
    )  # fmt: skip
    spec = get_gpt_layer_local_spec()
    spec.submodules.self_attention.submodules.core_attention = FCPCoreAttention
    model = GPTModel(
        config=config, transformer_layer_spec=spec, vocab_size=VOCAB, max_sequence_length=256,
        position_embedding_type="rope", pg_collection=fcp_process_groups(),
    )  # fmt: skip
    assert keep_rotary_on_cpu(model) == 1
    return model


def _pack(seqlens: list[int], degree: int, seed: int) -> dict[str, torch.Tensor]:
    """Unsharded padded pack: tokens, labels (next token), loss mask, global positions."""
    g = torch.Generator().manual_seed(seed)
    chunk = 2 * degree
    padded = [-(-n // chunk) * chunk for n in seqlens]
    tokens, labels, mask, pos = [], [], [], []
    for n, p in zip(seqlens, padded):
        t = torch.randint(0, VOCAB, (n + 1,), generator=g)
        tok = torch.zeros(p, dtype=torch.long)
        lab = torch.zeros(p, dtype=torch.long)
        tok[:n], lab[:n] = t[:n], t[1 : n + 1]
        m = torch.zeros(p)
        m[:n] = 1.0
        tokens.append(tok), labels.append(lab), mask.append(m), pos.append(torch.arange(p))
    cu = torch.tensor([0, *torch.tensor(seqlens).cumsum(0).tolist()], dtype=torch.int32)
    cu_p = torch.tensor([0, *torch.tensor(padded).cumsum(0).tolist()], dtype=torch.int32)
    return {"tokens": torch.cat(tokens), "labels": torch.cat(labels), "mask": torch.cat(mask),
            "pos": torch.cat(pos), "cu": cu, "cu_p": cu_p}  # fmt: skip


def _loss_sum(model: GPTModel, pack: dict[str, torch.Tensor], idx: torch.Tensor,
              causal: list[bool]) -> torch.Tensor:  # fmt: skip
    psp = FCPPackedSeqParams(
        qkv_format="thd", cu_seqlens_q=pack["cu"], cu_seqlens_kv=pack["cu"],
        cu_seqlens_q_padded=pack["cu_p"], cu_seqlens_kv_padded=pack["cu_p"],
        max_seqlen_q=int((pack["cu_p"][1:] - pack["cu_p"][:-1]).max()),
        max_seqlen_kv=int((pack["cu_p"][1:] - pack["cu_p"][:-1]).max()), causal=tuple(causal),
    )  # fmt: skip
    loss = model(pack["tokens"][idx][None], pack["pos"][idx][None], None,
                 labels=pack["labels"][idx][None], packed_seq_params=psp)  # fmt: skip
    return (loss[0] * pack["mask"][idx]).sum()


def _check_context(rank: int, cache: CPGroupCache) -> None:
    before = {n: getattr(ps, n) for n in MEGATRON_CP_STATE}
    plan = _rank_plan(rank, 0, (3, 1, 0, 2), [8], [True])
    with cp_context(plan, groups=cache, wave_groups=[(3, 1, 0, 2)]) as b:
        assert ps.get_context_parallel_world_size() == 4 == b.degree
        assert ps.get_context_parallel_rank() == sorted(b.ring).index(rank)
        assert ps.get_context_parallel_global_ranks() == [3, 1, 0, 2]
        assert ps.get_tensor_and_context_parallel_world_size() == 4
    assert all(getattr(ps, n) is v for n, v in before.items()), "state not restored"
    try:
        with cp_context(plan, groups=cache):
            raise KeyError("boom")
    except KeyError:
        pass
    assert all(getattr(ps, n) is v for n, v in before.items()), "not restored after exception"
    empty = RankPlan(replica=rank, wave=0, num_waves=1, group_replicas=(), index_in_group=-1,
                     degree=0, sequence_ids=(), seqlens=(), causal=(), predicted_time=0.0,
                     digest="d")  # fmt: skip
    with cp_context(empty, groups=cache, wave_groups=[(0, 1, 2, 3)]) as b:
        assert b.ring == (rank,) and b.degree == 1 and b.group is None  # a placeholder: d = 1
        assert all(getattr(ps, n) is v for n, v in before.items()), "empty plan rebound state"
    # switch cost between cached groups (the paper reports ~1 ms for its switch)
    rings = [(0, 1, 2, 3), (3, 1, 0, 2)]
    start = time.perf_counter()
    for i in range(200):
        with cp_context(_rank_plan(rank, 0, rings[i % 2], [8], [True]), groups=cache):
            pass
    switch_us = (time.perf_counter() - start) / 200 * 1e6
    # digest mismatch: every rank must raise, none may hang
    bad = _rank_plan(rank, 0, (0, 1, 2, 3), [8], [True], digest="x" if rank == 3 else "d")
    try:
        with cp_context(bad, groups=cache, verify=True):
            raise AssertionError("digest mismatch not detected")
    except PlanMismatchError as e:
        assert "rank 3" in str(e)
    small = CPGroupCache(ReplicaRanks(world_size=4), capacity=2)
    try:  # a wave that needs more groups than an explicit capacity: refused, nothing created
        small.prepare([(0, 1), (2, 3), (3, 1, 0, 2)])
        raise AssertionError("a cache too small for one wave was accepted")
    except ConfigError as e:
        assert "needs 3 process groups" in str(e) and small.created == 0
    small.prepare([(0, 1), (2, 3)])
    small.prepare([(3, 1, 0, 2)])  # a later wave evicts the earlier wave's oldest group only
    assert (small.created, small.evicted, len(small)) == (3, 1, 2)
    assert (1, 0) not in small and (3, 2) in small and (0, 1, 2, 3) in small
    try:
        small.get((0, 1))
        raise AssertionError("evicted group still served")
    except LookupError as e:
        assert "prepare" in str(e)
    small.clear()
    plan = _plan()  # a pinned batch: nothing of it is evicted even past the soft bound
    auto = CPGroupCache(ReplicaRanks(world_size=4))
    auto.prepare_plan(plan)
    # groups are keyed by their rank set: {0,1,2,3}, {0,2}, {1,3}, {0,1,2}, {3}, {0,1}, {2,3}:
    # the 2 x 2 group's all-to-all blocks {0,1} and {2,3} and the pure all-to-all groups'
    # blocks (the groups themselves) are sets the plan's rings already have
    assert auto.groups_needed(plan) == len(auto) == 7 and auto.evicted == 0
    auto.clear()
    if rank == 0:
        print(
            f"cp_context switch between cached groups: {switch_us:.1f} us; "
            f"group creation: {cache.create_seconds / max(cache.created, 1) * 1e3:.2f} ms"
        )


def megatron_worker(rank: int, world: int) -> None:
    ps.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
    cache = CPGroupCache(ReplicaRanks(world_size=world), capacity=16)
    _check_context(rank, cache)

    fcp, ref = _model(), _model()
    for a, b in zip(fcp.parameters(), ref.parameters()):
        assert torch.equal(a, b)
    total_fcp = torch.zeros(())
    total_ref = torch.zeros(())
    singles = [(r,) for r in range(world)]
    plan = _plan()
    cache.prepare_plan(plan)  # every rank, same order: creates the global batch's groups
    for w, (rings, seqs) in enumerate(WAVES):
        ring_i = next(i for i, r in enumerate(rings) if rank in r)
        ring, (seqlens, causal) = rings[ring_i], seqs[ring_i]
        pack = _pack(seqlens, len(ring), seed=10 * w + ring_i)
        me = ring.index(rank)
        idx = local_token_index(pack["cu_p"], len(ring), me)
        rank_plan = plan.for_replica(rank, w)
        assert rank_plan.group_replicas == ring and rank_plan.index_in_group == me
        with cp_context(rank_plan, groups=cache, verify=True):
            loss = _loss_sum(fcp, pack, idx, causal)
            loss.backward()
        total_fcp += loss.detach()
        # reference: this process alone runs every sequence of the wave, no CP (d = 1)
        for i, (rr, (sl, cz)) in enumerate(zip(rings, seqs)):
            full = _pack(sl, 1, seed=10 * w + i)
            with cp_context(_rank_plan(rank, w, (rank,), sl, cz), groups=cache,
                            wave_groups=singles):  # fmt: skip
                pk = _pack(sl, len(rr), seed=10 * w + i)
                assert torch.equal(full["tokens"][full["mask"] > 0], pk["tokens"][pk["mask"] > 0])
                ref_loss = _loss_sum(ref, pk, torch.arange(len(pk["tokens"])), cz)
                ref_loss.backward()
            total_ref += ref_loss.detach()
    dist.all_reduce(total_fcp)
    for p in fcp.parameters():
        assert p.grad is not None
        dist.all_reduce(p.grad)  # the DP x CP gradient all-reduce, as in training
    rel_loss = abs(total_fcp - total_ref).item() / abs(total_ref).item()
    worst = 0.0
    for (name, p), q in zip(fcp.named_parameters(), ref.parameters()):
        assert q.grad is not None and q.grad.norm() > 0, f"vacuous reference grad for {name}"
        rel = ((p.grad - q.grad).norm() / q.grad.norm()).item()
        worst = max(worst, rel)
        assert rel <= 1e-5, f"{name}: relative grad error {rel:.3g}"
    assert rel_loss <= 1e-5, f"relative loss error {rel_loss:.3g}"
    if rank == 0:
        print(f"GPTModel FCP vs no-CP: loss rel {rel_loss:.2g}, worst grad rel {worst:.2g}")
    cache.clear()
    ps.destroy_model_parallel()
