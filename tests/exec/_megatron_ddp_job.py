"""4-process job: megatron DDP (overlap_grad_reduce) + DistributedOptimizer, two exact steps.

Each rank trains a tiny GPTModel (FCPCoreAttention, 2 layers) wrapped in megatron-core's
DistributedDataParallel with `overlap_grad_reduce=True`, a bucket size that cuts its 27k
parameters into 5 buckets, and the DistributedOptimizer (Adam, fp32), through two global
batches of 3 waves each. In step 1 replica 0 sits the last wave out, in step 2 replica 3 does;
both get the loader's placeholder micro-batch. Step 1 is DDP's first batch (buckets launched in
`finish_grad_sync`), step 2 runs the overlapped path (buckets launched from the backward hooks
of the last wave), so a replica that skipped its forward there would leave its buckets
unlaunched. Rank 0 then replays both steps alone on every sequence unsharded (degree 1, no
DDP, plain `torch.optim.Adam`, loss divided by the same global count) and compares gradients
and parameters.

`variant` picks the loss-scaling setup: "sum" (`calculate_per_token_loss=True`, DDP sums) or
"average-rescaled" (megatron's default average, then `scale_gradients(4)` in `finish_step`).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist
from megatron.core import parallel_state as ps
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.transformer.transformer_config import TransformerConfig

from fcp_data.collate import MicroBatch, pack_shard
from fcp_data.errors import ConfigError
from fcp_data.planner.plan import CPGroup, Plan, RankPlan, Wave
from fcp_exec import CPGroupCache, ReplicaRanks, cp_context
from fcp_exec.megatron import FCPCoreAttention, fcp_process_groups, keep_rotary_on_cpu
from fcp_exec.megatron import packed_seq_params as make_packed_seq_params
from fcp_exec.megatron_cpu import cuda_on_cpu
from fcp_exec.megatron_ddp import ddp_gradient_factor, finish_step, wave_sync

__all__ = ["BUCKET_SIZE", "STEPS", "VARIANTS", "ddp_worker"]

VOCAB = 64
BUCKET_SIZE = 4096  # parameters per bucket: 27,456 parameters -> 5 buckets
# Adam's update of an element, lr * m / (sqrt(v) + eps), turns an absolute gradient error e
# into up to lr * eps / (|g| + eps)**2 * e: largest where the gradient cancels to about eps. With
# torch's eps 1e-8 a float32 rounding of 5e-10 in a 5.6e-8 gradient moved that element by 5e-4
# lr and the worst parameter by 1.3e-5 relative after one step, which measures Adam's
# conditioning, not the reduction; eps 1e-4 keeps it at 2.7e-6 while grads agree to 3e-7.
LR, BETAS, EPS = 1e-2, (0.9, 0.95), 1e-4
VARIANTS = ("sum", "average-rescaled")
TOL = 1e-5  # gradients and parameters, relative (norm of the difference / norm)
# The update p_after - p_before of a parameter near 1 (layer norms) resolves only to float32's
# spacing there, 1.2e-7 on an update of ~1e-2 per element, so updates get a looser bound.
UPDATE_TOL = 1e-4
MIN_CHANGE = 1e-3  # each step must move every parameter by >= 0.1% (measured >= 0.5%)
SITS_OUT_LAST = (0, 3)  # per step, the replica without a group in the last wave
# Per optimizer step, per wave: the CP groups as (ring, sequence lengths, causal flags).
STEPS: list[list[list[tuple[tuple[int, ...], list[int], list[bool]]]]] = [
    [  # step 1: replica 0 sits out the last wave
        [((0, 1, 2, 3), [37, 9], [True, True])],
        [((0, 2), [21, 4], [True, False]), ((3, 1), [13], [True])],
        [((2, 1), [16, 3, 10], [True, True, False]), ((3,), [7, 2], [False, True])],
    ],
    [  # step 2: replica 3 sits out the last wave (it ran step 1's last wave)
        [((1, 3, 0, 2), [29, 5], [True, True])],
        [((0, 1, 2), [30, 3], [True, True]), ((3,), [11], [True])],
        [((0, 2), [18], [True]), ((1,), [6, 5], [True, False])],
    ],
]


def _tokens(step: int, wave: int, group: int, seq: int, length: int) -> np.ndarray:
    g = torch.Generator().manual_seed(1000 * step + 100 * wave + 10 * group + seq)
    return torch.randint(0, VOCAB, (length,), generator=g).numpy()


def _plan(step: int) -> Plan:
    waves = tuple(
        Wave(groups=tuple(
            CPGroup(replicas=ring, degree=len(ring), sequence_ids=tuple(range(len(sl))),
                    seqlens=tuple(sl), causal=tuple(cz), predicted_time=0.0)
            for ring, sl, cz in wave
        ))
        for wave in STEPS[step]
    )  # fmt: skip
    return Plan(num_replicas=4, waves=waves, predicted_time=0.0, lower_bound=0.0,
                strategy="test", winner="test").with_digest()  # fmt: skip


def _global_loss_tokens(step: int) -> int:
    """L - 1 loss tokens per sequence of L tokens, over the whole global batch."""
    return sum(n - 1 for wave in STEPS[step] for _, sl, _ in wave for n in sl)


def _micro_batches(step: int, replica: int, plan: Plan) -> list[MicroBatch]:
    """This replica's micro-batch of each wave, as the loader builds them (placeholder idle)."""
    g_loss = _global_loss_tokens(step)
    out = []
    for w, wave in enumerate(STEPS[step]):
        rank_plan = plan.for_replica(replica, w)
        wave_groups = tuple(ring for ring, _, _ in wave)
        if rank_plan.is_empty:
            out.append(MicroBatch.placeholder(
                rank_plan, global_num_loss_tokens=g_loss, wave_groups=wave_groups))  # fmt: skip
            continue
        gi = next(i for i, (ring, _, _) in enumerate(wave) if replica in ring)
        _, seqlens, _ = wave[gi]
        seqs = [_tokens(step, w, gi, k, n) for k, n in enumerate(seqlens)]
        packed = pack_shard(seqs, degree=rank_plan.degree, index=rank_plan.index_in_group)
        out.append(MicroBatch.from_packed(
            packed, rank_plan=rank_plan, sample_ids=tuple(range(len(seqs))),
            keys=tuple(f"s{step}w{w}g{gi}q{k}" for k in range(len(seqs))),
            global_num_loss_tokens=g_loss, wave_groups=wave_groups,
        ))  # fmt: skip
    return out


