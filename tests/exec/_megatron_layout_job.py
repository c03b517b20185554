"""megatron-core at TP = 2 (sequence parallel off, on) and PP = 2 (1F1B) with fcp vs TP = PP = 1.

Every process first builds the TP = PP = 1 reference (the same seed, no CP: each sequence run
unsharded at degree 1, all sequences on every process), then re-initialises megatron with the
layout under test, loads the reference's weights into its own shard of the model (by the
`tensor_model_parallel` / `partition_dim` attributes megatron puts on every sharded parameter,
and the global layer number of each stage's layers), runs fcp's plan of 2 replicas (a degree-2
ring, then degree 1 + 1, then a wave replica 0 sits out with a placeholder), sums gradients with
`fcp_exec.all_reduce_gradients` and compares loss and every parameter's full gradient.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator

import torch
import torch.distributed as dist
from megatron.core import parallel_state as ps
from megatron.core.models.gpt import GPTModel
from megatron.core.transformer.transformer_config import TransformerConfig

from fcp_data.collate import MicroBatch, pack_shard
from fcp_data.planner.plan import CPGroup, Plan, Wave
from fcp_exec import CPGroupCache, ReplicaRanks, all_reduce_gradients, cp_context
from fcp_exec.megatron import (
    fcp_gpt_spec,
    fcp_process_groups,
    keep_rotary_on_cpu,
    packed_seq_params,
)
from fcp_exec.megatron_cpu import cuda_on_cpu

__all__ = ["layout_worker"]

VOCAB, LAYERS = 64, 2
# per wave: (ring of replicas, sequence ids) groups; replica 0 sits the last wave out
WAVES = [[((0, 1), (0, 1))], [((0,), (2, 3)), ((1,), (4,))], [((1,), (5, 6))]]
SEQLENS = (37, 9, 21, 4, 13, 16, 3)
CAUSAL = (True, True, True, False, True, True, True)


def _plan(replicas: int = 2) -> Plan:
    """WAVES on 2 replicas; on 1 (TP = 4 takes the 4 processes) two waves at degree 1 whose rows
    are 2 mod 4 tokens when padded to 2d alone (70 and 38): only the TP pad unit makes them fit."""
    spec = WAVES if replicas == 2 else [[((0,), (0, 1, 2))], [((0,), (3, 4, 5, 6))]]
    waves = tuple(
        Wave(groups=tuple(
            CPGroup(replicas=ring, degree=len(ring), sequence_ids=ids,
                    seqlens=tuple(SEQLENS[i] for i in ids),
                    causal=tuple(CAUSAL[i] for i in ids), predicted_time=0.0)
            for ring, ids in wave
        ))
        for wave in spec
    )  # fmt: skip
    return Plan(num_replicas=replicas, waves=waves, predicted_time=0.0, lower_bound=0.0,
                strategy="test", winner="test").with_digest()  # fmt: skip


def _tokens(i: int) -> torch.Tensor:
    """Sequence i's tokens (and one more for its last label), the same in every process."""
    return torch.randint(0, VOCAB, (SEQLENS[i],), generator=torch.Generator().manual_seed(i))


GLOBAL_LOSS_TOKENS = sum(n - 1 for n in SEQLENS)


def _config(tp: int, pp: int, sp: bool) -> TransformerConfig:
    return TransformerConfig(
        num_layers=LAYERS, hidden_size=32, num_attention_heads=4, num_query_groups=max(2, tp),
        ffn_hidden_size=48, use_cpu_initialization=True, attention_dropout=0.0,
        hidden_dropout=0.0, params_dtype=torch.float32, pipeline_dtype=torch.float32,
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, sequence_parallel=sp,
        variable_seq_lengths=pp > 1, calculate_per_token_loss=True, add_bias_linear=True,
        moe_token_dispatcher_type="alltoall",  # 0.16 refuses variable lengths with "allgather"
    )  # fmt: skip


def _model(tp: int, pp: int, sp: bool, tied: bool, reference: bool = False) -> GPTModel:
    """reference: TP = PP = 1 with the query groups of a TP = `tp` model (the same shapes)."""
    torch.manual_seed(1234)
    config = _config(tp, pp, sp)
    if reference:
        config = _config(1, 1, False)
        config.num_query_groups = max(2, tp)
    model = GPTModel(
        config=config, transformer_layer_spec=fcp_gpt_spec(config), vocab_size=VOCAB,
        max_sequence_length=256, position_embedding_type="rope",
        pre_process=ps.is_pipeline_first_stage(), post_process=ps.is_pipeline_last_stage(),
        share_embeddings_and_output_weights=tied, pg_collection=fcp_process_groups(),
    )  # fmt: skip
    keep_rotary_on_cpu(model)
    return model


