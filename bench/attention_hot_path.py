"""Attention's hot path, counted and timed on CPU: this tree against an earlier one, side by side.

Run: .venv/bin/python bench/attention_hot_path.py  (about 2 minutes on 2 CPU cores)
     .venv/bin/python bench/attention_hot_path.py --quick  (seconds: 1/16 sizes, no baseline)
Writes bench/results/attention_hot_path.json (or -o) and prints a table.

Each side runs in its own process (`--baseline-ref`, default the last commit before the varlen
path, is checked out into a temporary git worktree and imported from there), alternating, so
both see the same machine. Micro-batches a plan emits, at Llama-3-8B attention shapes (H = 32,
H_kv = 8, D = 128, bf16) on `meta` tensors (shapes only: what is measured is the host's own work
and the ops it issues, which is what a GPU run pays on top of the kernels):

- A: 16K tokens in 40 short sequences at degree 1; A1: the same tokens as one sequence (both
  padded to even lengths, as the collator pads at degree 1);
- B: 4 x 8K at degree 2 (member 0); C: one 64K sequence at degree 8 (member 3).

Per micro-batch and layer (fwd + bwd): kernel calls per ring step (a counting kernel: the CUDA
path's torch flash ops on `meta`; the earlier tree gets the same op through its dense per-block
contract, K/V expanded as it did), kernel launches (aten ops that are not views), bytes
written by ops other than the attention kernels (fp32 accumulators, gathers, copies), of them
the bytes of GQA expansion (any op that materialises a broadcast K/V: repeat_interleave,
expand + copy),
host milliseconds per layer (median) and, for this tree, the once-per-micro-batch cost of the
layout and its schedule (the first layer's extra; later layers reuse them).
The figure the issue sets: host time of A at most 1.2x that of A1. A host sync cannot happen on
`meta` (reading a meta tensor raises), so every run here is also a proof of none.
Then real CPU compute: degree 1, 40 sequences (H = 8, H_kv = 2, D = 64, fp32, fwd + bwd through
autograd), this tree against the earlier one ("no slower than before").
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from _common import ROOT, make_parser, out_path, write_json

BASELINE_REF = "4bb56f8"  # the last commit with the per-sequence block path

# the measuring child: runs against whichever fcp_exec is first on sys.path
CHILD = r'''
import json, math, statistics, sys, time
from collections import Counter
import torch
from torch.utils._python_dispatch import TorchDispatchMode
import fcp_exec
from fcp_exec import ring_attention
from fcp_exec.ring import RingComm
import fcp_exec.kernels.base as base

NEW = hasattr(base, "Segments")
cfg = json.loads(sys.argv[1])


class Loop(RingComm):
    """A ring of `size` in one process: transfers hand back a fresh buffer (meta: no data)."""
    def __init__(self, size, index):
        super().__init__([0])
        self.size, self.index = size, index
    def exchange(self, send, *, tag, recv=None):
        return torch.empty_like(send) if send.device.type == "meta" else send
    def wait(self, tag):
        pass


class Ops(TorchDispatchMode):
    KERNELS = ("_flash_attention_forward", "_flash_attention_backward")
    def __init__(self):
        super().__init__()
        self.ops, self.bytes, self.views, self.expanded = Counter(), 0, 0, 0
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        ret = func._schema.returns
        if ret and ret[0].alias_info is not None and not ret[0].alias_info.is_write:
            self.views += 1  # a view: no kernel launch, no bytes
            return out
        self.ops[name] += 1
        if any(isinstance(a, torch.Tensor) and any(st == 0 and sz > 1 for st, sz in
                                                   zip(a.stride(), a.shape)) for a in args):
            for t in (out if isinstance(out, (tuple, list)) else (out,)):
                if isinstance(t, torch.Tensor):  # a materialised broadcast: GQA expansion
                    self.expanded += t.numel() * t.element_size()
        if name not in self.KERNELS:
            for t in (out if isinstance(out, (tuple, list)) else (out,)):
                if isinstance(t, torch.Tensor):
                    self.bytes += t.numel() * t.element_size()
        return out


class Count:
    def __init__(self, inner):
        self.inner, self.name, self.fwd, self.bwd = inner, inner.name, 0, 0
    def check(self, **kw):
        return self.inner.check(**kw)
    def forward(self, *a, **kw):
        self.fwd += 1
        return self.inner.forward(*a, **kw)
    def backward(self, *a, **kw):
        self.bwd += 1
        return self.inner.backward(*a, **kw)


class DenseMeta:
    """The earlier contract (one dense block [S, H, D], K/V at H heads) on torch's flash op."""
    name = "torch-flash-dense"
    def forward(self, q, k, v, *, causal, scale):
        cu = torch.tensor([0, q.shape[0]], dtype=torch.int32, device=q.device)
        ck = torch.tensor([0, k.shape[0]], dtype=torch.int32, device=q.device)
        o, l, *_ = torch.ops.aten._flash_attention_forward(
            q, k, v, cu, ck, q.shape[0], k.shape[0], 0.0, causal, False, scale=scale)
        return o, l
    def backward(self, dout, q, k, v, out, lse, *, causal, scale):
        cu = torch.tensor([0, q.shape[0]], dtype=torch.int32, device=q.device)
        ck = torch.tensor([0, k.shape[0]], dtype=torch.int32, device=q.device)
        rng = torch.zeros(2, dtype=torch.uint64, device=q.device)
        return torch.ops.aten._flash_attention_backward(
            dout, q, k, v, out, lse, cu, ck, q.shape[0], k.shape[0], 0.0, causal, rng,
            torch.empty(0, device=q.device), scale=scale)


