"""The flash-attn adapters' calls, against fakes with each release's exact private signatures.

No GPU here, so every fake has the positional/keyword signature of one release line (read in
Dao-AILab/flash-attention): flash-attn 2.6.0, 2.6.2-2.6.3, 2.7.0-2.7.2 and 2.7.3-2.8.3 (the
last one a real `torch.library.custom_op`, as installed with torch 2.4-2.9), and
FlashAttention-3's plain-Python (2025-01 to 2025-12) and custom-op (2025-12 on) interfaces. The
fakes refuse fp32 like the real kernels, insist on H_kv-headed K/V, int32 cu_seqlens on the
tensors' device, int max_seqlen, an fp32 contiguous LSE and contiguous dq/dk/dv buffers, and
compute with `TorchMathKernel` on the Segments they were given; the adapters must then agree
with `TorchMathKernel` called directly, to the bit, with one forward and one backward call.
"""

from __future__ import annotations

import sys
import types

import pytest
import torch

from fcp_exec.kernels.base import KernelUnsupportedError, Segments
from fcp_exec.kernels.flash_attn_cuda import (
    FlashAttn3Kernel,
    FlashAttnKernel,
    flash_attn_api,
    load_flash_attn,
    load_flash_attn3,
)
from fcp_exec.kernels.torch_math import TorchMathKernel

H, H_KV, D = 4, 2, 16
_MATH = TorchMathKernel()
CALLS: list[str] = []  # every fake appends "fwd" / "bwd"

# (cu_q, cu_k, causal): causal segments are square, the non-causal ones are not
BUFFERS = [
    pytest.param([0, 5, 12, 20], [0, 5, 12, 20], True, id="causal"),
    pytest.param([0, 3, 10, 16], [0, 7, 9, 21], False, id="full"),
]


# ---------------------------------------------------------------- what every fake checks


def _segments(q, cu_q, cu_k, max_q, max_k) -> Segments:
    for cu in (cu_q, cu_k):
        assert cu.dtype == torch.int32 and cu.device == q.device, cu
    seg = Segments.of(cu_q.tolist(), cu_k.tolist())
    assert type(max_q) is int and type(max_k) is int
    assert (max_q, max_k) == (seg.max_q, seg.max_k)
    return seg


def _inputs(q, k, v) -> None:
    if q.dtype not in (torch.float16, torch.bfloat16):
        raise RuntimeError("FlashAttention only support fp16 and bf16 data type")
    assert k.dtype == v.dtype == q.dtype
    assert q.shape[1] == H and k.shape[1] == v.shape[1] == H_KV, "K/V must keep their H_kv heads"


def _fwd(q, k, v, cu_q, cu_k, max_q, max_k, scale, causal):
    _inputs(q, k, v)
    seg = _segments(q, cu_q, cu_k, max_q, max_k)
    CALLS.append("fwd")
    return _MATH.forward(q, k, v, seg, causal=causal, scale=scale)


def _bwd(dout, q, k, v, out, lse, dq, dk, dv, cu_q, cu_k, max_q, max_k, scale, causal):
    _inputs(q, k, v)
    seg = _segments(q, cu_q, cu_k, max_q, max_k)
    assert lse.dtype == torch.float32 and lse.is_contiguous() and lse.shape == (H, q.shape[0])
    for buf, like in ((dq, q), (dk, k), (dv, v)):
        assert buf.shape == like.shape and buf.dtype == like.dtype and buf.is_contiguous()
    grads = _MATH.backward(dout, q, k, v, out, lse, seg, causal=causal, scale=scale)
    for buf, g in zip((dq, dk, dv), grads):
        buf.copy_(g)
    CALLS.append("bwd")
    return torch.zeros(H, q.shape[0] + 128 * seg.count)  # softmax_d


def _plain(dropout_p, softcap, alibi_slopes, window) -> None:
    assert dropout_p == 0.0 and softcap == 0.0 and alibi_slopes is None
    assert tuple(window) == (-1, -1)


# ---------------------------------------------------------------- flash-attn 2 fakes


