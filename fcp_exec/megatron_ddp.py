"""megatron-core DistributedDataParallel (and its DistributedOptimizer) under fcp: exact sums.

fcp's loss on each replica is its per-token loss sum divided by the *global* batch's loss-token
count (`MicroBatch.global_num_loss_tokens`, the same on every replica), so the gradients must be
**summed** over all N replicas. megatron-core's DDP (0.16.1) reduces over its DP x CP group,
which under fcp is every replica (megatron is initialised with context_parallel_size=1; fcp
binds the CP group per wave), and by default it *averages*: each bucket is multiplied by 1/N
before a SUM (or reduced with AVG when `average_in_collective=True`). Left alone that makes
every step N times too small (1/8 on 8 replicas) and the learning rate depend on cluster size.
Two settings give the sum:

* `TransformerConfig(calculate_per_token_loss=True)`: DDP's gradient scaling factor is 1.0 and
  its reduction `ReduceOp.SUM` (it asserts `average_in_collective=False`). Recommended: no
  extra pass over the gradients.
* the default average, then `DistributedDataParallel.scale_gradients(N)` after the reduction
  (`finish_step(..., rescale_average=True)`): bit-identical to the sum when N is a power of
  two (the 4-replica test), one more rounding per element otherwise.

After the backward of the last wave call `finish_step(model)`, which runs megatron's own
`finalize_model_grads(chunks, num_tokens=None)`: it waits for DDP's reduce-scatters /
all-reduces (`finish_grad_sync`) and also sums what a plain `finish_grad_sync()` leaves out,
layer-norm and qk-layernorm gradients over TP (sequence parallel), the shared word embedding
over the first and last pipeline stages. `num_tokens` must stay None: fcp has already divided by
the global count, and megatron would all-reduce the count again and divide a second time
(gradients G times too small for G loss tokens).

Every replica must run every micro-batch. With `overlap_grad_reduce=True` DDP launches a
bucket's collective from the backward hooks of the *last* micro-batch, once every parameter
of the bucket reported a gradient; a replica that skips the forward of the last wave reports
none, its buckets are never launched and `finish_grad_sync` fails ("Communication call has not
been issued for this bucket (0/5 params have grad available)" in the test) while the others
wait in their collectives. The loader's default
`Cluster(idle="placeholder")` gives such a replica a loss-free 2-token micro-batch, so it
runs forward and backward (every gradient exactly 0) like the others; `wave_sync` refuses an
empty micro-batch for that reason. The loop (docs/layouts/megatron-ddp.md):

    model.zero_grad_buffer(); optimizer.zero_grad()
    for mb in micro_batches:                     # one per wave, mb.is_last_wave on the last
        with wave_sync(model, mb), cp_context(mb.rank_plan, groups=cache,
                                              wave_groups=mb.wave_groups):
            per_token = model(mb.tokens[None], mb.position_ids[None], None,
                              labels=mb.labels[None], packed_seq_params=packed_seq_params(mb))
            loss = (per_token[0] * mb.loss_mask).sum() / mb.global_num_loss_tokens
            loss.backward()
    finish_step(model)
    optimizer.step()
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import torch
from megatron.core.distributed import DistributedDataParallel, finalize_model_grads

from fcp_data.errors import ConfigError, ExecError
from fcp_exec.megatron_cpu import cuda_on_cpu

if TYPE_CHECKING:
    from fcp_data.collate import MicroBatch

__all__ = ["ddp_gradient_factor", "finish_step", "wave_sync"]


def _chunks(
    model: DistributedDataParallel | Sequence[DistributedDataParallel],
) -> list[DistributedDataParallel]:
    chunks = [model] if isinstance(model, torch.nn.Module) else list(model)
    if not chunks:
        raise ConfigError("model is an empty list; pass the DistributedDataParallel chunk(s)")
    for chunk in chunks:
        if not isinstance(chunk, DistributedDataParallel):
            raise ConfigError(
                f"model chunk of type {type(chunk).__name__} is not megatron.core.distributed."
                "DistributedDataParallel; wrap the model with it (megatron FSDP and torch DDP "
                "are not covered here: use fcp_exec.all_reduce_gradients for an unwrapped model)"
            )
    return chunks


def ddp_gradient_factor(
    model: DistributedDataParallel | Sequence[DistributedDataParallel],
    *,
    rescale_average: bool = False,
) -> float:
    """What DDP's reduced gradients must be multiplied by to be fcp's sum over all replicas.

    1.0 when the model's TransformerConfig has `calculate_per_token_loss=True` (DDP sums);
    N, the size of DDP's DP x CP group, for the default average when `rescale_average=True`
    (4.0 on 4 replicas). Raises ConfigError for the default average without
    `rescale_average` (gradients N times too small), and when megatron was initialised with a
    context-parallel size > 1 (DDP would then reduce over fixed CP groups fcp does not use).
    No collective: call it anywhere, e.g. once after wrapping the model.
    """
    factors = set()
    for chunk in _chunks(model):
        dp_cp, dp = chunk.dp_cp_group.size(), chunk.dp_group.size()
        if dp_cp != dp:
            raise ConfigError(
                f"megatron-core was initialised with context_parallel_size={dp_cp // dp}; fcp "
                "binds each wave's CP group itself: call initialize_model_parallel("
                "context_parallel_size=1) so DDP reduces over every replica"
            )
        if chunk.config.calculate_per_token_loss:
            factors.add(1.0)
        elif rescale_average:
            factors.add(float(dp_cp))
        else:
            how = "AVG" if chunk.ddp_config.average_in_collective else f"x 1/{dp_cp} then SUM"
            raise ConfigError(
                f"TransformerConfig(calculate_per_token_loss=False): megatron DDP averages the "
                f"gradients over its {dp_cp} replicas ({how}), but fcp's loss is already divided "
                f"by the global loss-token count, so they would be {dp_cp}x too small; set "
                "calculate_per_token_loss=True on the config the model and DDP share (DDP then "
                "sums), or pass rescale_average=True (finish_step multiplies by "
                f"{dp_cp})"
            )
    if len(factors) != 1:
        raise ConfigError(
            f"model chunks disagree on calculate_per_token_loss (factors {sorted(factors)}); "
            "build every chunk from the same TransformerConfig"
        )
    return factors.pop()


def finish_step(
    model: DistributedDataParallel | Sequence[DistributedDataParallel],
    *,
    rescale_average: bool = False,
) -> float:
    """Close a global batch after the last wave's backward, before `optimizer.step()`.

    Runs megatron's `finalize_model_grads(chunks, num_tokens=None)` (DDP's reduction, TP
    layer-norm and PP embedding sums) and then, for the default average with
    `rescale_average=True`, `scale_gradients(N)`. Call on every rank once the last wave's
    backward has run (cp_context swaps none of the groups it uses). Returns the factor
    applied after the reduction (1.0 or N); raises ConfigError where `ddp_gradient_factor`
    does, before any collective, so no rank is left waiting.
    """
    chunks = _chunks(model)
    factor = ddp_gradient_factor(chunks, rescale_average=rescale_average)
    with cuda_on_cpu():  # megatron-core 0.19's reduction asks for the CUDA stream; a no-op on GPUs
        finalize_model_grads(chunks, num_tokens=None)
    if factor != 1.0:
        for chunk in chunks:
            chunk.scale_gradients(factor)
    return factor


@contextlib.contextmanager
def wave_sync(
    model: DistributedDataParallel | Sequence[DistributedDataParallel], mb: MicroBatch
) -> Iterator[None]:
    """`model.no_sync()` for every wave but the last, nothing on the last one.

    That is what megatron's schedules do: gradients accumulate locally in the DDP buffers for
    the first waves, and with `overlap_grad_reduce=True` each bucket's collective starts during
    the last wave's backward. Raises ExecError for an empty micro-batch (no forward, so the
    replica's buckets would never be launched): build the loader with the default
    `Cluster(idle="placeholder")`.
    """
    if mb.is_empty:
        raise ExecError(
            f"replica {mb.rank_plan.replica} got an empty micro-batch for wave {mb.wave}: it "
            "would skip forward and backward, and megatron DDP with overlap_grad_reduce=True "
            "then never launches its buckets; build the loader with the default "
            "Cluster(idle='placeholder') so every replica runs every wave"
        )
    chunks = _chunks(model)
    if mb.is_last_wave:
        yield
        return
    with contextlib.ExitStack() as stack:
        for chunk in chunks:
            stack.enter_context(chunk.no_sync())
        yield
