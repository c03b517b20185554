"""The flash-attn adapter's calls, against fakes with flash-attn's exact private signatures.

No GPU here, so each fake has the positional/keyword signature of one flash-attn line (2.5,
2.6: `window_size` tuple and 8 return values with the LSE at index 5; 2.7+: window_size_left/
right and 4 return values), refuses fp32 like the real kernel, and computes with
`TorchMathKernel`. A wrong argument name, a wrong return index or an fp32 block sent to
flash-attn fails here instead of on the first GPU run.
"""

from __future__ import annotations

import sys
import types

import pytest
import torch

from fcp_exec import ring_attention
from fcp_exec.kernels import FlashAttnKernel, TorchMathKernel
from fcp_exec.kernels.flash_attn_cuda import flash_attn_api, load_flash_attn

_MATH = TorchMathKernel()


def _check_half(q: torch.Tensor) -> None:
    if q.dtype not in (torch.float16, torch.bfloat16):
        raise RuntimeError("FlashAttention only support fp16 and bf16 data type")


def _fake(api: str, calls: list[str]) -> types.ModuleType:
    mod = types.ModuleType("flash_attn.flash_attn_interface")

    def fwd(q, k, v, dropout_p, softmax_scale, causal, window=None, softcap=0.0):
        _check_half(q)
        assert window in ((-1, -1), None) and softcap == 0.0 and dropout_p == 0.0
        out, lse = _MATH.forward(q[0], k[0], v[0], causal=causal, scale=softmax_scale)
        calls.append("fwd")
        return out.unsqueeze(0), lse.unsqueeze(0)

    def bwd(dout, q, k, v, out, lse, dq, dk, dv, scale, causal):
        _check_half(q)
        assert lse.dtype == torch.float32 and lse.is_contiguous()
        assert dq.is_contiguous() and dk.is_contiguous() and dv.is_contiguous()
        g = _MATH.backward(dout[0], q[0], k[0], v[0], out[0], lse[0], causal=causal, scale=scale)
        for buf, val in zip((dq, dk, dv), g):
            buf.copy_(val.unsqueeze(0))
        calls.append("bwd")
        return torch.empty(0)

    if api == "2.7":

        def forward(q, k, v, dropout_p, softmax_scale, causal, window_size_left,
                    window_size_right, softcap, alibi_slopes, return_softmax):  # fmt: skip
            assert (window_size_left, window_size_right) == (-1, -1)
            out, lse = fwd(q, k, v, dropout_p, softmax_scale, causal, None, softcap)
            return out, lse, torch.empty(0), torch.empty(2)

        def backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, dropout_p, softmax_scale,
                     causal, window_size_left, window_size_right, softcap, alibi_slopes,
                     deterministic, rng_state=None):  # fmt: skip
            return bwd(dout, q, k, v, out, softmax_lse, dq, dk, dv, softmax_scale, causal)

    elif api == "2.6":

        def forward(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                    alibi_slopes, return_softmax):  # fmt: skip
            out, lse = fwd(q, k, v, dropout_p, softmax_scale, causal, tuple(window_size), softcap)
            return out, q, k, v, out, lse, None, torch.empty(2)

        def backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, dropout_p, softmax_scale,
                     causal, window_size, softcap, alibi_slopes, deterministic,
                     rng_state=None):  # fmt: skip
            return bwd(dout, q, k, v, out, softmax_lse, dq, dk, dv, softmax_scale, causal)

    else:

        def forward(q, k, v, dropout_p, softmax_scale, causal, window_size, alibi_slopes,
                    return_softmax):  # fmt: skip
            out, lse = fwd(q, k, v, dropout_p, softmax_scale, causal, tuple(window_size))
            return out, q, k, v, out, lse, None, torch.empty(2)

        def backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, dropout_p, softmax_scale,
                     causal, window_size, alibi_slopes, deterministic, rng_state=None):  # fmt: skip
            return bwd(dout, q, k, v, out, softmax_lse, dq, dk, dv, softmax_scale, causal)

    mod._flash_attn_forward = forward  # type: ignore[attr-defined]
    mod._flash_attn_backward = backward  # type: ignore[attr-defined]
    return mod


def test_version_to_api() -> None:
    assert flash_attn_api("2.8.3") == "2.7" and flash_attn_api("2.7.4.post1") == "2.7"
    assert flash_attn_api("2.6.3") == "2.6" and flash_attn_api("2.5.9.post1") == "2.5"
    for old in ("2.4.2", "1.0.9", "3.0.0b1", "", "dev"):
        assert flash_attn_api(old) is None, old


def test_load_refuses_versions_before_2_5(monkeypatch: pytest.MonkeyPatch) -> None:
    top = types.ModuleType("flash_attn")
    monkeypatch.setitem(sys.modules, "flash_attn", top)
    monkeypatch.setitem(sys.modules, "flash_attn.flash_attn_interface", _fake("2.7", []))
    top.__version__ = "2.4.2"  # type: ignore[attr-defined]
    assert load_flash_attn() is None
    top.__version__ = "2.7.4.post1"  # type: ignore[attr-defined]
    assert load_flash_attn() is sys.modules["flash_attn.flash_attn_interface"]


@pytest.mark.parametrize("api", ["2.7", "2.6", "2.5"])
def test_ring_d1_through_each_signature_matches_torch_math(api: str) -> None:
    """bf16 and fp32 packs (GQA, causal + full) at d = 1: identical to the torch path; bf16
    blocks reach flash-attn, fp32 ones never do."""
    calls: list[str] = []
    kernel = FlashAttnKernel(_fake(api, calls), version=f"{api}.1")
    cu, cu_pad, flags = [0, 5, 12, 40], [0, 6, 14, 42], [True, False, True]
    g = torch.Generator().manual_seed(0)
    for dtype, reaches in ((torch.bfloat16, True), (torch.float32, False)):
        q, do = (torch.randn(42, 4, 16, generator=g).to(dtype) for _ in range(2))
        k, v = (torch.randn(42, 2, 16, generator=g).to(dtype) for _ in range(2))
        grads = []
        for kern in (kernel, _MATH):
            qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
            out = ring_attention(qq, kk, vv, cu, cu_pad, ring=[0], causal=flags, kernel=kern)
            out.backward(do)
            grads.append((out, qq.grad, kk.grad, vv.grad))
        for a, b in zip(*grads):
            assert torch.equal(a, b)
        assert (len(calls) > 0) == reaches, (dtype, calls)
        assert calls.count("fwd") == calls.count("bwd") == (3 if reaches else 0)
        calls.clear()
