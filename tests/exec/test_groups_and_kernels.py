"""Rank mapping against megatron-core's own generator; kernel selection and the NPU guard."""

from __future__ import annotations

import subprocess
import sys
import types

import pytest
import torch
from megatron.core.parallel_state import RankGenerator

from fcp_exec import ReplicaRanks, select_kernel
from fcp_exec.kernels import CpuFlashKernel, NpuFusionKernel, TorchMathKernel


@pytest.mark.parametrize(("tp", "pp", "world"), [(1, 1, 4), (2, 1, 8), (2, 2, 16), (4, 2, 24)])
def test_rings_are_megatron_dp_groups(tp: int, pp: int, world: int) -> None:
    """With CP = 1, megatron's DP groups are exactly the rings of all replicas."""
    ranks = ReplicaRanks(world_size=world, tensor_parallel=tp, pipeline_parallel=pp)
    n = ranks.num_replicas
    gen = RankGenerator(tp=tp, ep=1, dp=n, pp=pp, cp=1, order="tp-cp-ep-dp-pp")
    dp_groups = gen.get_ranks("dp")
    assert len(dp_groups) == tp * pp
    for group in dp_groups:
        assert list(ranks.ring(range(n), group[0])) == group
        for g in group:
            assert ranks.position(g)[0] == group.index(g)
    tp_groups = gen.get_ranks("tp")
    sub = (0, n - 1) if n > 1 else (0,)
    want = sorted(r for t in tp_groups for r in t if ranks.position(r)[0] in sub and
                  ranks.position(r)[2] == 0)  # fmt: skip
    assert list(ranks.tp_cp_ranks(sub, 0)) == want


def test_bad_parallel_sizes_are_named() -> None:
    with pytest.raises(ValueError, match="world_size=6 is not a multiple of TP\\*PP=4\\*1"):
        ReplicaRanks(world_size=6, tensor_parallel=4)


def test_kernel_selection_and_guards(monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(select_kernel("cpu"), CpuFlashKernel)
    monkeypatch.setitem(sys.modules, "flash_attn", None)  # make flash-attn unimportable
    monkeypatch.setitem(sys.modules, "flash_attn.flash_attn_interface", None)
    assert isinstance(select_kernel("cuda"), TorchMathKernel)
    monkeypatch.setitem(sys.modules, "torch_npu", None)
    with pytest.raises(RuntimeError, match="torch_npu cannot be imported"):
        select_kernel("npu")
    with pytest.raises(ValueError, match="'cpu', 'cuda', 'npu'"):
        select_kernel("meta")


def test_math_kernel_matches_cpu_kernel() -> None:
    g = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(9, 2, 8, generator=g) for _ in range(4))
    for causal in (True, False):
        o1, l1 = CpuFlashKernel().forward(q, k, v, causal=causal, scale=0.3)
        o2, l2 = TorchMathKernel().forward(q, k, v, causal=causal, scale=0.3)
        torch.testing.assert_close(o1, o2, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(l1, l2, atol=1e-5, rtol=1e-5)
        g1 = CpuFlashKernel().backward(do, q, k, v, o1, l1, causal=causal, scale=0.3)
        g2 = TorchMathKernel().backward(do, q, k, v, o1, l1, causal=causal, scale=0.3)
        for a, b in zip(g1, g2):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_npu_kernel_contract_with_mocked_torch_npu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mock npu_fusion_attention with the math kernel: the LSE/max/sum plumbing must be exact."""
    ref = TorchMathKernel()
    seen: dict[str, object] = {}

    def fwd(q, k, v, head_num, layout, *, atten_mask, scale, keep_prob, sparse_mode):  # type: ignore[no-untyped-def]
        seen.update(layout=layout, heads=head_num, mode=sparse_mode)
        out, lse = ref.forward(q[0], k[0], v[0], causal=atten_mask is not None, scale=scale)
        smax = (lse - 1.0).unsqueeze(-1).expand(*lse.shape, 8)[None]
        ssum = torch.full_like(smax, torch.e)  # max + log(sum) == lse
        return out[None], smax, ssum

    def bwd(q, k, v, dy, head_num, layout, *, atten_mask, softmax_max, softmax_sum,  # type: ignore[no-untyped-def]
            attention_in, scale_value, keep_prob, sparse_mode):  # fmt: skip
        lse = softmax_max[0, ..., 0] + torch.log(softmax_sum[0, ..., 0])
        return ref.backward(dy[0], q[0], k[0], v[0], attention_in[0], lse,
                            causal=atten_mask is not None, scale=scale_value)  # fmt: skip

    fake = types.SimpleNamespace(npu_fusion_attention=fwd, npu_fusion_attention_grad=bwd)
    monkeypatch.setitem(sys.modules, "torch_npu", fake)
    kernel = select_kernel("npu")
    assert isinstance(kernel, NpuFusionKernel)
    g = torch.Generator().manual_seed(1)
    q, k, v, do = (torch.randn(7, 2, 8, generator=g) for _ in range(4))
    out, lse = kernel.forward(q, k, v, causal=True, scale=0.5)
    assert seen == {"layout": "BSND", "heads": 2, "mode": 3}
    o2, l2 = ref.forward(q, k, v, causal=True, scale=0.5)
    torch.testing.assert_close(out, o2)
    torch.testing.assert_close(lse, l2)
    grads = kernel.backward(do, q, k, v, out, lse, causal=True, scale=0.5)
    for a, b in zip(grads, ref.backward(do, q, k, v, out, lse, causal=True, scale=0.5)):
        torch.testing.assert_close(a, b)


def test_import_is_light() -> None:
    """`import fcp_exec` must not pull megatron-core, the planner (numba) or vendor kernels."""
    code = (
        "import sys, fcp_exec; heavy = [m for m in ('megatron', 'fcp_data.planner', 'flash_attn',"
        " 'torch_npu') if m in sys.modules]; assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
