"""Ring attention against a float64 reference: one case = one pack on one ring of d members.

A pack mixes lengths 1, 2d+1 (not a multiple of 2d: padding), a few hundred and, on a GPU,
about 2k tokens; modes are causal, full (bidirectional) and mixed (alternating per sequence);
GQA packs have 4 query heads per KV head. Every member shards the same pack (seeded), runs
fcp's `ring_attention` forward + backward, and compares its shard of out, dq, dk, dv with the
same shard of a float64 dense per-sequence reference computed from the identically rounded
inputs. Errors are max |got - ref| and that over max |ref| (a norm-wise relative error), reduced
with MAX over the ring. Tolerances (relative): fp32 1e-4, bf16 2.5e-2 (bf16 keeps 8 bits).
Cases with `ulysses` u > 1 run the head-parallel transports of `fcp_exec.ulysses` on the same
shards (u = d: all-to-all; 1 < u < d: hybrid u x r), on mixed packs, MHA and GQA (with K/V
replication when u exceeds the K/V heads).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from fcp_exec import ring_attention
from fcp_exec.a2a import A2AComm
from fcp_exec.kernels import AttentionKernel, TorchMathKernel, select_kernel
from fcp_exec.layout import ShardLayout, local_token_index
from fcp_exec.ring import RingComm
from fcp_exec.ulysses import hybrid_attention

__all__ = ["TOLERANCE", "Case", "a2a_blocks", "make_cases", "reference", "run_case", "summarise"]

TOLERANCE = {"float32": 1e-4, "bfloat16": 2.5e-2}
FIELDS = ("out", "dq", "dk", "dv")


@dataclass(kw_only=True, slots=True, frozen=True)
class Case:
    degree: int
    dtype: str
    mode: str  # causal | full | mixed
    gqa: bool
    seqlens: tuple[int, ...]
    heads: int
    head_dim: int
    seed: int
    ulysses: int = 1  # the transport: 1 ring, d all-to-all, else hybrid u x (d / u)

    @property
    def kv_heads(self) -> int:
        return self.heads // 4 if self.gqa else self.heads

    def causal_flags(self) -> list[bool]:
        if self.mode == "mixed":
            return [bool(i % 2 == 0) for i in range(len(self.seqlens))]
        return [self.mode == "causal"] * len(self.seqlens)


def make_cases(degrees: list[int], *, tiny: bool) -> list[Case]:
    """fp32 and bf16 x causal/full/mixed for each degree; GQA on causal and mixed packs.

    `tiny` (the CPU dry run, which must stay fast on a loaded CI box): mixed packs only, fp32
    with GQA and bf16 without; a mixed pack holds causal and full sequences side by side."""
    heads, dim = (4, 8) if tiny else (8, 128)
    modes = ("mixed",) if tiny else ("causal", "full", "mixed")
    out = []
    for d in degrees:
        long = (7, 19) if tiny else (333, 2053)
        for dtype in ("float32", "bfloat16"):
            for mode in modes:
                gqa = dtype == "float32" if tiny else mode != "full"
                out.append(Case(degree=d, dtype=dtype, mode=mode, gqa=gqa,
                                seqlens=(1, 2 * d + 1, *long), heads=heads, head_dim=dim,
                                seed=len(out)))  # fmt: skip
        for u in (x for x in range(2, d + 1) if d % x == 0 and heads % x == 0):
            for dtype in ("float32", "bfloat16"):  # mixed packs: causal and full side by side
                out.append(Case(degree=d, dtype=dtype, mode="mixed", gqa=dtype == "float32",
                                seqlens=(1, 2 * d + 1, *long), heads=heads, head_dim=dim,
                                seed=len(out), ulysses=u))  # fmt: skip
    return out


def a2a_blocks(cases: list[Case]) -> list[tuple[int, ...]]:
    """Every all-to-all block the hybrid cases need (rings are range(d)), in a fixed order:
    each rank creates their process groups, the same calls in the same order."""
    blocks: dict[tuple[int, ...], None] = {}
    for c in cases:
        if c.ulysses > 1:
            for j in range(0, c.degree, c.ulysses):
                blocks[tuple(range(j, j + c.ulysses))] = None
    return list(blocks)


def _padded(case: Case) -> list[int]:
    chunk = 2 * case.degree
    return [-(-n // chunk) * chunk for n in case.seqlens]


def _inputs(case: Case, device: torch.device) -> dict[str, Any]:
    padded = _padded(case)
    total = sum(padded)
    g = torch.Generator().manual_seed(case.seed)
    dt = getattr(torch, case.dtype)
    shapes = {"q": case.heads, "k": case.kv_heads, "v": case.kv_heads, "do": case.heads}
    t = {n: torch.randn(total, h, case.head_dim, generator=g).to(dt) for n, h in shapes.items()}
    cu = [0]
    cup = [0]
    for n, p in zip(case.seqlens, padded):
        cu.append(cu[-1] + n)
        cup.append(cup[-1] + p)
    return {**{n: x.to(device) for n, x in t.items()}, "cu": cu, "cu_padded": cup}


def reference(case: Case, x: dict[str, Any], scale: float) -> dict[str, torch.Tensor]:
    """Float64 dense attention per sequence (real tokens only) and its gradients."""
    q, k, v = (x[n].double().requires_grad_() for n in ("q", "k", "v"))
    groups = case.heads // case.kv_heads
    out = torch.zeros_like(q)
    for a, n, c in zip(x["cu_padded"][:-1], case.seqlens, case.causal_flags()):
        qs = q[a : a + n].transpose(0, 1)
        ks = k[a : a + n].repeat_interleave(groups, dim=1).transpose(0, 1)
        vs = v[a : a + n].repeat_interleave(groups, dim=1).transpose(0, 1)
        s = qs @ ks.transpose(1, 2) * scale
        if c:
            mask = torch.ones(n, n, dtype=torch.bool, device=s.device).tril()
            s = s.masked_fill(~mask, float("-inf"))
        out[a : a + n] = (s.softmax(-1) @ vs).transpose(0, 1)
    out.backward(x["do"].double())
    assert q.grad is not None and k.grad is not None and v.grad is not None
    return {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


def case_kernel(case: Case, device: torch.device, ulysses: int = 1) -> AttentionKernel:
    """The kernel a case runs: the device's choice, or explicit scores for fp32 on CUDA (the
    flash kernels run fp16/bf16 only; the cases' blocks are small)."""
    dtype = getattr(torch, case.dtype)
    if device.type == "cuda" and dtype == torch.float32:
        return TorchMathKernel()
    kv = max(case.kv_heads // ulysses, 1)
    return select_kernel(device, dtype=dtype, head_dim=case.head_dim,
                         heads=case.heads // ulysses, kv_heads=kv)  # fmt: skip


def run_case(
    case: Case, comm: RingComm, device: torch.device, a2a: A2AComm | None = None
) -> torch.Tensor:
    """[abs errors (4), max |ref| (4)] of this member's shard, as float64 on `device`.

    comm: the ring (for u > 1 the r-ring of this member's block position); a2a: the block."""
    x = _inputs(case, device)
    pos = comm.index if a2a is None else comm.index * a2a.size + a2a.index
    idx = local_token_index(x["cu_padded"], case.degree, pos).to(device)
    q, k, v = (x[n][idx].clone().requires_grad_() for n in ("q", "k", "v"))
    layout = ShardLayout.build(x["cu"], x["cu_padded"], case.degree, case.causal_flags())
    u = 1 if a2a is None else a2a.size
    kernel = case_kernel(case, device, u)
    if a2a is None:
        out = ring_attention(q, k, v, ring=comm, layout=layout, kernel=kernel)
    else:
        out = hybrid_attention(q, k, v, layout=layout, a2a=a2a, ring=comm,
                               scale=1.0 / math.sqrt(case.head_dim), kernel=kernel)  # fmt: skip
    out.backward(x["do"][idx])
    ref = reference(case, x, 1.0 / math.sqrt(case.head_dim))
    got = {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}
    errs, scale = [], []
    for name in FIELDS:
        g, r = got[name], ref[name][idx]
        assert g is not None
        bad = (~torch.isfinite(g)).any()
        errs.append(float("inf") if bad else (g.double() - r).abs().max().item())
        scale.append(r.abs().max().item())
    return torch.tensor(errs + scale, dtype=torch.float64, device=device)


def summarise(case: Case, reduced: list[float], kernel: str) -> dict[str, Any]:
    """One JSON row: the case, max abs / rel errors per tensor, tolerance and verdict."""
    row: dict[str, Any] = {
        "degree": case.degree, "dtype": case.dtype, "mode": case.mode, "gqa": case.gqa,
        "seqlens": list(case.seqlens), "heads": case.heads, "kv_heads": case.kv_heads,
        "head_dim": case.head_dim, "kernel": kernel, "ulysses": case.ulysses,
    }  # fmt: skip
    worst = 0.0
    for i, name in enumerate(FIELDS):
        err, top = reduced[i], reduced[4 + i]
        rel = err / top if top > 0 else err
        row[f"{name}_abs"], row[f"{name}_rel"] = err, rel
        worst = max(worst, rel)
    row["tol_rel"] = TOLERANCE[case.dtype]
    row["pass"] = bool(worst <= TOLERANCE[case.dtype])
    return row
