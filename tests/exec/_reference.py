"""Single-process float64 reference attention and pack builders shared by the exec tests."""

from __future__ import annotations

import torch

from fcp_exec.layout import local_token_index

__all__ = ["Pack", "make_pack", "reference_attention", "shard"]


class Pack:
    """A random packed batch: unsharded padded q/k/v/dout plus its cu_seqlens."""

    def __init__(
        self,
        seqlens: list[int],
        degree: int,
        causal: list[bool],
        heads: int,
        kv_heads: int,
        dim: int,
        seed: int,
        dtype: torch.dtype,
    ) -> None:
        chunk = 2 * degree
        padded = [-(-n // chunk) * chunk if n else chunk for n in seqlens]
        self.seqlens, self.padded, self.causal, self.degree = seqlens, padded, causal, degree
        self.cu = torch.tensor([0, *torch.tensor(seqlens).cumsum(0).tolist()], dtype=torch.int32)
        self.cu_padded = torch.tensor(
            [0, *torch.tensor(padded).cumsum(0).tolist()], dtype=torch.int32
        )
        total = sum(padded)
        g = torch.Generator().manual_seed(seed)
        self.q = torch.randn(total, heads, dim, generator=g).to(dtype)
        self.k = torch.randn(total, kv_heads, dim, generator=g).to(dtype)
        self.v = torch.randn(total, kv_heads, dim, generator=g).to(dtype)
        self.dout = torch.randn(total, heads, dim, generator=g).to(dtype)
        self.real = torch.zeros(total, dtype=torch.bool)
        for a, n in zip(self.cu_padded[:-1].tolist(), seqlens):
            self.real[a : a + n] = True


def make_pack(
    seed: int, degree: int, mode: str, *, gqa: bool, dtype: torch.dtype = torch.float32
) -> Pack:
    """Lengths include 1, values not divisible by 2d, and one longer sequence."""
    g = torch.Generator().manual_seed(seed + 1000)
    n = int(torch.randint(2, 5, (1,), generator=g))
    lens = [1, 2 * degree + 1, *torch.randint(2, 40, (n,), generator=g).tolist()]
    if mode == "causal":
        causal = [True] * len(lens)
    elif mode == "full":
        causal = [False] * len(lens)
    else:
        causal = [bool(i % 2) for i in range(len(lens))]
    return Pack(lens, degree, causal, 4, 2 if gqa else 4, 8, seed, dtype)


def reference_attention(
    pack: Pack, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
) -> torch.Tensor:
    """Dense per-sequence attention in q's dtype over real tokens; padding rows are 0."""
    groups = q.shape[1] // k.shape[1]
    out = torch.zeros_like(q)
    for a, n, c in zip(pack.cu_padded[:-1].tolist(), pack.seqlens, pack.causal):
        if n == 0:
            continue
        qs = q[a : a + n].transpose(0, 1)
        ks = k[a : a + n].repeat_interleave(groups, dim=1).transpose(0, 1)
        vs = v[a : a + n].repeat_interleave(groups, dim=1).transpose(0, 1)
        s = qs @ ks.transpose(1, 2) * scale
        if c:
            mask = torch.ones(n, n, dtype=torch.bool).tril()
            s = s.masked_fill(~mask, float("-inf"))
        out[a : a + n] = (s.softmax(-1) @ vs).transpose(0, 1)
    return out


def shard(x: torch.Tensor, pack: Pack, index: int) -> torch.Tensor:
    """Member `index`'s zigzag shard of a padded unsharded tensor."""
    return x[local_token_index(pack.cu_padded, pack.degree, index)]
