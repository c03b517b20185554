"""Attention's hot path on one device: fcp's layer against the bare kernel over the same tokens.

Micro-batches a plan really emits, at Llama-3-8B attention shapes (H = 32, H_kv = 8, D = 128,
bf16; the dry run shrinks everything):

- A: 16K tokens in 40 short sequences at degree 1 (the most common degree in fcp's plans);
- B: 4 x 8K at degree 2, member 0's kernel work;
- C: one 64K sequence at degree 8, members 0 and 3's kernel work.

One GPU holds one member, so B and C run the member's whole schedule with a loop comm (every
step gets the member's own K/V back: the same calls, shapes and merges, no transfer). The
baseline is the bare kernel: the same varlen calls on inputs gathered beforehand, no merge, no
gather, no padding clean-up, no autograd (for A that is exactly one varlen call over the whole
pack). Reported per micro-batch: device ms of fcp and of the baseline (fwd + bwd, median of
repeats), their ratio, host ms to issue fcp's layer (no sync inside: what the host spends
while the device works), the kernel calls per step, and the peak memory fcp adds over the
baseline (GQA K/V are never expanded: the only extra buffers are fp32 accumulators at d > 1).
Also: bf16 exactness of fcp's A-like pack against per-sequence SDPA in fp32, and one training
step of a small transformers Llama on A at degree 1 with fcp's attention against the same model
with plain packed varlen attention (`torch.nn.attention.varlen.varlen_attn`, or per-sequence
SDPA on CPU).
"""

from __future__ import annotations

import inspect
import math
import time
from collections import Counter
from typing import Any

import torch
import torch.nn.functional as F

from fcp_exec.attention import _RingAttention, _take
from fcp_exec.kernels import AttentionKernel, select_kernel
from fcp_exec.layout import ShardLayout

from .common import median_time, sync_for

__all__ = ["bench_hot_path", "micro_batches"]