def fa2_260_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                    softmax_scale, causal, window_size, softcap, alibi_slopes, return_softmax,
                    block_table):  # fmt: skip
    _plain(dropout_p, softcap, alibi_slopes, window_size)
    assert not return_softmax and block_table is None
    out, lse = _fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                    softmax_scale, causal)  # fmt: skip
    return out, q, k, v, out, lse, None, torch.empty(2)  # the LSE at index 5


def fa2_263_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                    softmax_scale, causal, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                    return_softmax=False, block_table=None, leftpad_k=None,
                    seqused_k=None):  # fmt: skip
    assert leftpad_k is None and seqused_k is None
    return fa2_260_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           return_softmax, block_table)  # fmt: skip


def fa2_26_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k,
                    max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal, window_size,
                    softcap, alibi_slopes, deterministic, rng_state=None):  # fmt: skip
    _plain(dropout_p, softcap, alibi_slopes, window_size)
    assert deterministic is False and rng_state is None
    d = _bwd(dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k,
             max_seqlen_q, max_seqlen_k, softmax_scale, causal)  # fmt: skip
    return dq, dk, dv, d


def fa2_270_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                    softmax_scale, causal, window_size_left=-1, window_size_right=-1,
                    softcap=0.0, alibi_slopes=None, return_softmax=False, block_table=None,
                    leftpad_k=None, seqused_k=None):  # fmt: skip
    _plain(dropout_p, softcap, alibi_slopes, (window_size_left, window_size_right))
    assert not return_softmax and block_table is None and leftpad_k is None and seqused_k is None
    out, lse = _fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                    softmax_scale, causal)  # fmt: skip
    return out, lse, torch.empty(0), torch.empty(2)


def fa2_270_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k,
                     max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal,
                     window_size_left, window_size_right, softcap, alibi_slopes, deterministic,
                     rng_state=None):  # fmt: skip
    _plain(dropout_p, softcap, alibi_slopes, (window_size_left, window_size_right))
    assert deterministic is False and rng_state is None
    return _bwd(dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k,
                max_seqlen_q, max_seqlen_k, softmax_scale, causal)  # fmt: skip


# 2.7.3-2.8.3: 2.7's signature + zero_tensors, wrapped in torch.library.custom_op (flash-attn
# does so when `torch.__version__ >= "2.4.0"`): only the schema knows the argument names
@torch.library.custom_op("fcp_fake_fa2::varlen_fwd", mutates_args=(), device_types="cpu")
def fa2_283_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float,
    softmax_scale: float,
    causal: bool,
    window_size_left: int = -1,
    window_size_right: int = -1,
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    return_softmax: bool = False,
    block_table: torch.Tensor | None = None,
    leftpad_k: torch.Tensor | None = None,
    seqused_k: torch.Tensor | None = None,
    zero_tensors: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    assert not zero_tensors
    return fa2_270_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p, softmax_scale, causal, window_size_left, window_size_right,
                           softcap, alibi_slopes, return_softmax, block_table, leftpad_k,
                           seqused_k)  # fmt: skip


@torch.library.custom_op(
    "fcp_fake_fa2::varlen_bwd", mutates_args=("dq", "dk", "dv"), device_types="cpu"
)
def fa2_283_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    softmax_lse: torch.Tensor,
    dq: torch.Tensor | None,
    dk: torch.Tensor | None,
    dv: torch.Tensor | None,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float,
    softmax_scale: float,
    causal: bool,
    window_size_left: int,
    window_size_right: int,
    softcap: float,
    alibi_slopes: torch.Tensor | None,
    deterministic: bool,
    rng_state: torch.Tensor | None = None,
    zero_tensors: bool = False,
) -> torch.Tensor:
    assert not zero_tensors
    return fa2_270_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q,
                            cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale,
                            causal, window_size_left, window_size_right, softcap, alibi_slopes,
                            deterministic, rng_state)  # fmt: skip


FA2 = {  # release: (version string, forward, backward)
    "2.6.0": ("2.6.0.post1", fa2_260_forward, fa2_26_backward),
    "2.6.3": ("2.6.3", fa2_263_forward, fa2_26_backward),
    "2.7.0": ("2.7.0.post2", fa2_270_forward, fa2_270_backward),
    "2.8.3": ("2.8.3", fa2_283_forward, fa2_283_backward),
}


