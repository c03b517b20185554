"""The cost model's ring bytes are the bytes ring attention sends, on 4 real gloo processes.

Every `torch.distributed.isend` of the job is wrapped to count the bytes that really leave each
rank (independently of `RingComm.sent_bytes`); per member and micro-batch the count must equal
`CostModel.ring_bytes` with the per-token coefficient `ring_bytes_per_token` of the same shape,
for d = 1..4, fp32 and bf16, MHA and GQA; for bf16 the analytic preset of a one-layer model of
that shape must charge the same bytes.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from fcp_data.layout import padded_length
from fcp_data.planner.cost.estimate import estimate_cost_model
from fcp_data.planner.cost.model import CostModel, ring_bytes_per_token
from fcp_data.planner.cost.presets import ModelSpec
from fcp_exec import RingComm, local_token_index, ring_attention

from ._dist import run_distributed

# (rings, dtype, heads, kv_heads, head_dim, seqlens)
CASES: list[tuple[list[list[int]], torch.dtype, int, int, int, list[int]]] = [
    ([[0, 1], [2, 3]], torch.float32, 4, 4, 8, [13, 40, 7]),
    ([[0, 1, 2], [3]], torch.bfloat16, 8, 2, 16, [50, 1, 22]),
    ([[0, 1, 2, 3]], torch.float32, 6, 1, 8, [64, 9]),
    ([[3, 1, 0, 2]], torch.bfloat16, 4, 4, 32, [33]),
]


def _bytes_worker(rank: int, world: int) -> None:
    sent = [0]
    real_isend = dist.isend

    def counting_isend(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        sent[0] += tensor.numel() * tensor.element_size()
        return real_isend(tensor, *args, **kwargs)

    dist.isend = counting_isend  # type: ignore[assignment]
    for i, (rings, dtype, heads, kv_heads, dim, seqlens) in enumerate(CASES):
        ring = next(r for r in rings if rank in r)
        d = len(ring)
        padded = [padded_length(s, d) if d > 1 else s + s % 2 for s in seqlens]
        cu = torch.tensor([0, *torch.tensor(seqlens).cumsum(0).tolist()])
        cu_p = torch.tensor([0, *torch.tensor(padded).cumsum(0).tolist()])
        idx = local_token_index(cu_p, d, ring.index(rank)) if d > 1 else torch.arange(sum(padded))
        g = torch.Generator().manual_seed(i)
        q = torch.randn(sum(padded), heads, dim, generator=g).to(dtype)[idx].requires_grad_()
        k, v = (torch.randn(sum(padded), kv_heads, dim, generator=g).to(dtype)[idx]
                .requires_grad_() for _ in range(2))  # fmt: skip
        comm = RingComm(ring)
        before = sent[0]
        ring_attention(q, k, v, cu, cu_p, ring=comm, causal=[True, False, True][: len(seqlens)]
                       ).sum().backward()  # fmt: skip
        counted = sent[0] - before
        per_token = ring_bytes_per_token(kv_heads=kv_heads, head_dim=dim,
                                         activation_bytes=dtype.itemsize)  # fmt: skip
        model = CostModel(alpha1=1.0, alpha2=0.0, alpha3=per_token).ring_bytes(seqlens, d)
        if dtype == torch.bfloat16:  # the presets assume bf16 activations
            spec = ModelSpec(name="one-layer", layers=1, hidden=heads * dim, heads=heads,
                             kv_heads=kv_heads, ffn=4 * heads * dim, vocab=128)  # fmt: skip
            assert estimate_cost_model(spec, "h200").ring_bytes(seqlens, d) == model
        assert counted == comm.sent_bytes == model, (
            f"case {i} ring {ring} {dtype} H={heads} H_kv={kv_heads} D={dim}: sent {counted} B "
            f"(RingComm counted {comm.sent_bytes}), cost model {model}"
        )
        assert (counted > 0) == (d > 1)
        dist.barrier()


def test_cost_model_ring_bytes_equal_the_bytes_sent() -> None:
    run_distributed(_bytes_worker, 4, timeout=180)