def _loss_sum(model: GPTModel, mb: MicroBatch) -> torch.Tensor:
    out = model(mb.tokens[None], mb.position_ids[None], None, labels=mb.labels[None],
                packed_seq_params=packed_seq_params(mb))  # fmt: skip
    return (out[0] * mb.loss_mask).sum()


def _reference(tied: bool, groups: int) -> tuple[dict, dict, float]:
    """TP = PP = 1, no CP: weights, gradients and loss of the whole global batch."""
    ps.initialize_model_parallel(1, 1)
    model = _model(groups, 1, False, tied, reference=True)
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    loss = torch.zeros(())
    for i in range(len(SEQLENS)):
        rp = _plan().for_replica(0, 2)  # replica 0 sits wave 2 out: a degree-0 RankPlan
        packed = pack_shard([_tokens(i).numpy()], degree=1, index=0)
        mb = MicroBatch.from_packed(packed, rank_plan=rp, sample_ids=(i,), keys=(str(i),),
                                    global_num_loss_tokens=GLOBAL_LOSS_TOKENS)  # fmt: skip
        mb.causal = (CAUSAL[i],)
        part = _loss_sum(model, mb) / GLOBAL_LOSS_TOKENS
        part.backward()
        loss += part.detach()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    ps.destroy_model_parallel()
    return weights, grads, float(loss)


def _full_name(name: str, layer_offset: int, tied: bool) -> str:
    """The TP = PP = 1 name of a parameter of this stage (global layer index)."""
    m = re.match(r"decoder\.layers\.(\d+)\.(.*)", name)
    if m:
        return f"decoder.layers.{int(m.group(1)) + layer_offset}.{m.group(2)}"
    if tied and name == "output_layer.weight":  # the last stage's copy of the tied embedding
        return "embedding.word_embeddings.weight"
    return name


def _shard(full: torch.Tensor, p: torch.nn.Parameter, tp: int) -> torch.Tensor:
    if not getattr(p, "tensor_model_parallel", False) or tp == 1:
        return full
    return full.chunk(tp, dim=p.partition_dim)[ps.get_tensor_model_parallel_rank()]


def _unshard(grad: torch.Tensor, p: torch.nn.Parameter, tp: int) -> torch.Tensor:
    if not getattr(p, "tensor_model_parallel", False) or tp == 1:
        return grad
    parts = [torch.empty_like(grad) for _ in range(tp)]
    dist.all_gather(parts, grad.contiguous(), group=ps.get_tensor_model_parallel_group())
    return torch.cat(parts, dim=p.partition_dim)


def _micro_batches(plan: Plan, replica: int, unit: int) -> list[MicroBatch]:
    mbs = []
    for w in range(plan.num_waves):
        rp = plan.for_replica(replica, w)
        wave_groups = tuple(g.replicas for g in plan.waves[w].groups)
        if rp.is_empty:
            mbs.append(MicroBatch.placeholder(rp, global_num_loss_tokens=GLOBAL_LOSS_TOKENS,
                                              unit=unit, wave_groups=wave_groups))  # fmt: skip
            continue
        seqs = [_tokens(i).numpy() for i in rp.sequence_ids]
        packed = pack_shard(seqs, degree=rp.degree, index=rp.index_in_group, unit=unit)
        mbs.append(MicroBatch.from_packed(
            packed, rank_plan=rp, sample_ids=rp.sequence_ids,
            keys=tuple(map(str, rp.sequence_ids)), global_num_loss_tokens=GLOBAL_LOSS_TOKENS,
            wave_groups=wave_groups,
        ))  # fmt: skip
    return mbs


def _run_direct(model: GPTModel, mbs: list[MicroBatch], cache: CPGroupCache) -> torch.Tensor:
    total = torch.zeros(())
    for mb in mbs:  # every micro-batch runs, the placeholder too
        with cp_context(mb.rank_plan, groups=cache):
            loss = _loss_sum(model, mb) / mb.global_num_loss_tokens
            loss.backward()
        total += loss.detach()
    return total


