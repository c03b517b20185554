"""fcp_exec: the training side of Flexible Context Parallelism (process groups, ring attention).

Importing fcp_exec imports torch only; megatron-core, flash-attn and torch_npu are imported when
first used.
"""

from fcp_exec.attention import ring_attention
from fcp_exec.context import CPBinding, cp_context
from fcp_exec.groups import CPGroupCache, ReplicaRanks
from fcp_exec.kernels import select_kernel
from fcp_exec.layout import ShardLayout, local_token_index
from fcp_exec.ring import RingComm
from fcp_exec.verify import PlanMismatchError, verify_plan_digest

__all__ = [
    "CPBinding",
    "CPGroupCache",
    "PlanMismatchError",
    "ReplicaRanks",
    "RingComm",
    "ShardLayout",
    "cp_context",
    "local_token_index",
    "ring_attention",
    "select_kernel",
    "verify_plan_digest",
]
