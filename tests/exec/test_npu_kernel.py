"""The Ascend adapter's calls, against a fake torch_npu with the documented signatures and layouts.

No NPU here, so the fake has `npu_fusion_attention` / `npu_fusion_attention_grad` with the
exact schemas of Ascend/op-plugin's op_plugin_functions.yaml (the torch_npu 6.0 line, whose
forward ends at `sync`, and the current one, which appends `softmax_layout`, `sink`,
`dropout_mask`, `seed`, `offset`; the backward is keyword-only after `input_layout`). It checks
what the docs require of a TND call (host lists of cumulative end offsets, head_num = query
heads, H_kv-headed K/V, the 2048x2048 upper-triangular bool mask with sparse_mode 3 for causal,
none for full attention) and returns softmax_max/softmax_sum the way CANN lays them out in TND:
shape [T, N, 8], memory [N, T, 8]. The numbers come from `TorchMathKernel` on the Segments the
call describes; the adapter must agree with `TorchMathKernel` called directly.
"""

from __future__ import annotations

import sys
import types

import pytest
import torch

from fcp_exec.kernels.base import KernelUnsupportedError, Segments
from fcp_exec.kernels.npu import NpuFusionKernel, load_torch_npu
from fcp_exec.kernels.torch_math import TorchMathKernel

H, H_KV, D = 4, 2, 16
_MATH = TorchMathKernel()
CALLS: list[str] = []

BUFFERS = [
    pytest.param([0, 5, 12, 20], [0, 5, 12, 20], True, id="causal"),
    pytest.param([0, 3, 10, 16], [0, 7, 9, 21], False, id="full"),
]


def _segments(q, k, v, head_num, input_layout, atten_mask, keep_prob, actual_seq_qlen,
              actual_seq_kvlen, sparse_mode) -> tuple[Segments, bool]:  # fmt: skip
    """What the docs require of a TND call; the Segments and causal flag it describes."""
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise RuntimeError(f"npu_fusion_attention does not support {q.dtype}")
    assert input_layout == "TND" and keep_prob == 1.0
    assert head_num == q.shape[1] == H and k.shape[1] == v.shape[1] == H_KV, "GQA native"
    for lens in (actual_seq_qlen, actual_seq_kvlen):
        assert isinstance(lens, list) and all(type(x) is int for x in lens), "host int lists"
    assert actual_seq_qlen[-1] == q.shape[0] and actual_seq_kvlen[-1] == k.shape[0]
    if sparse_mode == 3:
        triu = torch.ones(2048, 2048, dtype=torch.bool).triu(1)
        assert atten_mask.dtype == torch.bool and atten_mask.device == q.device
        assert torch.equal(atten_mask.cpu(), triu), "sparse_mode 3 takes the compressed mask"
    else:
        assert sparse_mode == 0 and atten_mask is None
    seg = Segments.of([0, *actual_seq_qlen], [0, *actual_seq_kvlen])
    return seg, sparse_mode == 3


def _ntd(x: torch.Tensor) -> torch.Tensor:
    """[N, T] -> CANN's TND softmax tensor: shape [T, N, 8], memory [N, T, 8]."""
    n, t = x.shape
    return x.unsqueeze(-1).expand(n, t, 8).contiguous().view(t, n, 8)


def _forward(q, k, v, head_num, input_layout, pse, padding_mask, atten_mask, scale, keep_prob,
             pre_tockens, next_tockens, inner_precise, prefix, actual_seq_qlen,
             actual_seq_kvlen, sparse_mode, gen_mask_parallel, sync):  # fmt: skip
    assert pse is None and padding_mask is None and prefix is None and inner_precise == 0
    seg, causal = _segments(q, k, v, head_num, input_layout, atten_mask, keep_prob,
                            actual_seq_qlen, actual_seq_kvlen, sparse_mode)  # fmt: skip
    out, lse = _MATH.forward(q, k, v, seg, causal=causal, scale=scale)
    # a max / sum split that is not the trivial one: max + log(sum) == lse, sum >= 1
    shift = 0.25 * (torch.arange(lse.numel()).view_as(lse) % 5)
    CALLS.append("fwd")
    return out, _ntd(lse - shift), _ntd(torch.exp(shift)), torch.empty(0), 0, 0, 0


