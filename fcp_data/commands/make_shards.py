"""`fcp make-shards -o OUT --text N --video M`: write real sample shards for demos and tests."""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

from ._args import float_in, int_in

__all__ = ["register", "run"]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "make-shards",
        help="write sample WebDataset shards (stdlib text, tiny mp4 videos)",
        description=(
            "Write real WebDataset shards: text samples from the Python standard library's "
            ".py files (a long-tailed code corpus), and small mp4 videos encoded with PyAV whose "
            "durations follow a scaled-down InternVid length profile, half with .json sidecars. "
            "Deterministic for a given --seed and Python version."
        ),
    )
    p.add_argument("-o", "--output", type=Path, required=True, help="output directory")
    p.add_argument(
        "--text", type=int_in(0, 10**7), default=0, help="number of text samples (<= 10M)"
    )
    p.add_argument(
        "--video",
        type=int_in(0, 10**5, why="each clip is encoded with PyAV"),
        default=0,
        help="number of video samples (<= 100,000)",
    )
    p.add_argument("--seed", type=int_in(0, 2**63 - 1), default=0, help="random seed (default 0)")
    p.add_argument(
        "--samples-per-shard",
        type=int_in(1, 10**6),
        default=64,
        help="samples per tar shard (default 64)",
    )
    p.add_argument(
        "--time-scale",
        type=float_in(0.0, 100.0, low_open=True, why="scale on clip durations"),
        default=0.2,
        help="scale on the video duration profile (default 0.2 keeps clips short)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from fcp_data.readers.synth import make_shards

    out: Path = args.output
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"-o {out} exists and is not a directory")
    out.parent.mkdir(parents=True, exist_ok=True)
    # shards are written beside the output and moved in only when all of them are complete, so
    # a failure (PyAV missing for the videos, a full disk, Ctrl-C) leaves no partial shard set
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    from fcp_data.progress import Progress

    try:
        with Progress("fcp make-shards", args.text + args.video, unit="samples") as bar:
            written = make_shards(
                tmp,
                text=args.text,
                video=args.video,
                seed=args.seed,
                samples_per_shard=args.samples_per_shard,
                time_scale=args.time_scale,
                progress=bar,
            )
        out.mkdir(exist_ok=True)
        paths = []
        for path in written:
            os.replace(path, out / path.name)
            paths.append(out / path.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    Console().print(f"wrote {len(paths)} shards to {args.output}", soft_wrap=True)
    return 0