def _reference_micro_batches(step: int) -> list[MicroBatch]:
    """Every group of the step as one degree-1 pack (unsharded, no CP)."""
    g_loss = _global_loss_tokens(step)
    out = []
    for w, wave in enumerate(STEPS[step]):
        for gi, (_, seqlens, causal) in enumerate(wave):
            seqs = [_tokens(step, w, gi, k, n) for k, n in enumerate(seqlens)]
            rank_plan = RankPlan(
                replica=0, wave=w, num_waves=len(STEPS[step]), group_replicas=(0,),
                index_in_group=0, degree=1, sequence_ids=tuple(range(len(seqs))),
                seqlens=tuple(seqlens), causal=tuple(causal), predicted_time=0.0, digest="ref",
            )  # fmt: skip
            out.append(MicroBatch.from_packed(
                pack_shard(seqs, degree=1, index=0), rank_plan=rank_plan,
                sample_ids=tuple(range(len(seqs))), keys=(), global_num_loss_tokens=g_loss,
            ))  # fmt: skip
    return out


def _config(per_token_loss: bool) -> TransformerConfig:
    return TransformerConfig(
        num_layers=2, hidden_size=32, num_attention_heads=4, num_query_groups=2,
        use_cpu_initialization=True, attention_dropout=0.0, hidden_dropout=0.0,
        params_dtype=torch.float32, pipeline_dtype=torch.float32,
        calculate_per_token_loss=per_token_loss,
    )  # fmt: skip


def _model(config: TransformerConfig) -> GPTModel:
    torch.manual_seed(1234)
    spec = get_gpt_layer_local_spec()
    spec.submodules.self_attention.submodules.core_attention = FCPCoreAttention
    model = GPTModel(
        config=config, transformer_layer_spec=spec, vocab_size=VOCAB, max_sequence_length=256,
        position_embedding_type="rope", pg_collection=fcp_process_groups(),
    )  # fmt: skip
    assert keep_rotary_on_cpu(model) == 1
    return model


def _loss(model: torch.nn.Module, mb: MicroBatch) -> torch.Tensor:
    """fcp's loss: this shard's per-token loss sum over the global batch's loss-token count."""
    per_token = model(mb.tokens[None], mb.position_ids[None], None, labels=mb.labels[None],
                      packed_seq_params=make_packed_seq_params(mb))  # fmt: skip
    return (per_token[0] * mb.loss_mask).sum() / mb.global_num_loss_tokens