def _fa2_module(release: str) -> types.ModuleType:
    mod = types.ModuleType("flash_attn.flash_attn_interface")
    _, mod._flash_attn_varlen_forward, mod._flash_attn_varlen_backward = FA2[release]  # type: ignore[attr-defined]
    return mod


# ---------------------------------------------------------------- FlashAttention-3 fakes

_FA3_NONE = ("k_new", "v_new", "qv", "cu_seqlens_k_new", "seqused_q", "seqused_k", "page_table",
             "kv_batch_idx", "leftpad_k", "rotary_cos", "rotary_sin", "seqlens_rotary",
             "q_descale", "k_descale", "v_descale")  # fmt: skip


def fa3_py_forward(q, k, v, k_new, v_new, qv, out, cu_seqlens_q, cu_seqlens_k, cu_seqlens_k_new,
                   seqused_q, seqused_k, max_seqlen_q, max_seqlen_k, page_table, kv_batch_idx,
                   leftpad_k, rotary_cos, rotary_sin, seqlens_rotary, q_descale, k_descale,
                   v_descale, softmax_scale, causal, window_size=(-1, -1), attention_chunk=0,
                   softcap=0.0, rotary_interleaved=True, scheduler_metadata=None, num_splits=1,
                   pack_gqa=None, sm_margin=0):  # fmt: skip
    unused = locals()
    assert all(unused[n] is None for n in (*_FA3_NONE, "out")), "features this kernel never uses"
    _plain(0.0, softcap, None, window_size)
    assert attention_chunk == 0 and scheduler_metadata is None and num_splits == 1
    o, lse = _fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                  softmax_scale, causal)  # fmt: skip
    return o, lse, torch.empty(0), torch.empty(0)


def fa3_py_backward(dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, sequed_q,
                    sequed_k, max_seqlen_q, max_seqlen_k, dq, dk, dv, softmax_scale, causal,
                    window_size=(-1, -1), softcap=0.0, deterministic=False,
                    sm_margin=0):  # fmt: skip
    assert sequed_q is None and sequed_k is None and deterministic is False
    _plain(0.0, softcap, None, window_size)
    d = _bwd(dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k,
             max_seqlen_q, max_seqlen_k, softmax_scale, causal)  # fmt: skip
    return dq, dk, dv, d


@torch.library.custom_op("fcp_fake_fa3::fwd", mutates_args=(), device_types="cpu")
def fa3_op_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_new: torch.Tensor | None = None,
    v_new: torch.Tensor | None = None,
    qv: torch.Tensor | None = None,
    out_: torch.Tensor | None = None,
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k: torch.Tensor | None = None,
    cu_seqlens_k_new: torch.Tensor | None = None,
    seqused_q: torch.Tensor | None = None,
    seqused_k: torch.Tensor | None = None,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    page_table: torch.Tensor | None = None,
    kv_batch_idx: torch.Tensor | None = None,
    leftpad_k: torch.Tensor | None = None,
    rotary_cos: torch.Tensor | None = None,
    rotary_sin: torch.Tensor | None = None,
    seqlens_rotary: torch.Tensor | None = None,
    q_descale: torch.Tensor | None = None,
    k_descale: torch.Tensor | None = None,
    v_descale: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size_left: int = -1,
    window_size_right: int = -1,
    attention_chunk: int = 0,
    softcap: float = 0.0,
    rotary_interleaved: bool = True,
    scheduler_metadata: torch.Tensor | None = None,
    num_splits: int = 1,
    pack_gqa: bool | None = None,
    sm_margin: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return fa3_py_forward(q, k, v, k_new, v_new, qv, out_, cu_seqlens_q, cu_seqlens_k,
                          cu_seqlens_k_new, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k,
                          page_table, kv_batch_idx, leftpad_k, rotary_cos, rotary_sin,
                          seqlens_rotary, q_descale, k_descale, v_descale, softmax_scale, causal,
                          (window_size_left, window_size_right), attention_chunk, softcap,
                          rotary_interleaved, scheduler_metadata, num_splits, pack_gqa,
                          sm_margin)  # fmt: skip