def npu_fusion_attention_60(query, key, value, head_num, input_layout, pse=None,
                            padding_mask=None, atten_mask=None, scale=1.0, keep_prob=1.0,
                            pre_tockens=2147483647, next_tockens=2147483647, inner_precise=0,
                            prefix=None, actual_seq_qlen=None, actual_seq_kvlen=None,
                            sparse_mode=0, gen_mask_parallel=True, sync=False):  # fmt: skip
    return _forward(query, key, value, head_num, input_layout, pse, padding_mask, atten_mask,
                    scale, keep_prob, pre_tockens, next_tockens, inner_precise, prefix,
                    actual_seq_qlen, actual_seq_kvlen, sparse_mode, gen_mask_parallel,
                    sync)  # fmt: skip


def npu_fusion_attention_now(query, key, value, head_num, input_layout, pse=None,
                             padding_mask=None, atten_mask=None, scale=1.0, keep_prob=1.0,
                             pre_tockens=2147483647, next_tockens=2147483647, inner_precise=0,
                             prefix=None, actual_seq_qlen=None, actual_seq_kvlen=None,
                             sparse_mode=0, gen_mask_parallel=True, sync=False,
                             softmax_layout="", sink=None, dropout_mask=None, seed=0,
                             offset=0):  # fmt: skip
    assert softmax_layout == "" and sink is None and dropout_mask is None
    return _forward(query, key, value, head_num, input_layout, pse, padding_mask, atten_mask,
                    scale, keep_prob, pre_tockens, next_tockens, inner_precise, prefix,
                    actual_seq_qlen, actual_seq_kvlen, sparse_mode, gen_mask_parallel,
                    sync)  # fmt: skip


def _grad(query, key, value, dy, head_num, input_layout, atten_mask, softmax_max, softmax_sum,
          softmax_in, attention_in, scale_value, keep_prob, actual_seq_qlen, actual_seq_kvlen,
          sparse_mode):  # fmt: skip
    assert softmax_in is None
    seg, causal = _segments(query, key, value, head_num, input_layout, atten_mask, keep_prob,
                            actual_seq_qlen, actual_seq_kvlen, sparse_mode)  # fmt: skip
    t = query.shape[0]
    for x in (softmax_max, softmax_sum):
        assert x.shape == (t, H, 8) and x.dtype == torch.float32 and x.is_contiguous()
    m, s = softmax_max.view(H, t, 8)[..., 0], softmax_sum.view(H, t, 8)[..., 0]
    lse = m + torch.log(s)
    grads = _MATH.backward(dy, query, key, value, attention_in, lse, seg, causal=causal,
                           scale=scale_value)  # fmt: skip
    CALLS.append("bwd")
    return (*grads, torch.empty(0), torch.empty(0))


def npu_fusion_attention_grad(query, key, value, dy, head_num, input_layout, *, pse=None,
                              padding_mask=None, atten_mask=None, softmax_max=None,
                              softmax_sum=None, softmax_in=None, attention_in=None,
                              scale_value=1.0, keep_prob=1.0, pre_tockens=2147483647,
                              next_tockens=2147483647, inner_precise=0, seed=0, offset=0,
                              numels=0, prefix=None, actual_seq_qlen=None,
                              actual_seq_kvlen=None, sparse_mode=0, gen_mask_parallel=True,
                              sync=False, softmax_layout="", sink=None):  # fmt: skip
    assert pse is None and padding_mask is None and prefix is None and softmax_layout == ""
    return _grad(query, key, value, dy, head_num, input_layout, atten_mask, softmax_max,
                 softmax_sum, softmax_in, attention_in, scale_value, keep_prob, actual_seq_qlen,
                 actual_seq_kvlen, sparse_mode)  # fmt: skip


FORWARDS = {"torch_npu-6.0": npu_fusion_attention_60, "current": npu_fusion_attention_now}