def _gathered_grads(ddp: DistributedDataParallel) -> dict[str, torch.Tensor]:
    """Full reduced gradients on every rank (test only).

    With the distributed optimizer each rank's grad buffer holds the reduced sum only in its
    own shard of each bucket (a reduce-scatter); all-gathering the shards into the buffer makes
    every `param.main_grad` whole. The optimizer reads only its own shard, which is unchanged.
    """
    world = ddp.intra_dp_cp_group.size()
    me = ddp.intra_dp_cp_group.rank()
    for buffer in ddp.buffers:
        for bucket in buffer.buckets:
            flat = bucket.grad_data.view(-1)
            n = flat.numel() // world
            mine = flat[me * n : (me + 1) * n].clone()
            dist.all_gather_into_tensor(flat, mine, group=ddp.intra_dp_cp_group)
    return {name: p.main_grad.detach().clone() for name, p in ddp.module.named_parameters()}


def _params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def _train_fcp(
    rank: int, cache: CPGroupCache, variant: str
) -> tuple[list[dict[str, torch.Tensor]], list[dict[str, torch.Tensor]], dict[str, torch.Tensor]]:
    """Two steps under fcp; returns per step the reduced grads and the parameters after it."""
    config = _config(per_token_loss=variant == "sum")
    model = _model(config)
    initial = _params(model)
    ddp_config = DistributedDataParallelConfig(
        overlap_grad_reduce=True, use_distributed_optimizer=True, bucket_size=BUCKET_SIZE,
    )  # fmt: skip
    opt_config = OptimizerConfig(
        optimizer="adam", lr=LR, min_lr=LR, weight_decay=0.0, adam_beta1=BETAS[0],
        adam_beta2=BETAS[1], adam_eps=EPS, clip_grad=0.0, decoupled_weight_decay=False,
        use_distributed_optimizer=True, params_dtype=torch.float32,
    )  # fmt: skip
    with cuda_on_cpu(cuda_type_names=True):
        ddp = DistributedDataParallel(config, ddp_config, model)
        optimizer = get_megatron_optimizer(opt_config, [ddp])
    assert len(ddp.bucket_groups) >= 4, f"want several buckets, got {len(ddp.bucket_groups)}"
    if variant == "average-rescaled":  # the N-times-off setup is refused before any collective
        try:
            ddp_gradient_factor(ddp)
            raise AssertionError("the averaging DDP config was not refused")
        except ConfigError as e:
            assert "4x too small" in str(e) and "rescale_average=True" in str(e), str(e)
    grads, params = [], []
    # megatron-core 0.19's overlapped reduction asks for the CUDA stream inside backward hooks:
    # on a CPU the loop runs inside cuda_on_cpu, as examples/train_megatron.py's does
    with cuda_on_cpu():
        for step in range(len(STEPS)):
            plan = _plan(step)
            cache.prepare_plan(plan)
            ddp.zero_grad_buffer()
            optimizer.zero_grad()
            total = torch.zeros(())
            mbs = _micro_batches(step, rank, plan)
            assert mbs[-1].is_placeholder == (rank == SITS_OUT_LAST[step])
            for mb in mbs:
                with (
                    wave_sync(ddp, mb),
                    cp_context(mb.rank_plan, groups=cache, wave_groups=mb.wave_groups),
                ):
                    loss = _loss(ddp, mb)
                    loss.backward()
                total += loss.detach()
            # DDP's first batch launches its buckets in finish_grad_sync; from the second on, the
            # last wave's backward hooks have launched every bucket by now (the overlapped path)
            launched = [g.grad_reduce_handle is not None for g in ddp.bucket_groups]
            assert launched == [step > 0] * len(launched), f"step {step + 1}: launched {launched}"
            factor = finish_step(ddp, rescale_average=variant == "average-rescaled")
            assert factor == (4.0 if variant == "average-rescaled" else 1.0)
            grads.append(_gathered_grads(ddp))
            with cuda_on_cpu(cuda_type_names=True):
                ok, _, _ = optimizer.step()
            assert ok, "megatron optimizer skipped the step"
            dist.all_reduce(total)
            params.append({**_params(ddp.module), "__loss__": total})
    # the DistributedOptimizer all-gathers the updated shards: every rank holds the same model
    flat = torch.cat([p.reshape(-1) for p in params[-1].values()])
    every = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(every, flat)
    assert all(torch.equal(flat, other) for other in every), "ranks hold different parameters"
    return grads, params, initial


