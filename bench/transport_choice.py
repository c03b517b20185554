"""What choosing a transport per CP group buys, predicted under the analytic presets.

For every cell (length profile x replicas x tokens per replica x device) the same batch is
planned twice with the same model: ring only (the paper's transport) and with the
head-parallel hybrid u x r priced beside it (`CostModel.from_model(..., head_parallel=True)`),
and both plans are scored by the hybrid-aware model (a ring-only plan is a plan it can run).
The same is done for Megatron-LM's static CP (one degree for every sequence), whose forced
high degrees are where a ring is most exposed. Then the sensitivity: the same grid on links
10x slower than the preset (a cluster on 100 Gb/s Ethernet instead of NVLink), a regime the
presets do not ship, reported as such.

    python bench/transport_choice.py [--quick] [-o out.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import time

import numpy as np
from _common import console, make_parser, out_path, write_json
from rich.console import Console
from rich.table import Table

from fcp_data.planner import Cluster, CostModel, generate_lengths, plan_global_batch

PROFILES = ("github", "c4", "wikipedia", "extreme", "longmix", "msrvtt", "internvid", "openvid")
DEVICES = (("h200", 8), ("ascend-910c", 16))
MODELS = (("qwen3-8b", 1), ("qwen3-1.7b", 1), ("llama3-70b", 8))


def _ring_only(cost: CostModel) -> CostModel:
    return dataclasses.replace(cost, head_parallel=(), a2a_bytes=(), ring_shares=())


def run(args: argparse.Namespace) -> list[dict]:
    rows = []
    profiles = ("extreme",) if args.quick else PROFILES
    sizes = (16,) if args.quick else (16, 32, 64, 128)
    caps = (8192,) if args.quick else (8192, 16384, 32768)
    models = MODELS[:1] if args.quick else MODELS
    devices = DEVICES[:1] if args.quick else DEVICES
    for (model, tp), (device, rpn), slow, profile, n, cap in itertools.product(
        models, devices, (1.0, 10.0), profiles, sizes, caps
    ):
        hybrid = CostModel.from_model(model, device, tensor_parallel=tp, head_parallel=True)
        hybrid = dataclasses.replace(
            hybrid,
            intra_node_bandwidth=hybrid.intra_node_bandwidth / slow,
            inter_node_bandwidth=hybrid.inter_node_bandwidth / slow,
        )
        ring = _ring_only(hybrid)
        cluster = Cluster(n, replicas_per_node=rpn, tokens_per_replica=cap)
        lens = generate_lengths(profile, 64 if args.quick else 512, seed=0)
        row = {"model": model, "tp": tp, "device": device, "links_slower": slow}
        row |= {"profile": profile, "n": n, "cap": cap}
        for strategy in ("fcp", "static"):
            try:
                t0 = time.perf_counter()
                p_ring = plan_global_batch(
                    lens, cluster, ring, strategy=strategy, on_too_long="drop"
                )
                t1 = time.perf_counter()
                p_hyb = plan_global_batch(
                    lens, cluster, hybrid, strategy=strategy, on_too_long="drop"
                )
                t2 = time.perf_counter()
            except ValueError as exc:  # static needs a degree dividing N that holds the longest
                row[f"{strategy}_error"] = str(exc)[:100]
                continue
            row[f"{strategy}_ring"] = p_ring.predicted_time
            row[f"{strategy}_hybrid"] = p_hyb.predicted_time
            row[f"{strategy}_hybrid_groups"] = sum(g.ulysses > 1 for g in p_hyb.groups)
            row[f"{strategy}_groups"] = len(p_hyb.groups)
            row[f"{strategy}_ms"] = ((t1 - t0) * 1e3, (t2 - t1) * 1e3)
        rows.append(row)
    return rows


def summarise(rows: list[dict], console: Console) -> dict:
    table = Table(title="ring only / with the head-parallel hybrid (predicted; > 1: hybrid faster)")
    for col in ("model", "device", "links", "cells", "fcp mean", "fcp max", "fcp slower in",
                "hybrid groups", "static mean", "static max", "fcp ms ring/hybrid"):  # fmt: skip
        table.add_column(col, justify="left" if col in ("model", "device") else "right")
    out: dict = {}
    keys = sorted({(r["model"], r["device"], r["links_slower"]) for r in rows})
    for model, device, slow in keys:
        sel = [
            r for r in rows if (r["model"], r["device"], r["links_slower"]) == (model, device, slow)
        ]
        fcp = np.array([r["fcp_ring"] / r["fcp_hybrid"] for r in sel if "fcp_ring" in r])
        st = np.array([r["static_ring"] / r["static_hybrid"] for r in sel if "static_ring" in r])
        share = sum(r.get("fcp_hybrid_groups", 0) for r in sel) / max(
            1, sum(r.get("fcp_groups", 0) for r in sel)
        )
        ms = np.array([r["fcp_ms"] for r in sel if "fcp_ms" in r])
        out[f"{model}@{device} links/{slow:g}"] = {
            "cells": len(sel),
            "fcp_mean": float(fcp.mean()),
            "fcp_max": float(fcp.max()),
            "fcp_min": float(fcp.min()),
            "fcp_slower_cells": int(np.sum(fcp < 1.0)),
            "hybrid_group_share": share,
            "static_mean": float(st.mean()) if st.size else None,
            "static_max": float(st.max()) if st.size else None,
            "plan_ms_median": [float(np.median(ms[:, 0])), float(np.median(ms[:, 1]))],
        }
        o = out[f"{model}@{device} links/{slow:g}"]
        table.add_row(
            model, device, "preset" if slow == 1 else f"/{slow:g}", str(len(sel)),
            f"{o['fcp_mean']:.4f}", f"{o['fcp_max']:.4f}", str(o["fcp_slower_cells"]),
            f"{share:.1%}", "-" if st.size == 0 else f"{o['static_mean']:.4f}",
            "-" if st.size == 0 else f"{o['static_max']:.4f}",
            f"{o['plan_ms_median'][0]:.1f} / {o['plan_ms_median'][1]:.1f}",
        )  # fmt: skip
    console.print(table)
    return out


def main(argv: list[str] | None = None) -> int:
    args = make_parser(__doc__).parse_args(argv)
    rows = run(args)
    summary = summarise(rows, console())
    payload = {"summary": summary, "rows": rows}
    write_json(out_path(args, "transport_choice"), payload, quick=args.quick)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
