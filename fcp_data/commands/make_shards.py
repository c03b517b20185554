"""`fcp make-shards -o OUT --text N --video M`: write real sample shards for demos and tests."""

from __future__ import annotations

import argparse
from pathlib import Path

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
    p.add_argument("--text", type=int, default=0, help="number of text samples")
    p.add_argument("--video", type=int, default=0, help="number of video samples")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument(
        "--samples-per-shard", type=int, default=64, help="samples per tar shard (default 64)"
    )
    p.add_argument(
        "--time-scale",
        type=float,
        default=0.2,
        help="scale on the video duration profile (default 0.2 keeps clips short)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from fcp_data.readers.synth import make_shards

    paths = make_shards(
        args.output,
        text=args.text,
        video=args.video,
        seed=args.seed,
        samples_per_shard=args.samples_per_shard,
        time_scale=args.time_scale,
    )
    Console().print(f"wrote {len(paths)} shards to {args.output}", soft_wrap=True)
    return 0
