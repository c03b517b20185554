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

With megatron-core's DistributedDataParallel use its own reduction instead (see
docs/design.md, "Gradients"): `TransformerConfig(calculate_per_token_loss=True)` makes it sum
(gradient_scaling_factor 1.0, ReduceOp.SUM); by default it averages over the DP x CP group.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist

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


def all_reduce_gradients(
    model: torch.nn.Module | Iterable[torch.nn.Parameter],
    group: dist.ProcessGroup | None = None,
    *,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
) -> int:
    """Sum `.grad` of every trainable parameter over `group` (default: the whole world).

    Call once per global batch, after the backward of the last wave and before the optimizer
    step. Returns the number of collectives issued. `group` is the DP x CP domain: all ranks
    that hold the same TP/PP shard of the model (the world when TP = PP = 1).
    """
    if bucket_bytes < 1:
        from fcp_data.errors import ConfigError

        raise ConfigError(f"bucket_bytes={bucket_bytes} must be >= 1 (default 25 MiB)")
    params = _params(model)
    for p in params:
        if p.grad is None:  # this rank did not reach the parameter: its share is zero
            p.grad = torch.zeros_like(p)
    calls = 0
    for bucket in _buckets(params, bucket_bytes):
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
