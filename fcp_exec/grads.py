"""The gradient reduction that closes an fcp global batch: a SUM over every replica.

fcp's loss is a per-token sum divided by the *global* batch's loss-token count
(`MicroBatch.global_num_loss_tokens`, the same number on every replica), so each replica's
gradient is already its exact share of the per-token mean. The shares must therefore be
**summed** over all N replicas (the whole DP x CP domain), not averaged: an average would
shrink the step by N (1/8 on 8 replicas) and make the learning rate depend on cluster size.

`all_reduce_gradients` does that sum in few collectives: gradients are flattened into
buckets of one (device, dtype) each, up to `bucket_bytes` (25 MiB by default, the size
torch DDP uses), and each bucket is one `all_reduce(SUM)`; a 1B-parameter bf16 model is
about 80 collectives instead of one per parameter tensor.

Every rank must issue the same collectives in the same order, so the bucket layout may not
depend on which parameters got a gradient on this rank. A replica that sat out every wave of a
batch (empty micro-batches), or a layer no token of this replica reached, has `grad is None`;
such a parameter is reduced as zeros (its `.grad` is set), so all ranks agree. Parameters with
`requires_grad=False` (frozen) are skipped on every rank alike.

**The reduction follows the parallel layout.** A replica is TP x PP devices; the sum runs over
the replicas' data-parallel domain at each (TP rank, PP stage), never over the world when
TP x PP > 1 (summing TP shards of different tensors gives every gradient wrong: 1.56 relative
at TP = 2). The group is, in order: `group=` if given (checked: every member must sit at this
rank's TP rank and PP stage, or ConfigError), else megatron-core's data-parallel group when
parallel_state is initialised (fcp initialises it with context-parallel size 1, so that group
is every replica), else `groups.data_parallel_group()` of a `CPGroupCache`, else the world
(TP = PP = 1 only). Then, as megatron's `finalize_model_grads` does, two layout-specific sums:
parameters that megatron marks `sequence_parallel` (layernorms and biases replicated over TP
while their inputs are sequence-split; 14 of them in a 2-layer GPT) and qk-layernorms are
summed over the TP group, and a word embedding tied to the output layer across pipeline
stages is summed over megatron's embedding group (first and last stage; 0.72 relative off
without it at PP = 2).

With megatron-core's DistributedDataParallel use its own reduction instead,
`fcp_exec.megatron_ddp.finish_step` (docs/layouts/megatron-ddp.md):
`TransformerConfig(calculate_per_token_loss=True)` makes it sum (gradient_scaling_factor 1.0,
ReduceOp.SUM); by default it averages over the DP x CP group. Under FSDP2 never call this
(each rank holds a different shard): `fcp_exec.fsdp.fully_shard_for_fcp` makes FSDP sum.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from types import ModuleType
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from fcp_data.errors import ConfigError

if TYPE_CHECKING:
    from fcp_exec.groups import CPGroupCache

__all__ = ["DEFAULT_BUCKET_BYTES", "all_reduce_gradients"]

DEFAULT_BUCKET_BYTES = 25 * 1024 * 1024


def _params(model: torch.nn.Module | Iterable[torch.nn.Parameter]) -> list[torch.nn.Parameter]:
    """Trainable parameters in a fixed order (module order), each once (tied weights)."""
    params = model.parameters() if isinstance(model, torch.nn.Module) else model
    seen: set[int] = set()
    out = []
    for p in params:
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


def _buckets(params: list[torch.nn.Parameter], bucket_bytes: int) -> list[list[torch.nn.Parameter]]:
    """Consecutive runs of one (device, dtype), each at most `bucket_bytes` (or one tensor)."""
    by_kind: dict[tuple[torch.device, torch.dtype], list[list[torch.nn.Parameter]]] = {}
    sizes: dict[tuple[torch.device, torch.dtype], int] = {}
    for p in params:
        kind = (p.device, p.dtype)
        nbytes = p.numel() * p.element_size()
        runs = by_kind.setdefault(kind, [[]])
        if runs[-1] and sizes[kind] + nbytes > bucket_bytes:
            runs.append([])
            sizes[kind] = 0
        runs[-1].append(p)
        sizes[kind] = sizes.get(kind, 0) + nbytes
    return [run for runs in by_kind.values() for run in runs if run]


def _megatron_state() -> ModuleType | None:
    """megatron-core's parallel_state when the program imported and initialised it, else None
    (never imported here: a plain PyTorch job would pay seconds for nothing)."""
    ps = sys.modules.get("megatron.core.parallel_state")
    return ps if ps is not None and ps.model_parallel_is_initialized() else None


def _layout_sizes(ps: ModuleType | None, groups: CPGroupCache | None) -> tuple[int, int]:
    if ps is not None:
        return (
            ps.get_tensor_model_parallel_world_size(),
            ps.get_pipeline_model_parallel_world_size(),
        )
    if groups is not None:
        return groups.ranks.tensor_parallel, groups.ranks.pipeline_parallel
    return 1, 1


def _check_group(group: dist.ProcessGroup, tp: int, pp: int) -> None:
    """Every member of a gradient group must hold the same TP shard and PP stage as this rank."""
    if tp * pp == 1:
        return
    from fcp_exec.groups import ReplicaRanks

    ranks = ReplicaRanks(world_size=dist.get_world_size(), tensor_parallel=tp, pipeline_parallel=pp)
    me = ranks.position(dist.get_rank())[1:]
    members = dist.get_process_group_ranks(group)
    bad = [r for r in members if ranks.position(r)[1:] != me]
    if bad:
        raise ConfigError(
            f"the gradient group {members} spans TP/PP ranks: rank {bad[0]} is (tp, pp) "
            f"{ranks.position(bad[0])[1:]} but this rank {dist.get_rank()} is {me} (TP={tp}, "
            f"PP={pp}); pass the data-parallel group (CPGroupCache.data_parallel_group() or "
            "megatron's get_data_parallel_group()), never one that mixes model shards"
        )


def _sum(params: list[torch.nn.Parameter], group: dist.ProcessGroup | None, limit: int) -> int:
    calls = 0
    for bucket in _buckets(params, limit):
        grads = [p.grad for p in bucket]
        if len(grads) == 1 and grads[0].is_contiguous():
            dist.all_reduce(grads[0], op=dist.ReduceOp.SUM, group=group)
        else:
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
            offset = 0
            for g in grads:
                g.copy_(flat[offset : offset + g.numel()].view_as(g))
                offset += g.numel()
        calls += 1
    return calls


def _tp_replicated(model: object, params: list[torch.nn.Parameter]) -> list[torch.nn.Parameter]:
    """Parameters replicated over TP whose gradients are partial per TP rank (megatron marks
    them `sequence_parallel`; qk-layernorms by name), as `finalize_model_grads` selects them."""
    config = getattr(model, "config", None)
    if not isinstance(model, torch.nn.Module):
        return [p for p in params if getattr(p, "sequence_parallel", False)]
    sp = bool(getattr(config, "sequence_parallel", False))
    qk = bool(getattr(config, "qk_layernorm", False))
    ids = {id(p) for p in params}
    out, seen = [], set()
    for name, p in model.named_parameters():
        if id(p) not in ids or id(p) in seen:
            continue
        if (sp and getattr(p, "sequence_parallel", False)) or (
            qk and ("q_layernorm" in name or "k_layernorm" in name)
        ):
            seen.add(id(p))
            out.append(p)
    return out


def _tied_embedding(model: object) -> torch.nn.Parameter | None:
    """The word embedding a megatron model ties to its output layer on another PP stage."""
    inner = model
    while not hasattr(inner, "share_embeddings_and_output_weights") and hasattr(inner, "module"):
        inner = inner.module
    if not getattr(inner, "share_embeddings_and_output_weights", False):
        return None
    getter = getattr(inner, "shared_embedding_or_output_weight", None)
    return getter() if callable(getter) else None


def all_reduce_gradients(
    model: torch.nn.Module | Iterable[torch.nn.Parameter],
    group: dist.ProcessGroup | None = None,
    *,
    groups: CPGroupCache | None = None,
    tp_group: dist.ProcessGroup | None = None,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
) -> int:
    """Sum `.grad` of every trainable parameter over the replicas (the data-parallel domain).

    Call once per global batch, after the backward of the last wave and before the optimizer
    step. Returns the number of collectives issued. `group`: the replicas' data-parallel
    group at this rank's TP rank and PP stage; default as the module docstring says (pass
    `groups=` the CPGroupCache when TP x PP > 1 without megatron-core). `tp_group`: the TP
    group for sequence-parallel parameters (default megatron's).
    """
    if bucket_bytes < 1:
        raise ConfigError(f"bucket_bytes={bucket_bytes} must be >= 1 (default 25 MiB)")
    ps = _megatron_state()
    tp, pp = _layout_sizes(ps, groups)
    if group is None:
        if ps is not None:
            if ps.get_context_parallel_world_size() != 1:
                raise ConfigError(
                    f"megatron's context-parallel size is {ps.get_context_parallel_world_size()}"
                    " outside cp_context: initialise megatron with context_parallel_size=1 (fcp "
                    "binds CP per wave) and call all_reduce_gradients after the last wave"
                )
            group = ps.get_data_parallel_group()
        elif groups is not None:
            group = groups.data_parallel_group()
        elif tp * pp > 1:
            raise ConfigError(
                f"TP={tp} x PP={pp}: pass group= the data-parallel group or groups= the "
                "CPGroupCache; a sum over the world would add different model shards"
            )
    if group is not None:
        _check_group(group, tp, pp)
    params = _params(model)
    for p in params:
        if p.grad is None:  # this rank did not reach the parameter: its share is zero
            p.grad = torch.zeros_like(p)
    calls = _sum(params, group, bucket_bytes)
    if tp > 1:
        replicated = _tp_replicated(model, params)
        if replicated:
            if tp_group is None:
                if ps is None:
                    raise ConfigError(
                        f"{len(replicated)} sequence-parallel parameters need a sum over the TP "
                        "group: pass tp_group="
                    )
                tp_group = ps.get_tensor_model_parallel_group()
            calls += _sum(replicated, tp_group, bucket_bytes)
    if pp > 1 and ps is not None:
        emb_group = ps.get_embedding_group(check_initialized=False)
        weight = _tied_embedding(model)
        if (
            weight is not None
            and weight.requires_grad
            and emb_group is not None
            and dist.get_rank() in dist.get_process_group_ranks(emb_group)
            and emb_group.size() > 1
        ):
            if weight.grad is None:
                weight.grad = torch.zeros_like(weight)
            dist.all_reduce(weight.grad, op=dist.ReduceOp.SUM, group=emb_group)
            calls += 1
    return calls
