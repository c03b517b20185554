"""`fcp_exec.megatron.packed_seq_params`: a MicroBatch as megatron-core's PackedSeqParams."""

from __future__ import annotations

import numpy as np
import torch
from megatron.core.packed_seq_params import PackedSeqParams

from fcp_data.collate import MicroBatch, pack_shard
from fcp_data.planner import CPGroup, Plan, Wave
from fcp_exec.megatron import FCPPackedSeqParams, packed_seq_params


def _microbatch() -> MicroBatch:
    group = CPGroup(
        replicas=(1, 2),
        degree=2,
        sequence_ids=(0, 1),
        seqlens=(10, 5),
        causal=(True, False),
        predicted_time=1.0,
    )
    plan = Plan(
        num_replicas=3,
        waves=(Wave(groups=(group,)),),
        predicted_time=1.0,
        lower_bound=0.9,
        strategy="fcp",
        winner="test",
    ).with_digest()
    rank_plan = plan.for_replica(2, 0)
    seqs = [np.arange(1, 11), np.arange(20, 25)]
    return MicroBatch.from_packed(
        pack_shard(seqs, degree=2, index=rank_plan.index_in_group),
        rank_plan=rank_plan,
        sample_ids=(7, 3),
        keys=("a", "b"),
        global_num_loss_tokens=13,
    )


def test_packed_seq_params_is_megatrons_thd_with_causal_flags() -> None:
    mb = _microbatch()
    params = packed_seq_params(mb)
    assert isinstance(params, PackedSeqParams) and isinstance(params, FCPPackedSeqParams)
    assert params.qkv_format == "thd" and params.local_cp_size == 2 and params.cp_group is None
    assert params.max_seqlen_q == params.max_seqlen_kv == 12  # 10 padded to a multiple of 4
    assert params.cu_seqlens_q.tolist() == params.cu_seqlens_kv.tolist() == [0, 10, 15]
    assert params.cu_seqlens_q_padded.tolist() == [0, 12, 20]
    assert torch.equal(params.cu_seqlens_kv_padded, mb.cu_seqlens_padded)
    assert params.causal == (True, False)
