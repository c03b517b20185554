"""fcp's d = 1 attention against flash-attn and torch SDPA: fwd + bwd of one causal sequence.

All three get the same [S, H, D] inputs with GQA (H / H_kv query heads per KV head) and the same
upstream gradient; each is timed as the median of `repeats` runs after a warm-up, with the
device synchronised around every run. fcp runs `ring_attention` on a ring of one (what a
degree-1 replica runs: the kernel `select_kernel` picks, with native GQA, plus fcp's autograd
wrapper); flash-attn runs `flash_attn_func` with native GQA; SDPA runs
`scaled_dot_product_attention` on [1, H, S, D] with K/V expanded to H heads inside the timed
region (as fcp does; `enable_gqa` would push some torch versions onto the math backend).
Ratios are fcp / other, measured side by side in one run (< 1 means fcp is faster).

On CUDA fcp runs torch's own varlen flash kernel when flash-attn is missing (never explicit
scores). A length whose predicted time (from the previous length, scaled by s^2) would exceed
the part's budget is skipped. Many sequences per micro-batch are timed by the hot_path part.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from fcp_exec import ring_attention
from fcp_exec.kernels import select_kernel

from .common import median_time, sync_for

__all__ = ["bench_kernels"]


def _flash_func() -> Callable[..., torch.Tensor] | None:
    try:
        return importlib.import_module("flash_attn").flash_attn_func
    except (ImportError, AttributeError):
        return None


def _inputs(s: int, cfg: dict[str, Any], device: torch.device) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(s)
    dt = getattr(torch, cfg["dtype"])
    h, hk, d = cfg["heads"], cfg["kv_heads"], cfg["head_dim"]
    shapes = ((s, h, d), (s, hk, d), (s, hk, d), (s, h, d))
    return [torch.randn(*sh, generator=g).to(device, dt) for sh in shapes]


def _runners(s: int, cfg: dict[str, Any], device: torch.device) -> dict[str, Callable[[], None]]:
    q, k, v, do = _inputs(s, cfg, device)
    q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    cu = [0, s]

    def clear() -> None:
        q.grad = k.grad = v.grad = None

    def fcp() -> None:
        ring_attention(q, k, v, cu, cu, ring=[0], causal=True).backward(do)
        clear()

    groups = cfg["heads"] // cfg["kv_heads"]

    def sdpa() -> None:
        kk, vv = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1).unsqueeze(0), kk.transpose(0, 1).unsqueeze(0),
            vv.transpose(0, 1).unsqueeze(0), is_causal=True,
        )  # fmt: skip
        out.backward(do.transpose(0, 1).unsqueeze(0))
        clear()

    runners = {"fcp": fcp, "sdpa": sdpa}
    flash = _flash_func() if device.type == "cuda" else None
    if flash is not None:

        def flash_attn() -> None:
            out = flash(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), causal=True)
            out.backward(do.unsqueeze(0))
            clear()

        runners["flash_attn"] = flash_attn
    return runners


def bench_kernels(
    device: torch.device, lengths: list[int], cfg: dict[str, Any], seconds: float
) -> dict[str, Any]:
    """One row per length: milliseconds per implementation and fcp's ratios to the others."""
    start = time.monotonic()
    kernel = select_kernel(device, dtype=getattr(torch, cfg["dtype"]), head_dim=cfg["head_dim"],
                           heads=cfg["heads"], kv_heads=cfg["kv_heads"]).name  # fmt: skip
    sync = sync_for(device)
    rows: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    if device.type != "cuda":
        skipped.append({"what": "flash_attn", "reason": f"flash-attn needs CUDA (device {device})"})
    elif _flash_func() is None:
        skipped.append({"what": "flash_attn", "reason": "flash-attn is not installed"})
    last: tuple[int, float] | None = None
    for s in lengths:
        left = seconds - (time.monotonic() - start)
        if last is not None and last[1] * (s / last[0]) ** 2 > left:
            skipped.append({"what": f"seqlen {s}", "reason": f"time budget: {left:.0f} s left, "
                            f"~{last[1] * (s / last[0]) ** 2:.0f} s needed"})  # fmt: skip
            continue
        row: dict[str, Any] = {"seqlen": s}
        t0 = time.monotonic()
        for name, fn in _runners(s, cfg, device).items():
            try:
                row[f"{name}_ms"] = 1e3 * median_time(fn, cfg["repeats"], sync)
            except RuntimeError as exc:  # out of memory, unsupported shape: recorded
                row[f"{name}_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        if device.type == "cuda":
            torch.cuda.empty_cache()
        for other in ("sdpa", "flash_attn"):
            if "fcp_ms" in row and f"{other}_ms" in row:
                row[f"fcp_over_{other}"] = row["fcp_ms"] / row[f"{other}_ms"]
        rows.append(row)
        last = (s, time.monotonic() - t0)
    return {"status": "ok", "fcp_kernel": kernel, **cfg, "rows": rows, "skipped": skipped,
            "seconds": time.monotonic() - start}  # fmt: skip
