"""MicroBatch: tensors, empty micro-batches (the megatron adapter is tested in tests/exec)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fcp_data.collate import IGNORE_INDEX, MicroBatch, pack_shard
from fcp_data.planner import CPGroup, Plan, Wave


def _plan() -> Plan:
    g = CPGroup(
        replicas=(1, 2),
        degree=2,
        sequence_ids=(0, 1),
        seqlens=(10, 5),
        causal=(True, False),
        predicted_time=1.0,
    )
    return Plan(
        num_replicas=3,
        waves=(Wave(groups=(g,)),),
        predicted_time=1.0,
        lower_bound=0.9,
        strategy="fcp",
        winner="test",
    ).with_digest()


def test_microbatch_from_packed() -> None:
    plan = _plan()
    rp = plan.for_replica(2, 0)
    seqs = [np.arange(1, 11), np.arange(20, 25)]
    mb = MicroBatch.from_packed(
        pack_shard(seqs, degree=2, index=rp.index_in_group),
        rank_plan=rp,
        sample_ids=(7, 3),
        keys=("a", "b"),
        global_num_loss_tokens=13,
    )
    assert mb.tokens.dtype == torch.int64 and mb.cu_seqlens.dtype == torch.int32
    assert mb.cu_seqlens.tolist() == [0, 10, 15]
    assert mb.cu_seqlens_padded.tolist() == [0, 12, 20]
    assert mb.local_cu_seqlens_padded.tolist() == [0, 6, 10]
    assert mb.num_tokens == 10 and mb.causal == (True, False) and mb.is_last_wave
    assert mb.digest == plan.digest and len(mb.digest) == 32
    moved = mb.to("cpu")
    assert torch.equal(moved.labels, mb.labels) and moved.rank_plan is mb.rank_plan


def test_empty_microbatch_is_a_noop() -> None:
    rp = _plan().for_replica(0, 0)
    assert rp.is_empty
    mb = MicroBatch.empty(rp, global_num_loss_tokens=13)
    assert mb.is_empty and mb.num_tokens == 0 and mb.num_loss_tokens == 0
    assert mb.cu_seqlens.tolist() == [0] and mb.global_num_loss_tokens == 13


def test_placeholder_runs_but_adds_nothing() -> None:
    """An idle replica's placeholder: the fewest tokens the layout allows, all out of the loss."""
    rp = _plan().for_replica(0, 0)
    for unit in (1, 4):
        mb = MicroBatch.placeholder(rp, global_num_loss_tokens=13, unit=unit, pad_id=7)
        assert mb.is_placeholder and not mb.is_empty and mb.degree == 1
        assert mb.num_tokens == 2 * unit and mb.num_loss_tokens == 0
        assert mb.cu_seqlens.tolist() == [0, 2 * unit] == mb.cu_seqlens_padded.tolist()
        assert (mb.labels == IGNORE_INDEX).all() and (mb.tokens == 7).all()
        assert mb.causal == (True,) and mb.global_num_loss_tokens == 13
    busy = _plan().for_replica(1, 0)
    assert not busy.is_empty
    with pytest.raises(ValueError, match="sits out"):
        MicroBatch.placeholder(busy, global_num_loss_tokens=13)