def _fake(release: str) -> types.ModuleType:
    mod = types.ModuleType("torch_npu")
    mod.npu_fusion_attention = FORWARDS[release]  # type: ignore[attr-defined]
    mod.npu_fusion_attention_grad = npu_fusion_attention_grad  # type: ignore[attr-defined]
    return mod


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("cu_q", "cu_k", "causal"), BUFFERS)
@pytest.mark.parametrize("release", list(FORWARDS))
def test_npu_fusion_matches_torch_math(release: str, cu_q, cu_k, causal: bool, dtype) -> None:
    """One TND call each way on a GQA varlen buffer: out/LSE/dq/dk/dv equal TorchMathKernel's
    (backward from the reference global out/LSE)."""
    kernel = NpuFusionKernel(_fake(release))
    seg = Segments.of(cu_q, cu_k)
    g = torch.Generator().manual_seed(0)
    q, do = (torch.randn(cu_q[-1], H, D, generator=g).to(dtype) for _ in range(2))
    k, v = (torch.randn(cu_k[-1], H_KV, D, generator=g).to(dtype) for _ in range(2))
    kernel.check(dtype=dtype, head_dim=D, heads=H, kv_heads=H_KV)
    CALLS.clear()
    out, lse = kernel.forward(q, k, v, seg, causal=causal, scale=0.3)
    ref_out, ref_lse = _MATH.forward(q, k, v, seg, causal=causal, scale=0.3)
    assert lse.dtype == torch.float32 and lse.shape == (H, cu_q[-1])
    assert torch.equal(out, ref_out)
    torch.testing.assert_close(lse, ref_lse, rtol=0, atol=1e-5)  # max + log(exp(shift)) rounds
    grads = kernel.backward(do, q, k, v, ref_out, ref_lse, seg, causal=causal, scale=0.3)
    ref = _MATH.backward(do, q, k, v, ref_out, ref_lse, seg, causal=causal, scale=0.3)
    for name, a, b in zip(("dq", "dk", "dv"), grads, ref):
        assert a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b), name
    assert CALLS == ["fwd", "bwd"]


def test_check_follows_the_documented_limits() -> None:
    kernel = NpuFusionKernel(_fake("current"))
    for dtype in (torch.float16, torch.bfloat16, torch.float32):  # fp32 is documented
        kernel.check(dtype=dtype, head_dim=128, heads=32, kv_heads=8)
    kernel.check(dtype=torch.bfloat16, head_dim=768, heads=256, kv_heads=1)
    with pytest.raises(KernelUnsupportedError, match=r"npu-fusion.*float64.*TorchMathKernel"):
        kernel.check(dtype=torch.float64, head_dim=64, heads=4, kv_heads=2)
    for bad in (0, 1024):
        with pytest.raises(KernelUnsupportedError, match=rf"npu-fusion.*head_dim 1 to 768.*{bad}"):
            kernel.check(dtype=torch.bfloat16, head_dim=bad, heads=4, kv_heads=2)
    with pytest.raises(KernelUnsupportedError, match=r"npu-fusion.*256 query heads.*512"):
        kernel.check(dtype=torch.bfloat16, head_dim=64, heads=512, kv_heads=8)
    with pytest.raises(KernelUnsupportedError, match=r"npu-fusion.*H=4.*H_kv=3"):
        kernel.check(dtype=torch.bfloat16, head_dim=64, heads=4, kv_heads=3)


def test_fake_returns_the_ntd_layout() -> None:
    """The fake's softmax tensors read as [N, T] in memory, not as their [T, N] shape (so an
    adapter that transposes the shape instead of viewing the memory fails above)."""
    x = torch.arange(6.0).view(2, 3)  # [N=2, T=3]
    y = _ntd(x)
    assert y.shape == (3, 2, 8)
    assert torch.equal(y.view(2, 3, 8)[..., 0], x)
    assert not torch.equal(y[..., 0].t(), x)


def test_load_torch_npu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch_npu", None)  # not installed
    assert load_torch_npu() is None
    fake = _fake("current")
    monkeypatch.setitem(sys.modules, "torch_npu", fake)
    assert load_torch_npu() is fake