@torch.library.custom_op("fcp_fake_fa3::bwd", mutates_args=("dq", "dk", "dv"), device_types="cpu")
def fa3_op_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    softmax_lse: torch.Tensor,
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k: torch.Tensor | None = None,
    sequed_q: torch.Tensor | None = None,
    sequed_k: torch.Tensor | None = None,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    dq: torch.Tensor | None = None,
    dk: torch.Tensor | None = None,
    dv: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    is_causal: bool = False,
    window_size_left: int = -1,
    window_size_right: int = -1,
    softcap: float = 0.0,
    deterministic: bool = False,
    sm_margin: int = 0,
) -> torch.Tensor:
    return fa3_py_backward(dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, sequed_q,
                           sequed_k, max_seqlen_q, max_seqlen_k, dq, dk, dv, softmax_scale,
                           is_causal, (window_size_left, window_size_right), softcap,
                           deterministic, sm_margin)[3]  # fmt: skip


FA3 = {"python": (fa3_py_forward, fa3_py_backward), "custom-op": (fa3_op_forward, fa3_op_backward)}


def _fa3_module(family: str) -> types.ModuleType:
    mod = types.ModuleType("flash_attn_interface")
    mod._flash_attn_forward, mod._flash_attn_backward = FA3[family]  # type: ignore[attr-defined]
    return mod


# ---------------------------------------------------------------- tests


def _run(kernel, cu_q: list[int], cu_k: list[int], causal: bool) -> None:
    """Adapter vs TorchMathKernel on one bf16 GQA varlen buffer: forward, then the backward from
    the reference (global) out/LSE; identical results, one call each."""
    seg = Segments.of(cu_q, cu_k)
    g = torch.Generator().manual_seed(0)
    q, do = (torch.randn(cu_q[-1], H, D, generator=g).bfloat16() for _ in range(2))
    k, v = (torch.randn(cu_k[-1], H_KV, D, generator=g).bfloat16() for _ in range(2))
    kernel.check(dtype=q.dtype, head_dim=D, heads=H, kv_heads=H_KV)
    CALLS.clear()
    out, lse = kernel.forward(q, k, v, seg, causal=causal, scale=0.3)
    ref_out, ref_lse = _MATH.forward(q, k, v, seg, causal=causal, scale=0.3)
    assert out.dtype == q.dtype and lse.dtype == torch.float32 and lse.shape == (H, cu_q[-1])
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)
    grads = kernel.backward(do, q, k, v, ref_out, ref_lse, seg, causal=causal, scale=0.3)
    ref = _MATH.backward(do, q, k, v, ref_out, ref_lse, seg, causal=causal, scale=0.3)
    for name, a, b in zip(("dq", "dk", "dv"), grads, ref):
        assert a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b), name
    assert CALLS == ["fwd", "bwd"]


@pytest.mark.parametrize(("cu_q", "cu_k", "causal"), BUFFERS)
@pytest.mark.parametrize("release", list(FA2))
def test_flash_attn2_matches_torch_math(release: str, cu_q, cu_k, causal: bool) -> None:
    kernel = FlashAttnKernel(_fa2_module(release), version=FA2[release][0])
    _run(kernel, cu_q, cu_k, causal)


@pytest.mark.parametrize(("cu_q", "cu_k", "causal"), BUFFERS)
@pytest.mark.parametrize("family", list(FA3))
def test_flash_attn3_matches_torch_math(family: str, cu_q, cu_k, causal: bool) -> None:
    _run(FlashAttn3Kernel(_fa3_module(family)), cu_q, cu_k, causal)


def test_fakes_refuse_fp32() -> None:
    """The fakes, like flash-attn, refuse fp32 (so the comparisons above run real calls)."""
    seg = Segments.of([0, 4], [0, 4])
    q, k = torch.randn(4, H, D), torch.randn(4, H_KV, D)
    kernel = FlashAttnKernel(_fa2_module("2.7.0"), version="2.7.0")
    with pytest.raises(RuntimeError, match="fp16 and bf16"):
        kernel.forward(q, k, k, seg, causal=True, scale=1.0)


