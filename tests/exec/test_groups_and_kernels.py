"""Rank mapping against megatron-core's own generator; kernel selection, the CPU, explicit-score
and torch flash kernels (on `meta`) under the varlen contract."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from megatron.core.parallel_state import RankGenerator

from fcp_exec import ReplicaRanks, kernels, select_kernel
from fcp_exec.kernels import (
    CpuFlashKernel,
    KernelChoice,
    KernelUnsupportedError,
    Segments,
    TorchFlashKernel,
    TorchMathKernel,
)


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
    assert isinstance(select_kernel("meta"), TorchFlashKernel)  # the CUDA path, shape-only
    monkeypatch.setitem(sys.modules, "flash_attn", None)  # make flash-attn unimportable
    monkeypatch.setitem(sys.modules, "flash_attn.flash_attn_interface", None)
    monkeypatch.setitem(sys.modules, "flash_attn_interface", None)
    # no silent fall-back to explicit scores: every kernel's reason, and the alternative
    with pytest.raises(KernelUnsupportedError, match=r"torch-flash: .*flash-attn.*TorchMathKernel"):
        select_kernel("cuda", dtype=torch.bfloat16, head_dim=128, heads=32, kv_heads=8)
    monkeypatch.setitem(sys.modules, "torch_npu", None)
    with pytest.raises(KernelUnsupportedError, match="torch_npu cannot be imported"):
        select_kernel("npu", dtype=torch.bfloat16, head_dim=128, heads=32, kv_heads=8)
    with pytest.raises(KernelUnsupportedError, match="'cpu', 'cuda', 'npu'"):
        select_kernel("xla")


class _Fake:
    def __init__(self, name: str, half_only: bool = False) -> None:
        self.name, self.half_only = name, half_only

    def check(self, *, dtype, head_dim, heads, kv_heads) -> None:
        if self.half_only and dtype not in (torch.float16, torch.bfloat16):
            raise KernelUnsupportedError(f"kernel {self.name!r} runs fp16/bf16, got {dtype}")


def test_choice_is_by_measurement_once_per_block_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two kernels that can run a block: the faster *measured* one wins whatever the order
    or the names; the measurement runs once per block kind and the choice is stated."""
    slow, fast = _Fake("torch-flash", half_only=True), _Fake("flash-attn", half_only=True)
    monkeypatch.setattr(kernels, "kernel_candidates", lambda device: ([slow, fast], []))
    timed: list[str] = []

    def timer(kern, device, dtype, head_dim, heads, kv_heads) -> float:
        timed.append(kern.name)
        return {"torch-flash": 2e-3, "flash-attn": 1e-3}[kern.name]

    choice = KernelChoice(timer=timer)
    dev = torch.device("cuda", 0)
    assert choice.get(dev, torch.bfloat16, 128, 32, 8) is fast
    assert choice.get(dev, torch.bfloat16, 128, 32, 8) is fast
    assert sorted(timed) == ["flash-attn", "torch-flash"]  # measured once, both
    assert "flash-attn" in choice.report[0] and "measured fastest" in choice.report[0]
    timer_times = {"torch-flash": 1e-3, "flash-attn": 5e-3}
    picked = kernels.select_kernel(dev, dtype=torch.float16, head_dim=64, heads=8, kv_heads=8,
                                   timer=lambda k, *a: timer_times[k.name])  # fmt: skip
    assert picked is slow
    with pytest.raises(KernelUnsupportedError, match=r"torch-flash.*fp16/bf16.*flash-attn"):
        choice.get(dev, torch.float32, 128, 32, 8)  # fp32: refused by both, named, no fallback


def _varlen(seed: int, cu_q: list[int], cu_k: list[int], dtype: torch.dtype = torch.float32):
    g = torch.Generator().manual_seed(seed)
    q, do = (torch.randn(cu_q[-1], 4, 8, generator=g).to(dtype) for _ in range(2))
    k, v = (torch.randn(cu_k[-1], 2, 8, generator=g).to(dtype) for _ in range(2))
    return q, k, v, do, Segments.of(cu_q, cu_k)


