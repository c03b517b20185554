"""`python -m fcp.demo`: the demo training job (`fcp demo` step 3), or one of its ranks.

    python -m fcp.demo --replicas 4 --steps 6                    # sample shards, 4 procs
    python -m fcp.demo --index out/demo/index --baseline static  # + static on the same batches
    python -m fcp.demo --index out/demo/index --no-cp            # + the same without CP
    torchrun --nproc-per-node 4 -m fcp.demo --index out/demo/index

Without RANK/WORLD_SIZE in the environment it launches --replicas processes of itself;
with them (torchrun, or `launch`) it is one replica. `--report FILE` (rank 0) writes the
per-step records as JSON, which is how `launch` reads the result back.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

from .train import TrainConfig, launch, worker


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m fcp.demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    defaults = TrainConfig()
    for name in TrainConfig.__slots__:  # type: ignore[attr-defined]
        v = getattr(defaults, name)
        flag = "--" + name.replace("_", "-")
        if isinstance(v, bool):
            p.add_argument(flag, action="store_true")
        elif isinstance(v, list):
            p.add_argument(flag, nargs="+", default=[])
        else:
            p.add_argument(flag, type=type(v) if v is not None else str, default=v)
    p.add_argument("--report", help="rank 0 writes the per-step records here (JSON)")
    p.add_argument("--config", help="a TrainConfig as JSON (what the launcher hands its ranks)")
    args = vars(p.parse_args(argv))
    report, config = args.pop("report"), args.pop("config")
    cfg = TrainConfig(**(json.loads(Path(config).read_text()) if config else args))
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        worker(cfg, report)
        return 0
    out = launch(cfg)
    if report:
        Path(report).write_text(json.dumps(asdict(out)))
    losses = [r["loss"] for r in out.steps]
    print(
        f"{len(losses)} steps on {cfg.replicas} processes in {out.wall_s:.1f} s: loss "
        f"{losses[0]:.4f} -> {losses[-1]:.4f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
