"""`fcp make-shards -o OUT --text N --video M`: write real sample shards for demos and tests.

A folder that already holds anything is refused unless --overwrite: new shards beside old ones
made docs/cli.md's first block index 220 samples instead of the 64 it asks for (one issue
report), because `fcp index 'out/shards/*.tar'` reads every shard in the folder. --overwrite
replaces the folder's shards (its *.tar files) once the new set is complete; other files stay.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

from fcp_data.errors import ConfigError

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
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the shards (*.tar) of a non-empty -o folder (without it: refused)",
    )
    p.set_defaults(func=run)


def check_output(out: Path, *, overwrite: bool) -> list[Path]:
    """The old shards --overwrite replaces ([] for a new or empty folder); ConfigError for a
    non-empty folder without --overwrite (one line: what is there, and the two fixes)."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"-o {out} exists and is not a directory; name a folder for the shards")
    entries = sorted(out.iterdir()) if out.is_dir() else []
    if entries and not overwrite:
        raise ConfigError(
            f"-o {out} is not empty ({len(entries)} entries, e.g. {entries[0].name}): new shards "
            f"beside old ones would all be indexed by `fcp index '{out}/*.tar'`; pass "
            "--overwrite to replace its shards, or name a new folder"
        )
    return [e for e in entries if e.suffix == ".tar" and e.is_file()]


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from fcp_data.readers.synth import make_shards

    out: Path = args.output
    old = check_output(out, overwrite=args.overwrite)
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
        for path in old:  # the new set is complete: only now do the old shards go
            path.unlink()
        paths = []
        for path in written:
            os.replace(path, out / path.name)
            paths.append(out / path.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    replaced = f" (replaced {len(old)} old shards)" if old else ""
    Console().print(f"wrote {len(paths)} shards to {args.output}{replaced}", soft_wrap=True)
    return 0