@pytest.mark.parametrize(
    ("cu_q", "cu_k", "causal"),
    [([0, 5, 12, 13, 40], [0, 5, 12, 13, 40], True), ([0, 4, 9, 30], [0, 7, 8, 20], False)],
)
def test_math_kernel_matches_cpu_kernel(cu_q: list[int], cu_k: list[int], causal: bool) -> None:
    """Two independent varlen kernels (CPU flash with native GQA, explicit scores with
    expanded heads) agree on out, lse and every gradient, segment by segment."""
    q, k, v, do, seg = _varlen(0, cu_q, cu_k)
    o1, l1 = CpuFlashKernel().forward(q, k, v, seg, causal=causal, scale=0.3)
    o2, l2 = TorchMathKernel().forward(q, k, v, seg, causal=causal, scale=0.3)
    torch.testing.assert_close(o1, o2, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(l1, l2, atol=1e-5, rtol=1e-5)
    g1 = CpuFlashKernel().backward(do, q, k, v, o1, l1, seg, causal=causal, scale=0.3)
    g2 = TorchMathKernel().backward(do, q, k, v, o1, l1, seg, causal=causal, scale=0.3)
    assert g1[1].shape == k.shape  # dK/dV at H_kv heads
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    # segments are independent: the first one alone gives the same rows
    one = Segments.of(cu_q[:2], cu_k[:2])
    o3, _ = CpuFlashKernel().forward(q[: cu_q[1]], k[: cu_k[1]], v[: cu_k[1]], one,
                                     causal=causal, scale=0.3)  # fmt: skip
    torch.testing.assert_close(o3, o1[: cu_q[1]])


def test_torch_flash_kernel_runs_on_meta_with_native_gqa() -> None:
    """The CUDA kernel's own calls on `meta` tensors: H_kv-headed K/V in, [H, T] fp32 LSE out,
    dK/dV at H_kv heads; refusals name the kernel, the value and the alternative."""
    kern = TorchFlashKernel()
    q, k, v, do, _ = _varlen(1, [0, 3], [0, 3], torch.bfloat16)
    seg = Segments.of([0, 40, 100], [0, 40, 100], "meta")
    q, do = (torch.empty(100, 32, 128, dtype=torch.bfloat16, device="meta") for _ in range(2))
    k, v = (torch.empty(100, 8, 128, dtype=torch.bfloat16, device="meta") for _ in range(2))
    out, lse = kern.forward(q, k, v, seg, causal=True, scale=0.1)
    assert out.shape == q.shape and lse.shape == (32, 100) and lse.dtype == torch.float32
    dq, dk, dv = kern.backward(do, q, k, v, out, lse, seg, causal=True, scale=0.1)
    assert dq.shape == q.shape and dk.shape == dv.shape == k.shape
    with pytest.raises(KernelUnsupportedError, match=r"'torch-flash' runs fp16/bf16.*TorchMath"):
        kern.check(dtype=torch.float32, head_dim=128, heads=32, kv_heads=8)
    with pytest.raises(KernelUnsupportedError, match="head_dim a multiple of 8 up to 256, got 84"):
        kern.check(dtype=torch.bfloat16, head_dim=84, heads=32, kv_heads=8)
    with pytest.raises(KernelUnsupportedError, match=r"H=32 .* H_kv=6"):
        kern.check(dtype=torch.bfloat16, head_dim=128, heads=32, kv_heads=6)


def test_math_kernel_refuses_a_size_it_cannot_hold() -> None:
    seg = Segments.of([0, 16384], [0, 16384])
    q = torch.empty(16384, 32, 128, device="meta")
    with pytest.raises(KernelUnsupportedError, match=r"32.0 GiB of scores.*flash kernel"):
        TorchMathKernel().forward(q, q[:, :8], q[:, :8], seg, causal=True, scale=0.1)


def test_import_is_light() -> None:
    """`import fcp_exec` must not pull megatron-core, the planner (numba) or vendor kernels."""
    code = (
        "import sys, fcp_exec; heavy = [m for m in ('megatron', 'fcp_data.planner', 'flash_attn',"
        " 'torch_npu') if m in sys.modules]; assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
