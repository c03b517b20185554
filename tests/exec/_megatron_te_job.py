"""4-process megatron-core job: FCPTEDotProductAttention on fcp's groups, against the TE stand-in.

The stand-in (`_te_standin`) follows TransformerEngine's documented THD context-parallel contract
and numbers chunks as TE does (rank inside the group). A GPTModel whose core attention is
`FCPTEDotProductAttention` trains fcp plans of rings (p2p), an all-to-all group ("a2a") and a
hybrid 2 x 2 ("a2a+p2p"), and its loss and every gradient must equal a single-process model's
(FCPCoreAttention at degree 1) on the same sequences. An unsorted ring is refused before the
first step; with that refusal planted out, the stand-in's attention is measurably wrong.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from ._te_standin import CALLS, install

__all__ = ["te_worker"]

# per wave: rings (ascending, as fcp's planner emits them), per ring (seqlens), per ring u
WAVES: list[tuple[list[tuple[int, ...]], list[list[int]], list[int]]] = [
    ([(0, 1, 2, 3)], [[37, 9, 1]], [1]),
    ([(0, 1), (2, 3)], [[21, 4], [13]], [1, 1]),
    ([(0, 1, 2), (3,)], [[16, 3, 30], [7, 2]], [1, 1]),
    ([(0, 1, 2, 3)], [[33, 6]], [2]),  # hybrid 2 x 2: a2a+p2p
    ([(0, 1, 2, 3)], [[26, 8]], [4]),  # all-to-all over 4: a2a
    ([(0, 2), (1, 3)], [[19, 5], [11]], [2, 2]),  # all-to-all over 2
]


def _model(core: type) -> Any:
    from megatron.core.models.gpt import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    from fcp_exec.megatron import fcp_gpt_spec, fcp_process_groups, keep_rotary_on_cpu

    torch.manual_seed(1234)
    config = TransformerConfig(
        num_layers=2, hidden_size=32, num_attention_heads=8, num_query_groups=4,
        use_cpu_initialization=True, attention_dropout=0.0, hidden_dropout=0.0,
        apply_rope_fusion=False, params_dtype=torch.float32, pipeline_dtype=torch.float32,
    )  # fmt: skip
    spec = fcp_gpt_spec(config)  # torch norms: TE is "present", its norms are not
    for layer in spec.layer_specs:
        layer.submodules.self_attention.submodules.core_attention = core
    model = GPTModel(
        config=config, transformer_layer_spec=spec, vocab_size=64, max_sequence_length=256,
        position_embedding_type="rope", pg_collection=fcp_process_groups(),
    )  # fmt: skip
    keep_rotary_on_cpu(model)
    return model


def te_worker(rank: int, world: int) -> None:
    install()  # before megatron-core's TE extension is imported anywhere in this process
    from megatron.core import parallel_state as ps

    from fcp_data.errors import ExecError
    from fcp_data.planner.plan import CPGroup, Plan, Wave
    from fcp_exec import CPGroupCache, ReplicaRanks, cp_context, local_token_index, megatron_te
    from fcp_exec.megatron import FCPCoreAttention
    from fcp_exec.megatron_te import FCPTEDotProductAttention

    from ._megatron_job import _loss_sum, _pack, _rank_plan

    ps.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
    te, ref = _model(FCPTEDotProductAttention), _model(FCPCoreAttention)
    for a, b in zip(te.parameters(), ref.parameters(), strict=True):
        assert torch.equal(a, b)
    cores = [m for m in te.modules() if isinstance(m, FCPTEDotProductAttention)]
    assert len(cores) == 2
    plan = Plan(
        num_replicas=4,
        waves=tuple(
            Wave(
                groups=tuple(
                    CPGroup(
                        replicas=r,
                        degree=len(r),
                        sequence_ids=tuple(range(len(sl))),
                        seqlens=tuple(sl),
                        causal=(True,) * len(sl),
                        predicted_time=0.0,
                        ulysses=u,
                    )
                    for r, sl, u in zip(rings, seqs, us, strict=True)
                )
            )
            for rings, seqs, us in WAVES
        ),
        predicted_time=0.0,
        lower_bound=0.0,
        strategy="test",
        winner="test",
    ).with_digest()
    cache = CPGroupCache(ReplicaRanks(world_size=world))
    cache.prepare_plan(plan)
    total_te, total_ref = torch.zeros(()), torch.zeros(())
    singles = [(r,) for r in range(world)]
    for w, (rings, seqs, us) in enumerate(WAVES):
        i = next(i for i, r in enumerate(rings) if rank in r)
        ring, seqlens = rings[i], seqs[i]
        causal = [True] * len(seqlens)
        pack = _pack(seqlens, len(ring), seed=10 * w + i)
        idx = local_token_index(pack["cu_p"], len(ring), ring.index(rank))
        CALLS.clear()
        with cp_context(plan.for_replica(rank, w), groups=cache) as cp:
            loss = _loss_sum(te, pack, idx, causal)
            loss.backward()
        d, u = len(ring), us[i]
        want = "p2p" if u == 1 or d == 1 else ("a2a" if u == d else "a2a+p2p")
        assert CALLS and all(c["comm_type"] == want and c["size"] == len(ring) for c in CALLS), (
            w, CALLS)  # fmt: skip
        assert all(c["index"] == sorted(cp.members).index(rank) for c in CALLS)
        assert all(m.cp_group is None for m in cores), "TE's CP group not restored"
        total_te += loss.detach()
        for j, sl in enumerate(seqs):  # the reference: every sequence here, no CP
            with cp_context(_rank_plan(rank, w, (rank,), sl, [True] * len(sl)), groups=cache,
                            wave_groups=singles):  # fmt: skip
                pk = _pack(sl, len(rings[j]), seed=10 * w + j)
                ref_loss = _loss_sum(ref, pk, torch.arange(len(pk["tokens"])), [True] * len(sl))
                ref_loss.backward()
            total_ref += ref_loss.detach()
    dist.all_reduce(total_te)
    for p in te.parameters():
        assert p.grad is not None
        dist.all_reduce(p.grad)
    rel_loss = abs(total_te - total_ref).item() / abs(total_ref).item()
    assert rel_loss <= 1e-5, f"relative loss error {rel_loss:.3g}"
    worst = 0.0
    for (name, p), q in zip(te.named_parameters(), ref.parameters(), strict=True):
        assert q.grad is not None and q.grad.norm() > 0, f"vacuous reference grad for {name}"
        rel = ((p.grad - q.grad).norm() / q.grad.norm()).item()
        worst = max(worst, rel)
        assert rel <= 1e-5, f"{name}: relative grad error {rel:.3g}"

    # an unsorted ring: refused on both members before the first step
    unsorted = (1, 0) if rank in (0, 1) else (3, 2)
    seqlens = [21, 4]
    bad = Plan(
        num_replicas=4,
        waves=(
            Wave(
                groups=tuple(
                    CPGroup(
                        replicas=r,
                        degree=2,
                        sequence_ids=(0, 1),
                        seqlens=tuple(seqlens),
                        causal=(True, True),
                        predicted_time=0.0,
                    )
                    for r in ((1, 0), (3, 2))
                )
            ),
        ),
        predicted_time=0.0,
        lower_bound=0.0,
        strategy="test",
        winner="test",
    ).with_digest()
    cache.prepare_plan(bad)
    pack = _pack(seqlens, 2, seed=99)
    idx = local_token_index(pack["cu_p"], 2, unsorted.index(rank))
    with cp_context(bad.for_replica(rank, 0), groups=cache):
        try:
            _loss_sum(te, pack, idx, [True, True])
            raise AssertionError("an unsorted ring reached TE")
        except ExecError as e:
            assert "not in ascending rank order" in str(e), str(e)
    # the planted bug: without the refusal, TE's chunk order gives measurably wrong attention
    real = megatron_te.te_cp_args

    def unchecked(binding: Any, heads: int, kv_heads: int) -> Any:
        return binding.group, sorted(binding.members), "p2p"

    megatron_te.te_cp_args = unchecked  # type: ignore[assignment]
    te.zero_grad(set_to_none=True)
    ref.zero_grad(set_to_none=True)
    try:
        with cp_context(bad.for_replica(rank, 0), groups=cache):
            _loss_sum(te, pack, idx, [True, True]).backward()
    finally:
        megatron_te.te_cp_args = real  # type: ignore[assignment]
    with cp_context(_rank_plan(rank, 0, (rank,), seqlens, [True, True]), groups=cache,
                    wave_groups=singles):  # fmt: skip
        _loss_sum(ref, pack_whole := _pack(seqlens, 2, seed=99),
                  torch.arange(len(pack_whole["tokens"])), [True, True]).backward()  # fmt: skip
    off = 0.0
    for p, q in zip(te.parameters(), ref.parameters(), strict=True):
        assert p.grad is not None and q.grad is not None
        both = torch.stack([p.grad, q.grad])
        dist.all_reduce(both)  # two pairs ran the pack in shards, four ranks ran it whole
        off = max(off, ((both[0] - both[1] / 2).norm() / (both[1] / 2).norm()).item())
    assert off > 1e-3, f"the stand-in missed the chunk order (gradient off by {off:.2g})"
    if rank == 0:
        print(f"TE stand-in: loss rel {rel_loss:.2g}, worst grad rel {worst:.2g}; unsorted ring "
              f"refused; without the refusal a gradient is off by {off:.2g}")  # fmt: skip
    cache.clear()
    ps.destroy_model_parallel()