def _train_reference(
    initial: dict[str, torch.Tensor],
) -> tuple[list[dict[str, torch.Tensor]], list[dict[str, torch.Tensor]]]:
    """One process, every sequence unsharded, plain torch Adam with the same settings."""
    model = _model(_config(per_token_loss=True))
    for name, p in model.named_parameters():
        assert torch.equal(p, initial[name]), f"reference starts from other weights ({name})"
    optimizer = torch.optim.Adam(model.parameters(), lr=LR, betas=BETAS, eps=EPS)
    grads, params = [], []
    for step in range(len(STEPS)):
        optimizer.zero_grad()
        total = torch.zeros(())
        for mb in _reference_micro_batches(step):
            loss = _loss(model, mb)  # megatron's initial CP state: degree 1, this rank alone
            loss.backward()
            total += loss.detach()
        grads.append({n: p.grad.detach().clone() for n, p in model.named_parameters()})
        optimizer.step()
        params.append({**_params(model), "__loss__": total})
    return grads, params


def _compare(
    fcp: tuple[list[dict[str, torch.Tensor]], list[dict[str, torch.Tensor]]],
    ref: tuple[list[dict[str, torch.Tensor]], list[dict[str, torch.Tensor]]],
    initial: dict[str, torch.Tensor],
) -> dict[str, tuple[float, str]]:
    """Worst relative error of each kind and where: loss, gradient, parameter, update; and
    the smallest relative change of a parameter in one step (the guard against a no-op)."""
    worst: dict[str, tuple[float, str]] = {"min change": (float("inf"), "")}

    def note(kind: str, value: float, where: str) -> None:
        old = worst.get(kind, (-1.0, ""))[0]
        if (value < old) if kind == "min change" else (value > old):
            worst[kind] = (value, where)

    for step in range(len(STEPS)):
        before = initial if step == 0 else ref[1][step - 1]
        rel_loss = _rel(fcp[1][step]["__loss__"], ref[1][step]["__loss__"])
        assert rel_loss <= TOL, f"step {step + 1}: loss relative error {rel_loss:.3g}"
        note("loss", rel_loss, f"step {step + 1}")
        for name, g_ref in ref[0][step].items():
            assert g_ref.norm() > 0, f"step {step + 1}: vacuous reference gradient of {name}"
            rel = _rel(fcp[0][step][name], g_ref)
            assert rel <= TOL, f"step {step + 1}: {name} gradient relative error {rel:.3g}"
            note(f"grad step {step + 1}", rel, name)
        for name, p_ref in ref[1][step].items():
            if name == "__loss__":
                continue
            update = p_ref - before[name]
            change = (update.norm() / before[name].norm().clamp_min(1e-12)).item()
            assert change >= MIN_CHANGE, f"step {step + 1}: {name} moved by {change:.2g} only"
            p = fcp[1][step][name]
            rel_update = _rel(p - before[name], update)
            rel_param = _rel(p, p_ref)
            assert rel_param <= TOL and rel_update <= UPDATE_TOL, (
                f"step {step + 1}: {name} parameter relative error {rel_param:.3g}, of its "
                f"update {rel_update:.3g}"
            )
            note("param", rel_param, f"step {step + 1} {name}")
            note("update", rel_update, f"step {step + 1} {name}")
            note("min change", change, f"step {step + 1} {name}")
    return worst


def ddp_worker(rank: int, world: int, variants: tuple[str, ...] = VARIANTS) -> None:
    """Train both steps under fcp once per variant, compare each with one reference run.

    "sum": `calculate_per_token_loss=True`, DDP sums; "average-rescaled": megatron's default
    average, then `scale_gradients(N)` in `finish_step(..., rescale_average=True)`.
    """
    for variant in variants:
        if variant not in VARIANTS:
            raise ValueError(f"variant={variant!r}: use one of {VARIANTS}")
    ps.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
    cache = CPGroupCache(ReplicaRanks(world_size=world), capacity=32)
    reference = None
    for variant in variants:
        grads, params, initial = _train_fcp(rank, cache, variant)
        if rank != 0:
            continue
        if reference is None:
            reference = _train_reference(initial)
        worst = _compare((grads, params), reference, initial)
        print(
            f"megatron DDP overlap + DistributedOptimizer ({variant}), 2 steps vs 1 process: "
            + "; ".join(f"{k} {v:.2g} ({where})" for k, (v, where) in worst.items())
        )
    cache.clear()
    ps.destroy_model_parallel()