@pytest.mark.parametrize(
    "kernel",
    [
        FlashAttnKernel(_fa2_module("2.8.3"), version="2.8.3"),
        FlashAttn3Kernel(_fa3_module("python")),
    ],
    ids=["flash-attn", "flash-attn-3"],
)
def test_check_refuses_what_flash_attn_cannot_run(kernel) -> None:
    kernel.check(dtype=torch.bfloat16, head_dim=128, heads=32, kv_heads=8)
    kernel.check(dtype=torch.float16, head_dim=256, heads=4, kv_heads=4)
    with pytest.raises(KernelUnsupportedError, match=rf"{kernel.name}.*float32.*TorchMathKernel"):
        kernel.check(dtype=torch.float32, head_dim=64, heads=4, kv_heads=2)
    for bad in (12, 264, 0):
        with pytest.raises(KernelUnsupportedError, match=rf"{kernel.name}.*multiple of 8.*{bad}"):
            kernel.check(dtype=torch.bfloat16, head_dim=bad, heads=4, kv_heads=2)
    with pytest.raises(KernelUnsupportedError, match=rf"{kernel.name}.*H=4.*H_kv=3"):
        kernel.check(dtype=torch.bfloat16, head_dim=64, heads=4, kv_heads=3)


def test_version_to_api() -> None:
    assert flash_attn_api("2.8.3") == flash_attn_api("2.7.4.post1") == "2.7"
    assert flash_attn_api("2.8.3+cu12torch2.7cxx11abiTRUE") == flash_attn_api("2.10.0") == "2.7"
    assert flash_attn_api("2.6.3") == flash_attn_api("2.6.0.post1") == "2.6"
    for old in ("2.5.9.post1", "2.5rc1", "2.4.2", "1.0.9", "3.0.0b1", "", "dev", "2", "12.7"):
        assert flash_attn_api(old) is None, old


def test_load_flash_attn_refuses_before_2_6(monkeypatch: pytest.MonkeyPatch) -> None:
    top = types.ModuleType("flash_attn")
    mod = _fa2_module("2.7.0")
    monkeypatch.setitem(sys.modules, "flash_attn", top)
    monkeypatch.setitem(sys.modules, "flash_attn.flash_attn_interface", mod)
    for version, loaded in (("2.4.2", None), ("2.5.9.post1", None), ("2.6.3", mod), ("2.8.3", mod)):
        top.__version__ = version  # type: ignore[attr-defined]
        assert load_flash_attn() is loaded, version
    del mod._flash_attn_varlen_backward  # type: ignore[attr-defined]
    assert load_flash_attn() is None
    monkeypatch.setitem(sys.modules, "flash_attn", None)  # not installed
    assert load_flash_attn() is None


def test_kernel_refuses_versions_before_2_6() -> None:
    with pytest.raises(KernelUnsupportedError, match=r"flash-attn 2\.6.*'2\.5\.9'.*TorchFlash"):
        FlashAttnKernel(_fa2_module("2.6.3"), version="2.5.9")


def test_load_flash_attn3(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "flash_attn_interface", None)  # not installed
    assert load_flash_attn3() is None
    for family in FA3:
        mod = _fa3_module(family)
        monkeypatch.setitem(sys.modules, "flash_attn_interface", mod)
        assert load_flash_attn3() is mod, family

    def fwd_2024(q, k, v, softmax_scale, causal, window_size, descale_q=None, descale_k=None,
                 descale_v=None, gqa_parallel=False):  # fmt: skip
        raise AssertionError("never called")

    old = types.ModuleType("flash_attn_interface")
    old._flash_attn_forward, old._flash_attn_backward = fwd_2024, fwd_2024  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "flash_attn_interface", old)
    assert load_flash_attn3() is None  # the 2024 beta: no varlen arguments
    with pytest.raises(KernelUnsupportedError, match=r"flash-attn-3.*cu_seqlens_q"):
        FlashAttn3Kernel(old)


def test_flash_attn3_refuses_an_unknown_required_argument() -> None:
    def fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
            causal, new_thing):  # fmt: skip
        raise AssertionError("never called")

    mod = _fa3_module("python")
    mod._flash_attn_forward = fwd  # type: ignore[attr-defined]
    with pytest.raises(KernelUnsupportedError, match=r"flash-attn-3.*'new_thing'"):
        FlashAttn3Kernel(mod)
