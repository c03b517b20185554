"""A stand-in for TransformerEngine that follows its documented attention contract, for CPU tests.

TransformerEngine does not install on these CPU machines. `install()` puts a package named
`transformer_engine` into `sys.modules` (call it before megatron-core's TE extension is first
imported) whose `pytorch.DotProductAttention` does what TE's documents say of its THD context
parallelism, computed exactly and without TE's kernels:

- `set_context_parallel_group(cp_group, cp_global_ranks, cp_stream, cp_comm_type)` sets the group
  of the next call: one process group for "p2p" and "a2a", `[a2a_group, p2p_group]` for
  "a2a+p2p";
- inputs are THD shards in TE's DualChunkSwap layout: every sequence padded to a multiple of
  2 x cp_size (`cu_seqlens_*_padded`, unsharded offsets), member i holding chunks i and
  2 x cp_size - 1 - i, where i is the member's rank *inside the group* (sorted global order:
  `torch.distributed.get_rank(cp_group)`); for "a2a+p2p" i = p2p rank x a2a size + a2a rank;
- "a2a" and "a2a+p2p" need the heads and query groups divisible by the a2a group's size;
- the output is [tokens, heads x head_dim]; padding rows are 0.

The stand-in gathers every member's shard (autograd-aware all-gathers over the group(s) it was
given, in the group's own rank order), rebuilds each sequence from the chunks as TE numbers them,
computes dense attention and returns this member's rows. A caller that shards by another order
(an unsorted ring) gets wrong attention, which the parity tests catch. Every other TE name
megatron-core imports is a placeholder that refuses to be built.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["DotProductAttention", "install"]

CALLS: list[dict[str, Any]] = []  # what each forward was given (tests read it)


class _Anything(type(torch.nn.Module)):  # type: ignore[misc]
    """Attributes of the placeholder class are placeholders (`te.common.recipe.Format`...)."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder


class _Placeholder(torch.nn.Module, metaclass=_Anything):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("this TransformerEngine stand-in only provides DotProductAttention")


