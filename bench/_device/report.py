"""The suite's printed table: one block per part, every skip with its reason."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

__all__ = ["print_table"]


def _exactness(r: dict[str, Any]) -> list[str]:
    lines = [f"  transport: {r['transport']}; {r['checked']}/{r['of']} cases, "
             f"all within tolerance: {r['all_pass']}"]  # fmt: skip
    worst: dict[tuple[int, int, str], list[float]] = defaultdict(lambda: [0.0] * 4)
    for c in r["cases"]:
        if c.get("status") != "ok":
            continue
        w = worst[(c["degree"], c.get("ulysses", 1), c["dtype"])]
        for i, f in enumerate(("out", "dq", "dk", "dv")):
            w[i] = max(w[i], c[f"{f}_rel"])
    lines.append(
        f"  {'d':>2} {'u':>2} {'dtype':<9} {'out rel':>9} {'dq rel':>9} {'dk rel':>9} {'dv rel':>9}"
    )
    for (d, u, dt), w in sorted(worst.items()):
        lines.append(f"  {d:>2} {u:>2} {dt:<9} " + " ".join(f"{x:>9.2e}" for x in w))
    return lines


def _kernels(r: dict[str, Any]) -> list[str]:
    lines = [f"  fcp kernel: {r['fcp_kernel']}; {r['heads']}/{r['kv_heads']} heads, "
             f"dim {r['head_dim']}, {r['dtype']}, fwd+bwd causal"]  # fmt: skip
    lines.append(f"  {'seqlen':>7} {'fcp ms':>9} {'sdpa ms':>9} {'flash ms':>9} "
                 f"{'fcp/sdpa':>9} {'fcp/flash':>9}")  # fmt: skip
    for row in r["rows"]:
        cells = [row.get(k) for k in ("fcp_ms", "sdpa_ms", "flash_attn_ms", "fcp_over_sdpa",
                                      "fcp_over_flash_attn")]  # fmt: skip
        lines.append(f"  {row['seqlen']:>7} " + " ".join(
            f"{c:>9.3f}" if c is not None else f"{'-':>9}" for c in cells))  # fmt: skip
    return lines


def _fit(r: dict[str, Any], key: str) -> list[str]:
    fit = r[key]
    coef = ", ".join(f"{k}={v:.3g}" for k, v in fit["coef"].items())
    return [f"  {key}: {coef}; max |rel error| {fit['max_abs_error']:.1%}"]


def print_table(report: dict[str, Any]) -> None:
    dev = report["device"]
    print(f"fcp device suite ({'dry run, ' if report['dry_run'] else ''}{dev['kind']}: "
          f"{dev['name']} x{dev['count']}; torch {dev['torch']}, CUDA {dev['cuda']}, "
          f"flash-attn {dev['flash_attn']}) in {report['elapsed_s']:.1f} s")  # fmt: skip
    for name, r in report["parts"].items():
        print(f"{name}: {r['status']}" + (f" ({r['reason']})" if "reason" in r else ""))
        if r["status"] != "ok":
            continue
        if name == "exactness":
            lines = _exactness(r)
        elif name == "kernel_d1":
            lines = _kernels(r)
        elif name == "cost_profile":
            lines = [*_fit(r, "compute_fit"), f"  eta_full={r['eta_full']:.3g}"]
        elif name == "vision_profile":
            lines = _fit(r, "encoder_fit")
            if r["decode_fit"].get("status") == "ok":
                lines += _fit(r, "decode_fit")
        elif name == "p2p":
            bw = r["bandwidth_gb_s"]
            lines = [f"  latency {r['latency_s'] * 1e6:.1f} us, bandwidth "
                     f"{'-' if bw is None else f'{bw:.2f}'} GB/s"]  # fmt: skip
        elif name == "overlap":
            lines = [f"  d=2 seqlen {r['seqlen']}: ring {r['ring_s'] * 1e3:.2f} ms, compute "
                     f"{r['compute_s'] * 1e3:.2f} ms, comm {r['comm_s'] * 1e3:.2f} ms, wait "
                     f"{r['wait_s'] * 1e3:.2f} ms, hidden {r['hidden_share']:.0%}"]  # fmt: skip
        else:
            lines = []
        for line in lines:
            print(line)
    for s in report["skipped"]:
        print(f"skipped: {s['part']}: {s['reason']}")
