"""fcp_exec: the training side of Flexible Context Parallelism (process groups, ring attention).

Per global batch, every rank (all of them, same order) creates the plan's groups; per micro-batch
the RankPlan's group is bound and attention runs over its ring:

    cache = CPGroupCache(ReplicaRanks(world_size=W, tensor_parallel=TP, pipeline_parallel=PP))
    cache.prepare_plan(plan)                      # or cp_context(..., wave_groups=...)
    with cp_context(rank_plan, groups=cache) as cp:   # members first check they agree
        out = cp_attention(q, k, v, cu_seqlens, cu_seqlens_padded, binding=cp, causal=flags)

`cp_attention` runs the group's transport: the ring (u = 1, `ring_attention`) or the hybrid
u x r of `fcp_exec.ulysses` (all-to-all over heads within blocks of u members, then a ring of
r = d / u); `fcp_exec.transport_bytes` states the bytes each moves.

In-memory batches (RL rollouts, `fcp_data.inmemory`): `gather_sequences` /
`all_gather_sequences` put per-token outputs back in sample order (`fcp_exec.gather`).

Vision-language models: `fcp_exec.vision.encode_and_scatter` (encode the tubelets a replica
holds, scatter them into its embeddings), `fcp_exec.hf` (ring attention as the transformers
attention implementation "fcp_ring"), `fcp_exec.megatron_mm` (megatron-core GPTModel on
decoder_input with rank-local M-RoPE).

Parallel layouts (docs/layouts/): `fcp_exec.megatron` (TP, sequence parallel, PP through
megatron's schedule: `fcp_gpt_spec`, `check_layout`), `fcp_exec.megatron_ddp` (megatron DDP
and the distributed optimizer: `finish_step`), `fcp_exec.fsdp` (FSDP2 / HSDP that sum:
`fully_shard_for_fcp`), `fcp_exec.megatron_cpu` (megatron's CUDA-only code paths on CPU).

Importing fcp_exec imports torch only; megatron-core, the planner, flash-attn and torch_npu are
imported when first used (`fcp_exec.megatron` needs megatron-core).
"""

from fcp_exec.attention import ring_attention
from fcp_exec.context import CPBinding, cp_context
from fcp_exec.gather import GatherError, all_gather_sequences, gather_sequences
from fcp_exec.grads import all_reduce_gradients
from fcp_exec.groups import CPGroupCache, ReplicaRanks
from fcp_exec.kernels import select_kernel
from fcp_exec.layout import ShardLayout, local_token_index
from fcp_exec.ring import RingComm
from fcp_exec.transport import cp_attention
from fcp_exec.transport_bytes import a2a_bytes_per_token
from fcp_exec.verify import PlanMismatchError, RingFingerprint, verify_plan_digest, verify_ring

__all__ = [
    "CPBinding",
    "CPGroupCache",
    "GatherError",
    "PlanMismatchError",
    "ReplicaRanks",
    "RingComm",
    "RingFingerprint",
    "ShardLayout",
    "a2a_bytes_per_token",
    "all_gather_sequences",
    "all_reduce_gradients",
    "cp_attention",
    "cp_context",
    "gather_sequences",
    "local_token_index",
    "ring_attention",
    "select_kernel",
    "verify_plan_digest",
    "verify_ring",
]