class _AllGather(torch.autograd.Function):
    """all_gather whose backward is an all-reduce (torch's own backward scatters from global
    rank 0, which a gloo group without rank 0 cannot do)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> tuple[torch.Tensor, ...]:  # type: ignore[override]
        ctx.group = group
        out = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(out, x.contiguous(), group=group)
        return tuple(out)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        g = torch.stack([x.contiguous() for x in grads])
        dist.all_reduce(g, group=ctx.group)
        return g[dist.get_rank(ctx.group)], None


def _gather(x: torch.Tensor, group: Any) -> list[torch.Tensor]:
    return list(_AllGather.apply(x, group))


class DotProductAttention(torch.nn.Module):
    """TE's `DotProductAttention` contract for THD inputs under context parallelism."""

    def __init__(
        self,
        num_attention_heads: int,
        kv_channels: Any,
        num_gqa_groups: int | None = None,
        attention_dropout: float = 0.0,
        qkv_format: str = "sbhd",
        attn_mask_type: str = "causal",
        cp_group: Any = None,
        cp_global_ranks: Any = None,
        cp_stream: Any = None,
        cp_comm_type: str = "p2p",
        softmax_scale: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        self.num_heads = num_attention_heads
        self.num_gqa_groups = num_gqa_groups or num_attention_heads
        self.kv_channels = kv_channels
        self.softmax_scale = softmax_scale
        self.qkv_format = qkv_format
        self.attn_mask_type = attn_mask_type
        if attention_dropout:
            raise ValueError("the stand-in has no dropout")
        self.set_context_parallel_group(cp_group, cp_global_ranks, cp_stream, cp_comm_type)

    def set_context_parallel_group(self, cp_group: Any, cp_global_ranks: Any, cp_stream: Any,
                                   cp_comm_type: str = "p2p") -> None:  # fmt: skip
        self.cp_group = cp_group
        self.cp_global_ranks = cp_global_ranks
        self.cp_stream = cp_stream
        self.cp_comm_type = cp_comm_type

    def _members(self) -> tuple[list[Any], int, int]:
        """(groups to gather over, innermost first; this member's chunk index; cp size)."""
        group, kind = self.cp_group, self.cp_comm_type
        if group is None:
            return [], 0, 1
        if kind == "a2a+p2p":
            assert isinstance(group, list) and len(group) == 2, "a2a+p2p needs [a2a, p2p]"
            a2a, p2p = group
            u, r = dist.get_world_size(a2a), dist.get_world_size(p2p)
            index = dist.get_rank(p2p) * u + dist.get_rank(a2a)
            size = u * r
            assert sorted(self.cp_global_ranks) == sorted(
                set(dist.get_process_group_ranks(a2a))
                | set(dist.get_process_group_ranks(p2p))
                | set(self.cp_global_ranks)
            ), "cp_global_ranks must be the whole CP group"
            return [a2a, p2p], index, size
        assert kind in ("p2p", "a2a"), f"cp_comm_type {kind!r}"
        assert not isinstance(group, list), f"{kind} takes one process group"
        ranks = dist.get_process_group_ranks(group)
        assert list(self.cp_global_ranks) == sorted(ranks), "cp_global_ranks: the group's ranks"
        return [group], dist.get_rank(group), dist.get_world_size(group)

    def forward(
        self,
        query_layer: torch.Tensor,
        key_layer: torch.Tensor,
        value_layer: torch.Tensor,
        attention_mask: Any = None,
        qkv_format: str | None = None,
        cu_seqlens_q: torch.Tensor | None = None,
        cu_seqlens_kv: torch.Tensor | None = None,
        cu_seqlens_q_padded: torch.Tensor | None = None,
        cu_seqlens_kv_padded: torch.Tensor | None = None,
        max_seqlen_q: int | None = None,
        max_seqlen_kv: int | None = None,
        attn_mask_type: str | None = None,
        pad_between_seqs: bool | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        fmt = qkv_format or self.qkv_format
        assert fmt == "thd", f"the stand-in runs THD only, got {fmt}"
        mask = attn_mask_type or self.attn_mask_type
        assert mask in ("padding_causal", "padding"), f"THD takes padding masks, got {mask}"
        assert cu_seqlens_q is not None and cu_seqlens_q_padded is not None
        assert cu_seqlens_q.device == query_layer.device, "TE reads cu_seqlens on the device"
        groups, index, size = self._members()
        heads, kv_heads = query_layer.shape[1], key_layer.shape[1]
        if self.cp_comm_type in ("a2a", "a2a+p2p") and groups:
            u = dist.get_world_size(groups[0])
            assert heads % u == 0 and kv_heads % u == 0, "a2a needs heads divisible by its size"
        CALLS.append({"comm_type": self.cp_comm_type, "size": size, "index": index,
                      "stream": self.cp_stream})  # fmt: skip
        cu = [int(x) for x in cu_seqlens_q.tolist()]
        cup = [int(x) for x in cu_seqlens_q_padded.tolist()]
        shards = [(query_layer, key_layer, value_layer)]
        for group in groups:  # innermost first: member order = outer rank x inner size + inner
            got = [[_gather(t, group) for t in s] for s in shards]
            shards = [
                tuple(got[i][t][j] for t in range(3))
                for j in range(dist.get_world_size(group))
                for i in range(len(shards))
            ]
        out = torch.zeros_like(query_layer)
        scale = self.softmax_scale or query_layer.shape[-1] ** -0.5
        chunks = 2 * size
        for j in range(len(cu) - 1):
            n, p = cu[j + 1] - cu[j], cup[j + 1] - cup[j]
            c, off = p // chunks, cup[j] // size
            full = []
            for t in range(3):
                pieces = [None] * chunks
                for m, s in enumerate(shards):
                    pieces[m] = s[t][off : off + c]
                    pieces[chunks - 1 - m] = s[t][off + c : off + 2 * c]
                full.append(torch.cat(pieces)[:n])
            q, k, v = full
            if n == 0:
                continue
            g = heads // kv_heads
            k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
            s_ = torch.einsum("qhd,khd->hqk", q.float(), k.float()) * scale
            if mask == "padding_causal":
                tri = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
                s_ = s_.masked_fill(~tri, float("-inf"))
            o = torch.einsum("hqk,khd->qhd", s_.softmax(-1), v.float()).to(q.dtype)
            padded = torch.cat([o, o.new_zeros(p - n, *o.shape[1:])])
            mine = torch.cat([padded[index * c : (index + 1) * c],
                              padded[(chunks - 1 - index) * c : (chunks - index) * c]])  # fmt: skip
            out = out.index_copy(0, torch.arange(off, off + 2 * c, device=out.device), mine)
        return out.reshape(out.shape[0], -1)


class _Module(types.ModuleType):
    """A TE submodule whose unknown names are placeholders (megatron subclasses many)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder


def _no_offload(enabled: bool, *args: Any, **kwargs: Any) -> tuple[Any, None]:
    """TE's `get_cpu_offload_context` with offloading off: megatron builds every block with it."""
    assert not enabled, "the stand-in does not offload"
    return contextlib.nullcontext(), None


class _SplitAlongDim:
    """TE's `_SplitAlongDim.apply(x, dim, sizes)`: megatron splits the fused QKV with it."""

    @staticmethod
    def apply(x: torch.Tensor, dim: int, sizes: list[int]) -> tuple[torch.Tensor, ...]:
        return torch.split(x, sizes, dim=dim)


# what megatron-core calls of TE while building and running a model with TE's attention
_PROVIDED: dict[str, dict[str, Any]] = {
    "transformer_engine.pytorch": {"DotProductAttention": DotProductAttention},
    "transformer_engine.pytorch.cpu_offload": {"get_cpu_offload_context": _no_offload},
    "transformer_engine.pytorch.attention": {"_SplitAlongDim": _SplitAlongDim},
}


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Makes any `transformer_engine.*` submodule a `_Module` on import."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name == "transformer_engine" or name.startswith("transformer_engine."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        mod = _Module(spec.name)
        mod.__path__ = []  # type: ignore[attr-defined]  # a package: submodules resolve
        if spec.name == "transformer_engine":
            mod.__version__ = "2.9.0"  # type: ignore[attr-defined]
        for attr, value in _PROVIDED.get(spec.name, {}).items():
            setattr(mod, attr, value)
        return mod

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def install() -> None:
    """Put the stand-in in front of every `transformer_engine` import (idempotent)."""
    if any(isinstance(f, _Finder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _Finder())
