"""The set-up every benchmark script shares: its options, where results go, how they are written.

A benchmark whose figures are quoted in BENCHMARKS.md must say when and how they were measured,
so every script writes the same record beside its own figures: the date, the exact command and
the load average of the machine (figures taken on a loaded box read differently). Every script
also has `--quick`, tiny sizes that finish in seconds: `tests/test_bench_quick.py` runs each
one that way, so a script that no longer matches the library fails a test instead of rotting.
A quick run proves the script runs; its figures are not measurements.

The loader benchmarks also share two fixtures: a byte tokenizer both pipelines use (so the
comparison is of loaders, not tokenizers) and a local HTTP server honouring range requests
(what a remote shard store answers).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import sys
from collections.abc import Iterable, Sequence
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # rich is imported where a table is printed: the device box may lack it
    from rich.console import Console

__all__ = [
    "RESULTS",
    "ROOT",
    "ByteTokenizer",
    "RangeHandler",
    "console",
    "make_parser",
    "out_path",
    "print_table",
    "run_facts",
    "write_json",
]

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
# where a quick run writes when no --out is given: never over a real measurement
QUICK_RESULTS = ROOT / "out" / "bench-quick"


def make_parser(doc: str | None) -> argparse.ArgumentParser:
    """The parser every script starts from: its docstring as help, `--quick` and `--out`.

    `--out` also answers to `--output` and `--json`, so commands written with either still run.
    """
    ap = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes, a few seconds: proves the script runs (not a measurement)",
    )
    ap.add_argument(
        "-o",
        "--out",
        "--output",
        "--json",
        dest="out",
        type=Path,
        default=None,
        help="the JSON to write (default bench/results/<script>.json; out/bench-quick/ if quick)",
    )
    return ap


def out_path(args: argparse.Namespace, name: str) -> Path:
    """Where this run's JSON goes: `--out`, else the results folder (quick runs apart)."""
    if args.out is not None:
        return Path(args.out)
    return (QUICK_RESULTS if args.quick else RESULTS) / f"{name}.json"


def run_facts(quick: bool) -> dict[str, Any]:
    """When, how and on what a run was made: the record BENCHMARKS.md quotes beside a figure."""
    script = Path(sys.argv[0])
    try:
        shown = script.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        shown = str(script)
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join(["python", shown, *sys.argv[1:]]),
        "load_average": [round(x, 2) for x in load],
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "quick": quick,
    }


def _plain(value: Any) -> Any:
    """JSON for what `json` cannot write itself: numpy scalars and arrays as numbers, the rest
    (paths, dtypes, devices) as their text."""
    if hasattr(value, "tolist"):
        return value.tolist()
    try:
        return float(value)
    except (TypeError, ValueError):
        return str(value)


def write_json(path: Path, payload: dict[str, Any], *, quick: bool) -> Path:
    """Write `payload` with the run's facts under "run"; say where."""
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"run": run_facts(quick), **payload}
    path.write_text(json.dumps(record, indent=1, default=_plain) + "\n")
    print(f"wrote {path}")
    return path


def console() -> Console:
    """A console wide enough for the widest table the scripts print."""
    from rich.console import Console

    return Console(width=220)


def print_table(
    title: str,
    columns: Sequence[str],
    rows: Iterable[Sequence[Any]],
    *,
    out: Console | None = None,
) -> None:
    """Print one table: a title, its column names, and rows of already formatted cells."""
    from rich.table import Table

    table = Table(title=title)
    for i, name in enumerate(columns):
        table.add_column(name, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*(str(cell) for cell in row))
    (out or console()).print(table)


class ByteTokenizer:
    """utf-8 bytes + 1 as ids: exact, fast, picklable; the same in every pipeline compared."""

    spec = "bench:bytes+1"

    def __call__(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64) + 1


class RangeHandler(BaseHTTPRequestHandler):
    """Serves files under `server.root` (or the class's `root`), honouring `Range: bytes=a-b`."""

    protocol_version = "HTTP/1.1"
    root = Path(".")

    def log_message(self, *args: object) -> None:
        pass

    def do_HEAD(self) -> None:
        self._serve(head=True)

    def do_GET(self) -> None:
        self._serve(head=False)

    def answered(self, head: bool, nbytes: int) -> None:
        """Called once per request before the answer (a subclass counts requests here)."""

    def _serve(self, *, head: bool) -> None:
        path = getattr(self.server, "root", self.root) / self.path.lstrip("/")
        size = path.stat().st_size
        m = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range") or "")
        start, end = (int(m.group(1)), int(m.group(2) or size - 1) + 1) if m else (0, size)
        end = min(end, size)
        self.answered(head, end - start)
        self.send_response(206 if m else 200)
        self.send_header("Content-Length", str(end - start))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", f'"{size:x}-{path.stat().st_mtime_ns:x}"')
        if m:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        self.end_headers()
        if not head:
            with open(path, "rb") as f:
                f.seek(start)
                self.wfile.write(f.read(end - start))
