"""CUDA kernels on the flash-attn packages: FlashAttention-2 (2.6-2.8) and FlashAttention-3.

Both take a whole varlen buffer per call through their private functions, which (unlike the
public autograd functions) return the LSE and run a backward from any (out, LSE) pair, the
global one of ring attention included. Signatures were read in Dao-AILab/flash-attention.

flash-attn 2, `flash_attn.flash_attn_interface._flash_attn_varlen_forward/_backward`:
- the fixed head of every version: forward (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
  max_seqlen_k, dropout_p, softmax_scale, causal, ...), backward (dout, q, k, v, out,
  softmax_lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
  softmax_scale, causal, ...); the backward writes into the dq/dk/dv buffers it is given;
- 2.6.x: `window_size=(left, right)`, `softcap`, `alibi_slopes`, `return_softmax`,
  `block_table` (a required positional in 2.6.0 and 2.5.7-2.5.9); the forward returns 8 values,
  the LSE at index 5;
- 2.7+: `window_size_left` / `window_size_right` instead of the tuple (2.7.3 adds
  `zero_tensors`), the forward returns 4 values, the LSE at index 1. The functions become
  `torch.library.custom_op`s whose Python signature is `(*args, **kwargs)`, so the installed
  version (`flash_attn.__version__`) picks the call, never `inspect.signature`.
Everything after the fixed head goes by keyword: a wrong name raises (TypeError for a Python
function, "Unknown keyword argument" for a custom op) instead of landing in the wrong slot.

Minimum 2.6: the varlen LSE is [H, total_q] ("unpadded", flash-attn PR #970) only from 2.6.0;
2.5.x returns a padded [B, H, max_q] that the backward also expects, and its 2.5.0-2.5.6 and
2.5.7+ forwards differ by `block_table`. Converting both ways costs index tensors per call for
a release line that predates torch's own varlen kernels, so 2.5 is refused instead.

FlashAttention-3 (the `hopper/` folder, installed as the top-level module
`flash_attn_interface`): one `_flash_attn_forward` / `_flash_attn_backward` pair takes
`cu_seqlens_q/k` + `max_seqlen_q/k` for varlen since the 2025-01 rewrite (before it, no varlen
arguments at all: `load_flash_attn3` refuses that interface). The forward returns (out, lse,
...) with the varlen LSE [H, total_q]. Two families differ in names:
- plain Python functions (2025-01 to 2025-12): every optional tensor is a required positional,
  `window_size=(-1, -1)` and backward `causal`;
- custom ops (since 2025-12): defaults everywhere, `window_size_left/right`, forward `out_`,
  backward `is_causal`.
The kernel reads the argument names once (the function's signature, or the op's schema for a
custom op), passes None for the features it does not use (paged KV, rotary, fp8 descales...)
and everything by keyword, and refuses an interface with a required argument it does not know.

Causal: callers only ask for causal on square segments (`fcp_exec.kernels.base`), where
flash-attn's bottom-right causal mask equals the top-left one. fp32 blocks are refused by
`check` (flash-attn runs fp16/bf16 only); there is no silent fallback to another kernel.
Not run in this repository's CI (no GPU there): fakes with each release's exact signature
check the calls on CPU.
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from fcp_exec.kernels.base import KernelUnsupportedError, Segments, check_gqa

__all__ = [
    "FlashAttn3Kernel",
    "FlashAttnKernel",
    "flash_attn_api",
    "load_flash_attn",
    "load_flash_attn3",
]

_HALF = (torch.float16, torch.bfloat16)

# FA3 arguments for features this kernel never uses, all passed as None (names of every
# release from 2025-01 on; `sequed_*` is FA3's own spelling in the backward)
_FA3_UNUSED = (
    "k_new", "v_new", "qv", "out", "out_", "cu_seqlens_k_new", "seqused_q", "seqused_k",
    "sequed_q", "sequed_k", "page_table", "kv_batch_idx", "leftpad_k", "rotary_cos",
    "rotary_sin", "seqlens_rotary", "q_descale", "k_descale", "v_descale",
)  # fmt: skip


def flash_attn_api(version: str) -> str | None:
    """'2.7' (2.7 and later 2.x: window_size_left/right, 4 forward outputs) or '2.6'
    (window_size tuple + softcap, 8 forward outputs) for a flash-attn version string; None
    before 2.6 (padded varlen LSE) or outside 2.x."""
    m = re.match(r"(\d+)\.(\d+)", version)
    if m is None or m[1] != "2" or int(m[2]) < 6:
        return None
    return "2.7" if int(m[2]) >= 7 else "2.6"


def load_flash_attn() -> ModuleType | None:
    """flash_attn.flash_attn_interface when flash-attn 2.6 or later 2.x is installed, else None."""
    try:
        top = importlib.import_module("flash_attn")
        mod = importlib.import_module("flash_attn.flash_attn_interface")
    except ImportError:
        return None
    if not all(
        hasattr(mod, f) for f in ("_flash_attn_varlen_forward", "_flash_attn_varlen_backward")
    ):
        return None
    if flash_attn_api(str(getattr(top, "__version__", ""))) is None:
        return None
    return mod


def _params(fn: Callable[..., Any]) -> dict[str, bool]:
    """Argument name -> required, in order, for a Python function or a torch custom op (whose
    Python signature is `(*args, **kwargs)`: the names are in its schema)."""
    op = getattr(fn, "_opoverload", None)  # torch.library.custom_op's CustomOpDef
    schema = getattr(op if op is not None else fn, "_schema", None)
    if schema is not None:
        return {a.name: not a.has_default_value() for a in schema.arguments}
    sig = inspect.signature(fn)
    return {n: p.default is inspect.Parameter.empty for n, p in sig.parameters.items()}


def load_flash_attn3() -> ModuleType | None:
    """The FlashAttention-3 module `flash_attn_interface` when installed with the varlen-capable
    interface (2025 on), else None."""
    try:
        mod = importlib.import_module("flash_attn_interface")
    except ImportError:
        return None
    fwd = getattr(mod, "_flash_attn_forward", None)
    if fwd is None or not hasattr(mod, "_flash_attn_backward"):
        return None
    try:
        return mod if "cu_seqlens_q" in _params(fwd) else None
    except (TypeError, ValueError):  # no readable signature: not an FA3 interface we know
        return None


def _check_half(name: str, dtype: torch.dtype, head_dim: int, max_dim: int) -> None:
    if dtype not in _HALF:
        raise KernelUnsupportedError(
            f"kernel {name!r} runs fp16/bf16, got {dtype}: train in bf16 (autocast or "
            "params_dtype=torch.bfloat16), or pass kernel=TorchMathKernel() for small fp32 "
            "blocks (explicit scores, O(S^2) memory)"
        )
    if head_dim % 8 or not 0 < head_dim <= max_dim:
        raise KernelUnsupportedError(
            f"kernel {name!r} runs head_dim a multiple of 8 up to {max_dim}, got {head_dim}: "
            "pad the head dim or pass kernel=TorchMathKernel() for small blocks"
        )


class FlashAttnKernel:
    """flash-attn 2 on one varlen buffer per call (GQA native: K/V keep their H_kv heads)."""

    name = "flash-attn"

    def __init__(self, module: ModuleType, version: str | None = None) -> None:
        self._fa = module
        if version is None:
            version = str(getattr(importlib.import_module("flash_attn"), "__version__", ""))
        api = flash_attn_api(version)
        if api is None:
            raise KernelUnsupportedError(
                f"kernel {self.name!r} needs flash-attn 2.6 to 2.x, found {version!r}: "
                "pip install 'flash-attn>=2.6', or use torch's own flash kernels "
                "(kernel=TorchFlashKernel())"
            )
        self.api = api

    def check(self, *, dtype: torch.dtype, head_dim: int, heads: int, kv_heads: int) -> None:
        check_gqa(self.name, heads, kv_heads)
        _check_half(self.name, dtype, head_dim, 256)

    def _options(self) -> dict[str, Any]:
        """The keyword tail that differs between 2.6 and 2.7+ (no window, no softcap)."""
        if self.api == "2.7":
            return {"window_size_left": -1, "window_size_right": -1, "softcap": 0.0}
        return {"window_size": (-1, -1), "softcap": 0.0}

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        seg: Segments,
        *,
        causal: bool,
        scale: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        res = self._fa._flash_attn_varlen_forward(
            q,
            k,
            v,
            seg.cu_q,
            seg.cu_k,
            seg.max_q,
            seg.max_k,
            dropout_p=0.0,
            softmax_scale=scale,
            causal=causal,
            alibi_slopes=None,
            return_softmax=False,
            block_table=None,
            **self._options(),
        )
        return res[0], (res[1] if self.api == "2.7" else res[5])

    def backward(
        self,
        dout: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        out: torch.Tensor,
        lse: torch.Tensor,
        seg: Segments,
        *,
        causal: bool,
        scale: float,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # flash-attn writes into dq/dk/dv: fresh contiguous buffers, never views of q/k/v
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        self._fa._flash_attn_varlen_backward(
            dout.contiguous(),
            q,
            k,
            v,
            out.contiguous(),
            lse.float().contiguous(),
            dq,
            dk,
            dv,
            seg.cu_q,
            seg.cu_k,
            seg.max_q,
            seg.max_k,
            dropout_p=0.0,
            softmax_scale=scale,
            causal=causal,
            alibi_slopes=None,
            deterministic=torch.are_deterministic_algorithms_enabled(),
            rng_state=None,
            **self._options(),
        )
        return dq, dk, dv


class FlashAttn3Kernel:
    """FlashAttention-3 (Hopper; recent builds also sm80+) on one varlen buffer per call."""

    name = "flash-attn-3"

    def __init__(self, module: ModuleType) -> None:
        self._fa = module
        fwd, bwd = _params(module._flash_attn_forward), _params(module._flash_attn_backward)
        if "cu_seqlens_q" not in fwd or "cu_seqlens_q" not in bwd:
            raise KernelUnsupportedError(
                f"kernel {self.name!r} needs the varlen FlashAttention-3 interface (2025 on), "
                "this flash_attn_interface has no cu_seqlens_q: update FlashAttention-3 "
                "(hopper/ of flash-attention) or use kernel=FlashAttnKernel() / "
                "kernel=TorchFlashKernel()"
            )
        given = {
            "q",
            "k",
            "v",
            "cu_seqlens_q",
            "cu_seqlens_k",
            "max_seqlen_q",
            "max_seqlen_k",
            "softmax_scale",
        }
        self._fwd_unused = self._unused(fwd, given | {"causal"})
        # the backward's causal flag is `causal` in the Python family, `is_causal` in custom ops
        self._causal_arg = "is_causal" if "is_causal" in bwd else "causal"
        self._bwd_unused = self._unused(
            bwd, given | {"dout", "out", "softmax_lse", "dq", "dk", "dv", self._causal_arg}
        )

    def _unused(self, params: dict[str, bool], given: set[str]) -> dict[str, None]:
        """None for every unused-feature argument present; refuses unknown required ones."""
        unused = {n: None for n in _FA3_UNUSED if n in params and n not in given}
        for n, required in params.items():
            if required and n not in given and n not in unused:
                raise KernelUnsupportedError(
                    f"kernel {self.name!r}: this FlashAttention-3 interface requires argument "
                    f"{n!r}, which this adapter does not know: use a FlashAttention-3 release "
                    "from 2025 on, or kernel=FlashAttnKernel() / kernel=TorchFlashKernel()"
                )
        return unused

    def check(self, *, dtype: torch.dtype, head_dim: int, heads: int, kv_heads: int) -> None:
        check_gqa(self.name, heads, kv_heads)
        # fp8 runs forward only; 256 is the largest head dim of a full build (a build without
        # the hdim256 kernels refuses at the first call)
        _check_half(self.name, dtype, head_dim, 256)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        seg: Segments,
        *,
        causal: bool,
        scale: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        res = self._fa._flash_attn_forward(
            q,
            k,
            v,
            cu_seqlens_q=seg.cu_q,
            cu_seqlens_k=seg.cu_k,
            max_seqlen_q=seg.max_q,
            max_seqlen_k=seg.max_k,
            softmax_scale=scale,
            causal=causal,
            **self._fwd_unused,
        )
        return res[0], res[1]

    def backward(
        self,
        dout: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        out: torch.Tensor,
        lse: torch.Tensor,
        seg: Segments,
        *,
        causal: bool,
        scale: float,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        self._fa._flash_attn_backward(
            dout.contiguous(),
            q,
            k,
            v,
            out.contiguous(),
            lse.float().contiguous(),
            cu_seqlens_q=seg.cu_q,
            cu_seqlens_k=seg.cu_k,
            max_seqlen_q=seg.max_q,
            max_seqlen_k=seg.max_k,
            dq=dq,
            dk=dk,
            dv=dv,
            softmax_scale=scale,
            deterministic=torch.are_deterministic_algorithms_enabled(),
            **{self._causal_arg: causal},
            **self._bwd_unused,
        )
        return dq, dk, dv
