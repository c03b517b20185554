"""The prepared device suite: one command that checks and measures fcp on one accelerator.

Run on a GPU machine (about 2-3 minutes on one H200; `--time-budget-s` caps it, default 420):

    python bench/device_suite.py --device cuda -o device.json

A bare GPU box (torch and transformers, none of fcp's other dependencies, no network) runs it
as it is: the packages a part needs beyond torch travel as wheels (`bench/fetch_device_wheels.sh`
downloads them here into the ignored `bench/.wheels`; the suite installs them into
`bench/.wheels/site` on first use), and a part whose package is missing is skipped, named.

CI runs the CPU dry path (`--dry-run`, a few seconds of measurement: tiny sizes, gloo) so the
suite cannot rot; `--quick` is that dry run on rings of 1 and 2 ranks only. It writes ONE
JSON with every figure, the device, torch / CUDA / NCCL / flash-attn versions and every skipped
part with its reason, and prints a table. Parts:

0. hot_path: per-layer attention fwd + bwd of the micro-batches a plan emits (A: 40 short
   sequences at d = 1; B: 4 x 8K at d = 2; C: one 64K at d = 8, per member) against the bare
   kernel over the same tokens; host time per layer; kernel calls per step; bf16 exactness
   against SDPA; one training step of a small Llama with fcp's attention against plain packed
   varlen attention. Needs only torch (and transformers for the model step).
1. exactness: fcp's ring attention against a float64 reference for d = 1..4, fp32 and bf16,
   causal / full / mixed varlen packs, GQA; max abs and relative error of out, dq, dk, dv;
   also the head-parallel transports of `fcp_exec.ulysses` (u = d all-to-all, 1 < u < d hybrid
   u x r; every u > 1 dividing d and the head count) on mixed packs, fp32 (GQA, K/V
   replicated where u exceeds the K/V heads) and bf16.
   Ranks sharing a GPU exchange through host memory over gloo (NCCL refuses two ranks on one
   device); with one GPU per rank NCCL is used. CPU: gloo.
2. kernel_d1: fcp's d = 1 attention vs flash-attn (when installed) and torch SDPA, fwd + bwd.
3. cost_profile: the profiler's fitted compute cost (alpha1, alpha2, beta1, eta_full) for a
   small model shape on this device, with per-point fit errors.
4. vision_profile: the profiler's vision encoder fit on this device (and PyAV decode).
5. p2p and overlap: ping-pong latency / bandwidth and the share of ring transfers hidden
   behind compute at d = 2, when two or more GPUs are present (on CPU: gloo loopback).
6. te_attention: a GPTModel with TransformerEngine's layers and FCPTEDotProductAttention
   against fcp_gpt_spec on one packed micro-batch, when TE and megatron-core are installed.

Exit status 0 when nothing failed and every exactness case is within tolerance, else 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.util
import sys
import time
from pathlib import Path
from typing import Any

import torch

if importlib.util.find_spec("fcp_exec") is None:  # a bare checkout: import fcp from the tree
    sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

from _common import make_parser, out_path, write_json
from _device.common import Budget, device_info, failed, skipped
from _device.wheels import activate_wheels

# The parts are imported in `run`, not here: spawned ranks re-import this module, and each
# heavy import (the planner, numba) would be paid again by every rank at start-up.

__all__ = ["main"]

SCHEMA = "fcp-device-suite/1"


def _transport(kind: str, count: int, world: int) -> tuple[str, bool, str]:
    """(backend, staged, why) for a job of `world` ranks on `count` devices of `kind`."""
    if kind == "cpu":
        return "gloo", False, "gloo on CPU tensors"
    native = "nccl" if kind == "cuda" else "hccl"
    if count >= world:
        return native, False, f"{native}, one device per rank"
    return "gloo", True, (f"gloo through host memory: {world} ranks share {count} device(s) "
                          f"and {native} refuses two ranks on one device")  # fmt: skip


def _ring_parts(args: argparse.Namespace, p: dict[str, Any], info: dict[str, Any],
                budget: Budget, out: dict[str, Any]) -> None:  # fmt: skip
    """Exactness (+ P2P and overlap when the exactness job's transport can carry them)."""
    from _device.exactness import make_cases
    from _device.job import run_ring_job

    degrees = [int(x) for x in args.degrees.split(",")]
    world = max(degrees)
    kind, count = info["kind"], info["count"]
    backend, staged, why = _transport(kind, count, world)
    multi = kind == "cpu" or count >= 2
    pair_here = multi and not staged and world >= 2
    cases = [dataclasses.asdict(c) for c in make_cases(degrees, tiny=p["tiny_cases"])]
    seconds = budget.slice(0.45)
    if seconds < p["job_min_s"]:
        why = f"time budget: {seconds:.0f} s for this part, it needs ~{p['job_min_s']:.0f} s"
        for name in ("exactness", "p2p", "overlap"):
            out[name] = skipped(why)
        return
    t0 = time.monotonic()
    try:
        res = run_ring_job(
            kind=kind,
            world=world,
            backend=backend,
            staged=staged,
            stage_bf16=args.dry_run,
            cases=cases,
            p2p=p["p2p"] if pair_here else None,
            overlap=p["overlap"] if pair_here else None,
            seconds=seconds,
        )
    except RuntimeError as exc:
        out["exactness"] = failed(exc, transport=why, seconds_allowed=seconds)
        res = {}
    else:
        rows = res["cases"]
        ok = [r for r in rows if r.get("status") == "ok"]
        out["exactness"] = {
            "status": "ok" if ok else "skipped", "transport": why, "world": world,
            "cases": rows, "all_pass": bool(ok) and all(r["pass"] for r in ok),
            "checked": len(ok), "of": len(rows), "seconds": time.monotonic() - t0,
            "spawn_s": res["started_s"],
        }  # fmt: skip
        if not ok:
            out["exactness"]["reason"] = "no case ran within the time budget"
    if not multi:
        reason = f"{count} {kind} device(s): P2P and overlap need two or more"
        out["p2p"], out["overlap"] = skipped(reason), skipped(reason)
        return
    if pair_here:
        out["p2p"] = _p2p_summary(res.get("p2p") or skipped("the ring job did not report"))
        out["overlap"] = res.get("overlap") or skipped("the ring job did not report")
        label = "gloo (loopback)" if kind == "cpu" else backend
        out["p2p"]["backend"] = out["overlap"]["backend"] = label
        return
    try:  # 2..world-1 devices: a second, 2-rank job on the native backend
        res = run_ring_job(kind=kind, world=2, backend="nccl" if kind == "cuda" else "hccl",
                           staged=False, cases=[], p2p=p["p2p"], overlap=p["overlap"],
                           seconds=budget.slice(0.3))  # fmt: skip
        out["p2p"], out["overlap"] = _p2p_summary(res["p2p"]), res["overlap"]
        out["p2p"]["backend"] = out["overlap"]["backend"] = "nccl" if kind == "cuda" else "hccl"
    except RuntimeError as exc:
        out["p2p"] = out["overlap"] = failed(exc)


def _p2p_summary(res: dict[str, Any]) -> dict[str, Any]:
    if res.get("status") != "ok":
        return res
    from fcp.profiling import fit_p2p

    rows = res["rows"]
    fit = fit_p2p([int(n) for n, _ in rows], [t for _, t in rows])
    spb = fit.coef["seconds_per_byte"]
    return {"status": "ok", "rows": [{"nbytes": int(n), "one_way_s": t} for n, t in rows],
            "latency_s": fit.coef["latency"], "bandwidth_gb_s": (1 / spb / 1e9) if spb else None,
            "fit_max_abs_error": fit.max_abs_error}  # fmt: skip


def _guarded(name: str, need_s: float, budget: Budget, fn: Any, out: dict[str, Any]) -> None:
    if budget.left() < need_s:
        out[name] = skipped(f"time budget: {budget.left():.0f} s left, part needs ~{need_s:.0f} s")
        return
    try:
        out[name] = fn()
    except ImportError as exc:  # a package this box lacks: the part is skipped, named
        out[name] = skipped(
            f"needs {exc.name or exc}: not installed here; run bench/fetch_device_wheels.sh "
            "on a machine with network and carry bench/.wheels with the tree"
        )
    except Exception as exc:  # a part that breaks is reported, the others still run
        out[name] = failed(exc)


def _vision(p: dict[str, Any]) -> dict[str, Any]:
    from _device.profile import bench_vision_profile

    from fcp.profiling.vision import VisionProfileConfig

    return bench_vision_profile(VisionProfileConfig(**p["vision"]))


def _profile(dev: torch.device, p: dict[str, Any]) -> dict[str, Any]:
    from _device.profile import bench_compute_profile

    return bench_compute_profile(str(dev), p["profile_shape"], p["profile_lengths"],
                                 p["profile_repeats"])  # fmt: skip


def _decode(p: dict[str, Any]) -> dict[str, Any]:
    from _device.decode import bench_video_decode

    return bench_video_decode(p["decode"])


def _te(dev: torch.device) -> dict[str, Any]:
    from _device.te_attention import bench_te_attention

    return bench_te_attention(dev)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from _device.hot_path import bench_hot_path
    from _device.kernels import bench_kernels
    from _device.presets import preset

    budget = Budget(total_s=args.time_budget_s)
    kind = "cpu" if args.dry_run else args.device
    if kind == "cpu":  # one thread per process, as the gloo examples run; no oversubscription
        torch.set_num_threads(1)
    info = device_info(kind)
    info["wheels"] = args.wheels
    p = preset("dry" if args.dry_run else ("cpu" if kind == "cpu" else "gpu"), kind)
    dev = torch.device(kind if kind == "cpu" else f"{kind}:0")
    parts: dict[str, Any] = {}
    hot = p["hot_path"]
    _guarded("hot_path", hot["min_s"], budget,
             lambda: bench_hot_path(dev, hot, budget.slice(0.3)), parts)  # fmt: skip
    _ring_parts(args, p, info, budget, parts)
    _guarded("kernel_d1", 5.0, budget,
             lambda: bench_kernels(dev, p["kernel_lengths"], p["kernel"], budget.slice(0.4)),
             parts)  # fmt: skip
    _guarded("cost_profile", p["profile_min_s"], budget, lambda: _profile(dev, p), parts)
    _guarded("vision_profile", p["vision_min_s"], budget, lambda: _vision(p), parts)
    _guarded("video_decode", p["decode_min_s"], budget, lambda: _decode(p), parts)
    _guarded("te_attention", 2.0, budget, lambda: _te(dev), parts)
    skips = [{"part": name, "reason": r["reason"]} for name, r in parts.items()
             if r.get("status") == "skipped"]  # fmt: skip
    skips += [{"part": f"kernel_d1 {s['what']}", "reason": s["reason"]}
              for s in parts["kernel_d1"].get("skipped", [])]  # fmt: skip
    if args.dry_run:
        for what in ("exactness on CUDA", "flash-attn comparison", "NCCL P2P and overlap"):
            skips.append({"part": what, "reason": "dry run: CPU only, tiny sizes, gloo"})
    return {
        "schema": SCHEMA, "dry_run": args.dry_run,
        "created_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python", "bench/device_suite.py", *sys.argv[1:]]),
        "device": info, "time_budget_s": args.time_budget_s, "elapsed_s": budget.elapsed(),
        "parts": parts, "skipped": skips,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = make_parser(__doc__)
    ap.add_argument(
        "--dry-run",
        action="store_true",
        help="CPU, tiny sizes, gloo: every code path that can run without CUDA",
    )
    ap.add_argument(
        "--device",
        choices=("cuda", "cpu", "npu"),
        default="cuda" if torch.cuda.is_available() else "cpu",
    )
    ap.add_argument(
        "--time-budget-s",
        type=float,
        default=420.0,
        help="wall-clock cap; a part that would overrun is skipped (default 420)",
    )
    ap.add_argument("--degrees", default="1,2,3,4", help="ring degrees of the exactness check")
    ap.add_argument(
        "--wheels-dir",
        type=Path,
        default=Path(__file__).resolve().parent / ".wheels",
        help="wheels of packages this box lacks (bench/fetch_device_wheels.sh)",
    )
    args = ap.parse_args(argv)  # fmt: skip
    if args.quick:  # the CPU dry run on rings of 1 and 2 ranks (the dry run itself: 1..4)
        args.dry_run, args.degrees = True, "1,2"
    if not args.dry_run and args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda but torch.cuda.is_available() is False; use --dry-run on CPU")
    if not args.dry_run and args.device == "npu":
        try:
            import torch_npu  # noqa: F401  (registers the npu device type)
        except ImportError:
            ap.error("--device npu needs torch_npu (pip install torch_npu matching CANN)")
    from _device.report import print_table

    # packages this box lacks, from the wheels carried in bench/.wheels, before any part
    # imports them (spawned ranks inherit the path through PYTHONPATH)
    args.wheels = activate_wheels(args.wheels_dir)

    t0 = time.monotonic()
    report = run(args)
    print_table(report)
    write_json(out_path(args, "device_suite"), report, quick=args.quick)
    print(f"{time.monotonic() - t0:.1f} s")
    parts = report["parts"].values()
    bad = any(r.get("status") == "failed" for r in parts)
    inexact = any(r.get("status") == "ok" and r.get("all_pass") is False for r in parts)
    return 1 if bad or inexact else 0


if __name__ == "__main__":
    sys.exit(main())
