"""The varlen attention kernel contract shared by every device.

Ring attention needs two things a stock attention call does not give: the log-sum-exp of every
row (to merge the results of ring steps exactly) and a backward that takes the *global* output
and LSE (so that the gradients of the steps sum to the exact gradient). Every kernel here takes
a whole packed buffer at once, flash-attn's varlen layout: q [T_q, H, D], k/v [T_k, H_kv, D]
(GQA native: H a multiple of H_kv, never expanded by the caller) and cumulative segment offsets
`cu_q` / `cu_k` (int32, one segment per sequence piece). One call covers every sequence of a
micro-batch, so the host cost of a layer does not grow with the number of sequences.

What callers guarantee (`fcp_exec.schedule` builds every call this way), so that kernels need no
special cases for empty rows, whose LSE conventions differ (flash-attn writes +inf, torch's CPU
kernel 0):
- every segment has at least one query row and one key, or neither;
- a causal call's segments are square (q length == k length), where the top-left and the
  bottom-right causal masks agree;
- q covers rows [0, cu_q[-1]) and k rows [0, cu_k[-1]) exactly.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from fcp_data.errors import ConfigError

__all__ = ["AttentionKernel", "KernelUnsupportedError", "Segments"]


class KernelUnsupportedError(ConfigError):
    """A kernel cannot run these blocks (dtype, head dim, GQA ratio, window, missing package);
    the message names the kernel, the value and the alternative. Raised before the first step."""


@dataclass(frozen=True, slots=True)
class Segments:
    """The varlen description of one kernel call: device offsets for the kernel, the same
    offsets on the host for kernels that loop or take lists (CPU, Ascend's TND layout).

    Built once per micro-batch by `fcp_exec.schedule` and reused by every layer, so no kernel
    call reads anything back from the device.
    """

    cu_q: torch.Tensor  # int32 [n + 1] on the tensors' device
    cu_k: torch.Tensor
    max_q: int
    max_k: int
    host_q: tuple[int, ...]
    host_k: tuple[int, ...]

    @property
    def count(self) -> int:
        return len(self.host_q) - 1

    @classmethod
    def of(
        cls, cu_q: Sequence[int], cu_k: Sequence[int], device: torch.device | str = "cpu"
    ) -> Segments:
        """Segments from host offsets (one small copy each; the schedule batches its copies)."""
        hq, hk = tuple(int(x) for x in cu_q), tuple(int(x) for x in cu_k)
        if len(hq) != len(hk) or len(hq) < 1:
            raise ConfigError(f"cu_q has {len(hq)} offsets and cu_k {len(hk)}: give both n + 1")
        lens_q = [b - a for a, b in itertools.pairwise(hq)]
        lens_k = [b - a for a, b in itertools.pairwise(hk)]
        return cls(
            cu_q=torch.tensor(hq, dtype=torch.int32, device=device),
            cu_k=torch.tensor(hk, dtype=torch.int32, device=device),
            max_q=max(lens_q, default=0),
            max_k=max(lens_k, default=0),
            host_q=hq,
            host_k=hk,
        )


class AttentionKernel(Protocol):
    """One varlen call forward -> (out [T_q, H, D] in q's dtype, lse [H, T_q] fp32); backward
    from the *global* out/lse -> (dq [T_q, H, D], dk [T_k, H_kv, D], dv) in the inputs' dtype."""

    name: str

    def check(self, *, dtype: torch.dtype, head_dim: int, heads: int, kv_heads: int) -> None:
        """KernelUnsupportedError unless this kernel runs blocks of this kind."""
        ...

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        seg: Segments,
        *,
        causal: bool,
        scale: float,
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

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
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...


def check_gqa(name: str, heads: int, kv_heads: int) -> None:
    """The GQA rule every kernel shares: H a positive multiple of H_kv."""
    if kv_heads < 1 or heads % kv_heads:
        raise KernelUnsupportedError(
            f"kernel {name!r}: H={heads} query heads is not a multiple of H_kv={kv_heads} "
            "key/value heads; GQA needs num_attention_heads % num_key_value_heads == 0"
        )
