"""`make fuzz`: run every fuzz target for a bounded time and report what each tried and found.

    python tests/fuzz/run.py --seconds 60                 # every target, 60 s each
    python tests/fuzz/run.py --targets tar jsonl --seed 7

Each target (targets.py) runs in rounds of `--round` hypothesis examples, a new seed per round,
until its time is spent; a round that finds a case stops that target: hypothesis shrinks the
input first, and the smallest failing input is written to `out/fuzz/found/` (move it into
`tests/fuzz/corpus/<target>/` once fixed: `test_fuzz.py` replays the corpus in `make test`).
The table printed at the end (and `--json`) gives inputs tried, seconds and findings per
target: the figures docs/reliability.md quotes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from hypothesis import HealthCheck, given, seed, settings
from targets import TARGETS, Finding, guard, to_json

FOUND = Path(__file__).resolve().parents[2] / "out" / "fuzz" / "found"


class _Hang(BaseException):
    """A hang, raised past hypothesis: shrinking would re-run 20 s inputs for many minutes
    (hypothesis lets BaseExceptions through unshrunk), so a hang is kept as it was drawn."""


def _run_target(name: str, seconds: float, first_seed: int, per_round: int) -> dict[str, Any]:
    target = TARGETS[name]
    tried = 0
    failing: list[Any] = []
    rounds = 0
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"fcp-fuzz-{name}-") as tmp:
        work = Path(tmp)

        def one(value: Any) -> None:
            nonlocal tried
            tried += 1
            try:
                with guard():
                    target.check(value, work)
            except Finding as exc:
                failing[:] = [value]
                if str(exc).startswith("hang:"):
                    raise _Hang(str(exc)) from exc
                raise

        while time.monotonic() - start < seconds:
            test = settings(
                max_examples=per_round,
                database=None,
                deadline=None,
                suppress_health_check=list(HealthCheck),
            )(given(target.strategy)(one))
            try:
                seed(first_seed + rounds)(test)()
            except (Exception, _Hang) as exc:  # a Finding, or hypothesis' report of one
                if not failing:
                    raise
                FOUND.mkdir(parents=True, exist_ok=True)
                doc = to_json(name, failing[0])
                text = json.dumps(doc, sort_keys=True)
                path = FOUND / f"{name}-{hashlib.sha256(text.encode()).hexdigest()[:10]}.json"
                path.write_text(json.dumps({"finding": str(exc)[:500], "input": doc}, indent=1))
                return _row(name, tried, time.monotonic() - start, rounds + 1, str(path))
            rounds += 1
    return _row(name, tried, time.monotonic() - start, rounds, None)


def _row(name: str, tried: int, secs: float, rounds: int, found: str | None) -> dict[str, Any]:
    return {"target": name, "inputs": tried, "seconds": round(secs, 1), "rounds": rounds,
            "found": found}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="time per target (default 60)")
    ap.add_argument("--targets", nargs="*", default=sorted(TARGETS), choices=sorted(TARGETS))
    ap.add_argument("--seed", type=int, default=0, help="seed of the first round (default 0)")
    ap.add_argument("--round", type=int, default=200, help="examples per round (default 200)")
    ap.add_argument("--json", type=Path, default=None, help="also write the table here")
    args = ap.parse_args(argv)
    rows = []
    for name in args.targets:
        row = _run_target(name, args.seconds, args.seed, args.round)
        rows.append(row)
        print(
            f"{name:14s} {row['inputs']:8d} inputs {row['seconds']:7.1f} s  "
            f"{'FOUND ' + row['found'] if row['found'] else 'nothing found'}",
            flush=True,
        )
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 1 if any(r["found"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
