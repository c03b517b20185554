"""megatron-core DDP (overlap_grad_reduce) + DistributedOptimizer under fcp on 4 gloo processes.

Two optimizer steps of 3 waves each, a replica sitting out the last wave of each (placeholder
micro-batch), compared with one process training every sequence unsharded with plain Adam:
gradients and parameters after both steps within 1e-5 relative, for DDP summing
(`calculate_per_token_loss=True`) and for the default average rescaled by N. megatron-core's
buffers are placed on CPU by `fcp_exec.megatron_cpu.cuda_on_cpu(cuda_type_names=True)`.
"""

from __future__ import annotations

import pytest
import torch

from fcp_data.collate import MicroBatch
from fcp_data.errors import ConfigError, ExecError
from fcp_data.planner.plan import RankPlan

from ._dist import run_distributed


def _ddp_worker(rank: int, world: int) -> None:
    """Imports megatron-core in the children only (the parent spawns, it trains nothing)."""
    from ._megatron_ddp_job import ddp_worker

    ddp_worker(rank, world)


@pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="a CPU / gloo job: with CUDA present megatron puts its DDP buffers on the GPU",
)
def test_megatron_ddp_overlap_and_distributed_optimizer_match_one_process_over_two_steps() -> None:
    run_distributed(_ddp_worker, 4, timeout=240)


def _empty_plan(wave: int, num_waves: int) -> RankPlan:
    return RankPlan(
        replica=3, wave=wave, num_waves=num_waves, group_replicas=(), index_in_group=-1,
        degree=0, sequence_ids=(), seqlens=(), causal=(), predicted_time=0.0, digest="d",
    )  # fmt: skip


def test_wave_sync_refuses_an_empty_micro_batch_and_accepts_a_placeholder() -> None:
    from fcp_exec.megatron_ddp import wave_sync

    empty = MicroBatch.empty(_empty_plan(2, 3), global_num_loss_tokens=10)
    with pytest.raises(ExecError, match=r"idle='placeholder'"), wave_sync([], empty):
        pass
    last = MicroBatch.placeholder(_empty_plan(2, 3), global_num_loss_tokens=10)
    with pytest.raises(ConfigError, match="empty list"), wave_sync([], last):
        pass
    linear = [torch.nn.Linear(2, 2)]
    with pytest.raises(ConfigError, match="Linear is not megatron"), wave_sync(linear, last):  # type: ignore[arg-type]
        pass


def test_finish_step_names_the_wrapper_it_needs() -> None:
    from fcp_exec.megatron_ddp import ddp_gradient_factor, finish_step

    with pytest.raises(ConfigError, match="wrap the model"):
        finish_step(torch.nn.Linear(2, 2))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="empty list"):
        ddp_gradient_factor([])