def micro_batches(scale: int) -> dict[str, tuple[list[int], int, list[int]]]:
    """name -> (sequence lengths, degree, member indices); `scale` divides the token counts."""
    short = 16384 // scale // 40
    return {
        "A": ([short] * 39 + [16384 // scale - short * 39], 1, [0]),
        "B": ([8192 // scale] * 4, 2, [0]),
        "C": ([65536 // scale], 8, [0, 3]),
    }


class _LoopComm:
    """A ring whose transfers hand back the sent buffer: a member's work without the wire."""

    def __init__(self, size: int, index: int) -> None:
        self.size, self.index = size, index

    def exchange(self, send: torch.Tensor, *, tag: int, recv: Any = None) -> torch.Tensor:
        return send

    def wait(self, tag: int) -> None:
        return None


class _Counting:
    def __init__(self, inner: AttentionKernel) -> None:
        self.inner, self.name = inner, inner.name
        self.calls: Counter[str] = Counter()

    def check(self, **kw: Any) -> None:
        self.inner.check(**kw)

    def forward(self, *a: Any, **kw: Any) -> Any:
        self.calls["fwd"] += 1
        return self.inner.forward(*a, **kw)

    def backward(self, *a: Any, **kw: Any) -> Any:
        self.calls["bwd"] += 1
        return self.inner.backward(*a, **kw)


def _layout(lens: list[int], degree: int) -> ShardLayout:
    chunks = 2 * degree
    cu, cup = [0], [0]
    for n in lens:
        cu.append(cu[-1] + n)
        cup.append(cup[-1] + -(-n // chunks) * chunks)
    return ShardLayout.build(cu, cup, degree, True)


def _inputs(t: int, cfg: dict[str, Any], device: torch.device, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    dt = getattr(torch, cfg["dtype"])
    h, hk, d = cfg["heads"], cfg["kv_heads"], cfg["head_dim"]
    shapes = ((t, h, d), (t, hk, d), (t, hk, d), (t, h, d))
    return [(torch.randn(*s, generator=g) * 0.5).to(device, dt) for s in shapes]


def _case(
    lens: list[int], degree: int, index: int, cfg: dict[str, Any], device: torch.device,
    kernel: AttentionKernel,
) -> dict[str, Any]:  # fmt: skip
    layout = _layout(lens, degree)
    sched = layout.schedule(index, device)
    q, k, v, do = _inputs(layout.num_local_tokens, cfg, device, seed=index)
    q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    scale = 1.0 / math.sqrt(cfg["head_dim"])
    count = _Counting(kernel)
    comm = _LoopComm(degree, index)
    sync = sync_for(device)

    def fcp() -> None:
        out = _RingAttention.apply(q, k, v, sched, comm, count, scale)
        out.backward(do)
        q.grad = k.grad = v.grad = None

    # the baseline: the schedule's own kernel calls on inputs gathered beforehand
    calls = [(c, _take(q, c.q_rows).detach(), _take(k, c.k_rows).detach(),
              _take(v, c.k_rows).detach(), _take(do, c.q_rows)) for s in sched.steps
             for c in s]  # fmt: skip

    def bare() -> None:
        for c, qq, kk, vv, dd in calls:
            o, m = kernel.forward(qq, kk, vv, c.seg, causal=c.causal, scale=scale)
            kernel.backward(dd, qq, kk, vv, o, m, c.seg, causal=c.causal, scale=scale)

    row: dict[str, Any] = {"tokens": sum(lens), "sequences": len(lens), "degree": degree,
                           "member": index, "local_tokens": layout.num_local_tokens}  # fmt: skip
    mem = device.type == "cuda"
    for name, fn in (("bare", bare), ("fcp", fcp)):
        if mem:
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
        row[f"{name}_ms"] = 1e3 * median_time(fn, cfg["repeats"], sync)
        if mem:
            row[f"{name}_peak_mib"] = (torch.cuda.max_memory_allocated(device) - base) / 2**20
    row["fcp_over_bare"] = row["fcp_ms"] / row["bare_ms"]
    count.calls.clear()
    sync()
    start = time.perf_counter()
    fcp()  # issue only: the host's own time per layer
    row["host_ms"] = 1e3 * (time.perf_counter() - start)
    sync()
    row["calls_per_step"] = {k: v / degree for k, v in count.calls.items()}
    return row


def _exactness(cfg: dict[str, Any], device: torch.device, kernel: AttentionKernel,
               scale_down: int) -> dict[str, Any]:  # fmt: skip
    """bf16 fcp (degree 1, an A-like pack) against per-sequence SDPA in fp32."""
    lens = [int(n) for n in torch.randint(17, 700 // scale_down + 20, (12,),
                                          generator=torch.Generator().manual_seed(3))]  # fmt: skip
    layout = _layout(lens, 1)
    q, k, v, do = _inputs(layout.num_local_tokens, cfg, device, seed=9)
    q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    sched = layout.schedule(0, device)
    out = _RingAttention.apply(q, k, v, sched, _LoopComm(1, 0), kernel,
                               1.0 / math.sqrt(cfg["head_dim"]))  # fmt: skip
    out.backward(do)
    got = {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    ref = torch.zeros_like(q32)
    groups = cfg["heads"] // cfg["kv_heads"]
    for a, n in zip(_cum(layout.padded), lens):
        qs = q32[a : a + n].transpose(0, 1)[None]
        ks = k32[a : a + n].repeat_interleave(groups, 1).transpose(0, 1)[None]
        vs = v32[a : a + n].repeat_interleave(groups, 1).transpose(0, 1)[None]
        ref[a : a + n] = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True)[0].transpose(
            0, 1
        )
    ref.backward(do.float())
    want = {"out": ref.detach(), "dq": q32.grad, "dk": k32.grad, "dv": v32.grad}
    row: dict[str, Any] = {"sequences": len(lens), "tokens": sum(lens), "tol_rel": 2.5e-2}
    worst = 0.0
    for name in want:
        err = (got[name].float() - want[name]).abs().max().item()
        rel = err / max(want[name].abs().max().item(), 1e-30)
        row[f"{name}_rel"] = rel
        worst = max(worst, rel)
    row["pass"] = worst <= row["tol_rel"]
    return row


def _cum(lengths: tuple[int, ...]) -> list[int]:
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return out[:-1]


def _plain_varlen(device: torch.device) -> Any:
    """transformers attention function: plain packed varlen attention (the baseline model)."""
    varlen = None
    if device.type == "cuda":
        try:
            from torch.nn.attention.varlen import varlen_attn as varlen
        except ImportError:
            varlen = None
    gqa = varlen is not None and "enable_gqa" in inspect.signature(varlen).parameters

    def attend(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               attention_mask: Any, dropout: float = 0.0, scaling: float | None = None,
               **kw: Any) -> tuple[torch.Tensor, None]:  # fmt: skip
        q, k, v = (x[0].transpose(0, 1).contiguous() for x in (query, key, value))
        cu, mx = kw["cu_seq_lens_q"], kw["max_length_q"]
        if varlen is not None:
            extra = {"enable_gqa": True} if gqa else {}
            out = varlen(q, k, v, cu, cu, mx, mx, scale=scaling, window_size=(-1, 0), **extra)
        else:  # CPU dry run: per-sequence SDPA
            groups = q.shape[1] // k.shape[1]
            parts = []
            for a, b in zip(kw["plain_host_cu"], kw["plain_host_cu"][1:]):
                parts.append(F.scaled_dot_product_attention(
                    q[a:b].transpose(0, 1), k[a:b].repeat_interleave(groups, 1).transpose(0, 1),
                    v[a:b].repeat_interleave(groups, 1).transpose(0, 1), is_causal=True,
                    scale=scaling).transpose(0, 1))  # fmt: skip
            out = torch.cat(parts)
        return out[None], None

    return attend


def _model_step(cfg: dict[str, Any], device: torch.device, lens: list[int]) -> dict[str, Any]:
    """One training step (fwd + bwd) of a small Llama on pack A at degree 1: fcp's attention
    against plain packed varlen attention, same weights, same tokens."""
    try:
        import transformers
    except ImportError as exc:
        return {"status": "skipped", "reason": f"transformers is not installed ({exc})"}
    from fcp_exec import CPBinding
    from fcp_exec.hf import register_attention
    from fcp_exec.runtime import ExecRuntime

    register_attention()
    transformers.AttentionInterface.register("plain_varlen", _plain_varlen(device))
    m = cfg["model"]
    dt = getattr(torch, cfg["dtype"])
    conf = transformers.LlamaConfig(
        vocab_size=m["vocab"], hidden_size=m["hidden"], intermediate_size=m["ffn"],
        num_hidden_layers=m["layers"], num_attention_heads=m["heads"],
        num_key_value_heads=m["kv_heads"], head_dim=m["hidden"] // m["heads"],
        max_position_embeddings=max(lens) * 2,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(conf).to(device, dt)
    padded = [n + n % 2 for n in lens]
    cu = torch.tensor([*_cum(tuple(lens)), sum(lens)], dtype=torch.int32)
    cup = [*_cum(tuple(padded)), sum(padded)]
    layout = ShardLayout.build(cu.tolist(), cup, 1, True)
    t = cup[-1]
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, m["vocab"], (1, t), generator=g).to(device)
    pos = torch.cat([torch.arange(p) for p in padded])[None].to(device)
    # the plain model sees the same real tokens, packed without padding
    real = torch.cat([torch.arange(a, a + n) for a, n in zip(cup, lens)]).to(device)
    binding = CPBinding.of((0,), 0, runtime=ExecRuntime())
    fcp_kw = {"cu_seq_lens_q": cu.to(device), "cu_seq_lens_k": cu.to(device),
              "max_length_q": max(padded), "max_length_k": max(padded),
              "fcp_cu_seqlens_padded": torch.tensor(cup, dtype=torch.int32, device=device),
              "fcp_binding": binding, "fcp_layout": layout}  # fmt: skip
    plain_kw = {"cu_seq_lens_q": cu.to(device), "cu_seq_lens_k": cu.to(device),
                "max_length_q": max(lens), "max_length_k": max(lens),
                "plain_host_cu": cu.tolist()}  # fmt: skip
    sync = sync_for(device)

    def step(impl: str) -> None:
        model.set_attn_implementation(impl)
        if impl == "fcp_ring":
            out = model(input_ids=ids, position_ids=pos, **fcp_kw).logits[0, real]
        else:
            out = model(input_ids=ids[:, real], position_ids=pos[:, real], **plain_kw).logits[0]
        out.float().logsumexp(-1).mean().backward()
        model.zero_grad(set_to_none=True)

    row: dict[str, Any] = {"status": "ok", "layers": m["layers"], "hidden": m["hidden"],
                           "tokens": sum(lens), "sequences": len(lens)}  # fmt: skip
    for name, impl in (("plain", "plain_varlen"), ("fcp", "fcp_ring")):
        row[f"{name}_ms"] = 1e3 * median_time(lambda impl=impl: step(impl), cfg["repeats"], sync)
    row["fcp_over_plain"] = row["fcp_ms"] / row["plain_ms"]
    row["kernel"] = binding.runtime.kernels.report if binding.runtime else []
    return row


def bench_hot_path(device: torch.device, cfg: dict[str, Any], seconds: float) -> dict[str, Any]:
    """The hot-path part of the device suite (module doc)."""
    start = time.monotonic()
    dt = getattr(torch, cfg["dtype"])
    kernel = select_kernel(device, dtype=dt, head_dim=cfg["head_dim"], heads=cfg["heads"],
                           kv_heads=cfg["kv_heads"])  # fmt: skip
    rows, skipped = [], []
    for name, (lens, degree, members) in micro_batches(cfg["scale"]).items():
        for index in members:
            if time.monotonic() - start > seconds:
                skipped.append({"what": f"{name} member {index}", "reason": "time budget"})
                continue
            rows.append({"batch": name, **_case(lens, degree, index, cfg, device, kernel)})
    exact = _exactness(cfg, device, kernel, cfg["scale"])
    model = _model_step(cfg, device, micro_batches(cfg["scale"])["A"][0])
    return {"status": "ok", "kernel": kernel.name, "shape": {k: cfg[k] for k in (
        "heads", "kv_heads", "head_dim", "dtype")}, "rows": rows, "exactness": exact,
        "model_step": model, "skipped": skipped, "all_pass": bool(exact["pass"])}  # fmt: skip
