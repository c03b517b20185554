"""CUDA kernel on flash-attn 2 (2.5 or later), with the plain torch path for what it cannot do.

flash-attn's forward returns the fp32 LSE [B, H, S] and its backward accepts an arbitrary
(global) out/LSE pair, which is all ring attention needs. Three traps a GPU run would hit:

- the private `_flash_attn_forward/_backward` changed signature in 2.7: 2.5-2.6 take
  `window_size=(left, right)` and the forward returns 8 values (LSE at index 5); 2.7+ take
  `window_size_left/right` and return 4 (LSE at index 1). 2.6 added `softcap`. The installed
  version (`flash_attn.__version__`) picks the call; a custom-op wrapper hides the Python
  signature, so it cannot be read from `inspect.signature`;
- flash-attn only runs fp16/bf16 with head_dim a multiple of 8 and <= 256: fp32 blocks (the
  exactness tests, fp32 training) go to `TorchMathKernel` instead of raising;
- the causal mask is bottom-right aligned when Sq != Sk; ring attention only asks for causal
  on square diagonal blocks, where both alignments agree.

Not run in this repository's CI (no GPU there); a mocked flash-attn checks the calls on CPU and
`bench/device_suite.py` checks the numbers on a GPU.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import torch

from fcp_exec.kernels.torch_math import TorchMathKernel

__all__ = ["FlashAttnKernel", "flash_attn_api", "load_flash_attn"]

_HALF = (torch.float16, torch.bfloat16)


def flash_attn_api(version: str) -> str | None:
    """'2.7' (window_size_left/right), '2.6' (window_size + softcap), '2.5' (window_size, no
    softcap) for a flash-attn version string, or None when older than 2.5 or not 2.x."""
    parts = version.split(".")
    try:
        major, minor = int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or "0")
    except (IndexError, ValueError):
        return None
    if major != 2 or minor < 5:
        return None
    return "2.7" if minor >= 7 else f"2.{minor}"


def load_flash_attn() -> ModuleType | None:
    """flash_attn.flash_attn_interface when a usable 2.x (>= 2.5) is installed, else None."""
    try:
        top = importlib.import_module("flash_attn")
        mod = importlib.import_module("flash_attn.flash_attn_interface")
    except ImportError:
        return None
    if not hasattr(mod, "_flash_attn_forward") or not hasattr(mod, "_flash_attn_backward"):
        return None
    if flash_attn_api(str(getattr(top, "__version__", ""))) is None:
        return None
    return mod


class FlashAttnKernel:
    """flash-attn 2 dense kernel on one block ([S, H, D] -> batch of one)."""

    name = "flash-attn"

    def __init__(self, module: ModuleType, version: str | None = None) -> None:
        self._fa = module
        if version is None:
            version = str(getattr(importlib.import_module("flash_attn"), "__version__", ""))
        api = flash_attn_api(version)
        if api is None:
            raise ValueError(f"flash-attn {version!r} is not supported; install flash-attn>=2.5")
        self.api = api
        self._fallback = TorchMathKernel()

    def supports(self, q: torch.Tensor) -> bool:
        """Whether flash-attn can run this block (fp16/bf16, head_dim % 8 == 0, <= 256); the
        kernel is only selected for CUDA tensors, so the device is not checked here."""
        d = q.shape[-1]
        return q.dtype in _HALF and d % 8 == 0 and d <= 256

    def _window(self) -> dict[str, object]:
        if self.api == "2.7":
            return {"window_size_left": -1, "window_size_right": -1, "softcap": 0.0}
        if self.api == "2.6":
            return {"window_size": (-1, -1), "softcap": 0.0}
        return {"window_size": (-1, -1)}

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, scale: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.supports(q):
            return self._fallback.forward(q, k, v, causal=causal, scale=scale)
        res = self._fa._flash_attn_forward(
            q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), 0.0, scale, causal,
            alibi_slopes=None, return_softmax=False, **self._window(),
        )  # fmt: skip
        out, lse = (res[0], res[1]) if self.api == "2.7" else (res[0], res[5])
        return out.squeeze(0), lse.squeeze(0)

    def backward(
        self,
        dout: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        out: torch.Tensor,
        lse: torch.Tensor,
        *,
        causal: bool,
        scale: float,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if not self.supports(q):
            return self._fallback.backward(dout, q, k, v, out, lse, causal=causal, scale=scale)
        # flash-attn writes into dq/dk/dv: fresh contiguous buffers, never views of q/k/v
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        self._fa._flash_attn_backward(
            dout.contiguous().unsqueeze(0), q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0),
            out.contiguous().unsqueeze(0), lse.float().contiguous().unsqueeze(0),
            dq.unsqueeze(0), dk.unsqueeze(0), dv.unsqueeze(0), 0.0, scale, causal,
            alibi_slopes=None, deterministic=False, rng_state=None, **self._window(),
        )  # fmt: skip
        return dq, dk, dv