def _run_pipeline(model: GPTModel, mbs: list[MicroBatch], cache: CPGroupCache) -> torch.Tensor:
    """megatron's own 1F1B schedule, one micro-batch per wave; CP bound inside each forward."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    def loss_func(mb: MicroBatch, out: torch.Tensor) -> tuple:
        loss = (out[0] * mb.loss_mask).sum() / mb.global_num_loss_tokens
        return loss, torch.tensor(mb.num_loss_tokens), {"loss": loss.detach()}

    def forward_step(it: Iterator[MicroBatch], model: GPTModel) -> tuple:
        mb = next(it)
        with cp_context(mb.rank_plan, groups=cache):
            out = model(mb.tokens[None], mb.position_ids[None], None, labels=mb.labels[None],
                        packed_seq_params=packed_seq_params(mb))  # fmt: skip
        return out, functools.partial(loss_func, mb)

    losses = get_forward_backward_func()(
        forward_step_func=forward_step, data_iterator=iter(mbs), model=[model],
        num_microbatches=len(mbs), seq_length=max(mb.num_tokens for mb in mbs),
        micro_batch_size=1, forward_only=False,
    )  # fmt: skip
    return sum((d["loss"] for d in losses), torch.zeros(()))


def layout_worker(rank: int, world: int, cases: list[tuple[int, int, bool, bool]]) -> None:
    """Each case (TP, PP, sequence parallel, tied embeddings) in turn, in the same processes."""
    for tp, pp, sp, tied in cases:
        with cuda_on_cpu():  # megatron's SP and PP layers allocate on CUDA by name
            _case(rank, world, tp, pp, sp, tied)


def _case(rank: int, world: int, tp: int, pp: int, sp: bool, tied: bool) -> None:
    ref_weights, ref_grads, ref_loss = _reference(tied, tp)
    ps.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
    ranks = ReplicaRanks(world_size=world, tensor_parallel=tp, pipeline_parallel=pp)
    replica, tp_rank, pp_rank = ranks.position(rank)
    replicas = ranks.num_replicas
    assert ps.get_data_parallel_world_size() == replicas
    model = _model(tp, pp, sp, tied)
    offset = pp_rank * (LAYERS // pp)
    names = {n: _full_name(n, offset, tied) for n, _ in model.named_parameters()}
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(_shard(ref_weights[names[n]], p, tp))
    plan = _plan(replicas)
    cache = CPGroupCache(ranks)
    cache.prepare_plan(plan)  # every group of the batch before any micro-batch (PP schedule)
    mbs = _micro_batches(plan, replica, tp if sp else 1)
    assert sum(mb.is_placeholder for mb in mbs) == (replicas == 2 and replica == 0)
    if sp:  # the layout pads every row to a multiple of TP (megatron splits it over TP)
        assert all(mb.num_tokens % tp == 0 for mb in mbs)
    loss = (_run_pipeline if pp > 1 else _run_direct)(model, mbs, cache)
    all_reduce_gradients(model)
    # the loss: summed over replicas, counted once per replica (last stage, TP rank 0)
    last = ps.is_pipeline_last_stage() and tp_rank == 0
    stat = torch.stack([loss if last else torch.zeros(()), torch.tensor(float(last))])
    dist.all_reduce(stat)
    assert int(stat[1]) == replicas, f"{int(stat[1])} ranks counted the loss"
    rel_loss = abs(float(stat[0]) - ref_loss) / abs(ref_loss)
    worst, checked = 0.0, 0
    for n, p in model.named_parameters():
        full = _unshard(p.grad, p, tp)
        want = ref_grads[names[n]]
        assert want.norm() > 0, f"vacuous reference gradient for {names[n]}"
        rel = ((full - want).norm() / want.norm()).item()
        assert rel <= 1e-5, f"rank {rank} {n} ({names[n]}): relative gradient error {rel:.3g}"
        worst, checked = max(worst, rel), checked + 1
    assert rel_loss <= 1e-5, f"relative loss error {rel_loss:.3g}"
    counts = torch.tensor([checked])
    dist.all_reduce(counts)
    if rank == 0:
        print(f"TP={tp} PP={pp} SP={sp} tied={tied}: loss rel {rel_loss:.2g}, worst grad rel "
              f"{worst:.2g} over {int(counts)} parameter shards")  # fmt: skip
    cache.clear()
    ps.destroy_model_parallel()