def kernel_for(device):
    if device == "meta":
        if NEW:
            from fcp_exec.kernels import TorchFlashKernel
            return TorchFlashKernel()
        return DenseMeta()
    from fcp_exec.kernels import CpuFlashKernel
    return CpuFlashKernel()


def pack(lens, degree):
    c = 2 * degree
    padded = [-(-n // c) * c for n in lens]
    cu, cup = [0], [0]
    for n, p in zip(lens, padded):
        cu.append(cu[-1] + n)
        cup.append(cup[-1] + p)
    return cu, cup, cup[-1] // degree


def layer(lens, degree, index, device, dtype, heads, kv, dim, repeats):
    cu, cup, t = pack(lens, degree)
    opts = {"device": device, "dtype": dtype}
    g = torch.Generator().manual_seed(0)
    def rnd(*s):
        if device == "meta":
            return torch.empty(*s, **opts)
        return torch.randn(*s, generator=g).to(dtype)
    q, k, v, do = rnd(t, heads, dim), rnd(t, kv, dim), rnd(t, kv, dim), rnd(t, heads, dim)
    for x in (q, k, v):
        x.requires_grad_()
    kern = Count(kernel_for(device))
    comm = Loop(degree, index)
    extra = {}
    first = 0.0
    if NEW:  # the micro-batch's layout, built once from host offsets (what hf/megatron pass)
        start = time.perf_counter()
        extra["layout"] = fcp_exec.ShardLayout.build(cu, cup, degree, True)
        extra["layout"].schedule(index, device)
        first = time.perf_counter() - start
    def run():
        out = ring_attention(q, k, v, cu, cup, ring=comm, kernel=kern, **extra)
        out.backward(do)
        q.grad = k.grad = v.grad = None
    run()  # warm-up
    kern.fwd = kern.bwd = 0
    with Ops() as ops:
        run()
    calls = (kern.fwd / degree, kern.bwd / degree)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return {"calls_fwd_per_step": calls[0], "calls_bwd_per_step": calls[1],
            "aten_ops": sum(ops.ops.values()), "views": ops.views,
            "index_gathers": ops.ops["index_select"], "layout_ms": 1e3 * first,
            "non_kernel_mib": ops.bytes / 2**20,
            "gqa_expansion_mib": ops.expanded / 2**20,
            "ms": 1e3 * statistics.median(times)}


out = {"side": cfg["side"]}
for name, (lens, degree, index) in cfg["batches"].items():
    out[name] = layer(lens, degree, index, "meta", torch.bfloat16, 32, 8, 128, cfg["repeats"])
lens, degree, index = cfg["cpu_batch"]
torch.set_num_threads(1)
out["cpu_A"] = layer(lens, degree, index, "cpu", torch.float32, 8, 2, 64, cfg["cpu_repeats"])
print("RESULT " + json.dumps(out))
'''


def _batches(quick: bool) -> dict[str, Any]:
    """A: 40 short sequences of odd lengths (each padded by one token, as a plan's pack is);
    A1: the same real tokens as one sequence (odd: padded too, so both pay the padding)."""
    div = 16 if quick else 1
    total = 16383 // div
    short = (409 // div) | 1
    a = [short] * 39
    a.append(total - sum(a))
    return {
        "A": (a, 1, 0),
        "A1": ([total], 1, 0),
        "B": ([8192 // div] * 4, 2, 0),
        "C": ([65536 // div], 8, 3),
    }


def _run_side(side: str, path: Path, cfg: dict[str, Any]) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(path), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-c", CHILD, json.dumps({**cfg, "side": side})]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=path, timeout=1800)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    if proc.returncode or line is None:
        raise RuntimeError(f"{side} side failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return json.loads(line[len("RESULT ") :])


def _worktree(ref: str, where: Path) -> Path:
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(where), ref],
                   check=True, capture_output=True, text=True)  # fmt: skip
    return where


def main(argv: list[str] | None = None) -> int:
    ap = make_parser(__doc__)
    ap.add_argument("--baseline-ref", default=BASELINE_REF,
                    help="git ref of the earlier tree ('' for none; --quick: none)")  # fmt: skip
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds per side")
    args = ap.parse_args(argv)
    if args.quick:
        args.baseline_ref = ""
    rounds = 1 if args.quick else args.rounds
    short = 410 if not args.quick else 41
    cfg = {"batches": _batches(args.quick), "repeats": 3 if args.quick else 30,
           "cpu_batch": ([short] * 40, 1, 0), "cpu_repeats": 2 if args.quick else 5}  # fmt: skip
    results: dict[str, list[dict[str, Any]]] = {"this": [], "baseline": []}
    with tempfile.TemporaryDirectory() as tmp:
        sides = {"this": ROOT}
        if args.baseline_ref:
            sides["baseline"] = _worktree(args.baseline_ref, Path(tmp) / "baseline")
        try:
            for _ in range(rounds):
                for side, path in sides.items():
                    results[side].append(_run_side(side, path, cfg))
        finally:
            if "baseline" in sides:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                                str(sides["baseline"])], capture_output=True)  # fmt: skip
    report = _summarise(results, cfg, args)
    _print(report)
    write_json(out_path(args, "attention_hot_path"), report, quick=args.quick)
    return 0


def _median(rows: list[dict[str, Any]], batch: str, key: str) -> float:
    return statistics.median(r[batch][key] for r in rows)


def _summarise(results: dict[str, list[dict[str, Any]]], cfg: dict[str, Any],
               args: argparse.Namespace) -> dict[str, Any]:  # fmt: skip
    out: dict[str, Any] = {"baseline_ref": args.baseline_ref or None,
                           "shapes": "meta: H=32 H_kv=8 D=128 bf16; cpu: H=8 H_kv=2 D=64 fp32",
                           "sequences": {k: len(v[0]) for k, v in cfg["batches"].items()},
                           "sides": {}}  # fmt: skip
    keys = ("calls_fwd_per_step", "calls_bwd_per_step", "aten_ops", "views", "index_gathers",
            "non_kernel_mib", "gqa_expansion_mib", "ms", "layout_ms")  # fmt: skip
    for side, rows in results.items():
        if not rows:
            continue
        out["sides"][side] = {b: {k: _median(rows, b, k) for k in keys}
                              for b in (*cfg["batches"], "cpu_A")}  # fmt: skip
        s = out["sides"][side]
        s["host_A_over_A1"] = s["A"]["ms"] / s["A1"]["ms"]
    if "baseline" in out["sides"]:
        this, base = out["sides"]["this"], out["sides"]["baseline"]
        out["cpu_d1_this_over_baseline"] = this["cpu_A"]["ms"] / base["cpu_A"]["ms"]
        out["host_ms_this_over_baseline"] = {b: this[b]["ms"] / base[b]["ms"]
                                             for b in cfg["batches"]}  # fmt: skip
    return out


def _print(r: dict[str, Any]) -> None:
    print(f"attention hot path per layer (fwd + bwd); {r['shapes']}")
    head = f"{'side':9} {'batch':6} {'calls/step':>10} {'launches':>9} {'gathers':>8} " \
           f"{'other MiB':>10} {'GQA MiB':>8} {'host ms':>9} {'layout ms':>10}"  # fmt: skip
    print(head)
    for side, s in r["sides"].items():
        for b, row in s.items():
            if not isinstance(row, dict):
                continue
            calls = f"{row['calls_fwd_per_step']:.0f}+{row['calls_bwd_per_step']:.0f}"
            print(f"{side:9} {b:6} {calls:>10} {row['aten_ops']:>9.0f} "
                  f"{row['index_gathers']:>8.0f} {row['non_kernel_mib']:>10.1f} "
                  f"{row['gqa_expansion_mib']:>8.0f} {row['ms']:>9.2f} "
                  f"{row['layout_ms']:>10.2f}")  # fmt: skip
        print(f"{side:9} host time A (40 seqs) / A1 (1 seq): {s['host_A_over_A1']:.2f}x")
    if "cpu_d1_this_over_baseline" in r:
        print(f"CPU d=1, 40 sequences, this / baseline: {r['cpu_d1_this_over_baseline']:.2f}x")


if __name__ == "__main__":
    raise SystemExit(main())
