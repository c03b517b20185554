"""Progress of long commands, on a terminal and off it.

On a terminal a rich bar shows the count, the rate and the time left. Off a terminal (CI logs,
`nohup`, a pipe) a bar prints nothing until the end, so a long `fcp index` looked hung: there
a plain line is printed every `every_s` seconds (10 by default) and once at the end, e.g.

    fcp index: 12/40 shards (30%), 48,210 samples, 1.9 shards/s, ~15 s left (6.3 s)

One object per command; `advance` is called from the thread that owns it.
"""

from __future__ import annotations

import sys
import time
from typing import IO, Any

__all__ = ["Progress"]


class Progress:
    """Count `total` units of work (`unit`, e.g. "shards"), with an optional second count
    (`extra`, e.g. "samples") summed from `advance(extra=...)`."""

    def __init__(
        self,
        what: str,
        total: int,
        *,
        unit: str,
        extra: str = "",
        every_s: float = 10.0,
        stream: IO[str] | None = None,
        terminal: bool | None = None,
    ) -> None:
        self.what, self.total, self.unit, self.extra = what, int(total), unit, extra
        self.every_s = float(every_s)
        self.stream = stream if stream is not None else sys.stderr
        isatty = getattr(self.stream, "isatty", None)
        self.terminal = bool(isatty and isatty()) if terminal is None else terminal
        self.done = 0
        self.extra_done = 0
        self._t0 = time.perf_counter()
        self._last = self._t0
        self._bar: Any = None
        self._task: Any = None

    def __enter__(self) -> Progress:
        if self.terminal:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TaskProgressColumn,
                TextColumn,
                TimeRemainingColumn,
            )
            from rich.progress import Progress as Bar

            self._bar = Bar(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TaskProgressColumn(),
                TextColumn("{task.fields[rate]}"),
                TimeRemainingColumn(),
                console=Console(file=self.stream),
                transient=False,
            )
            self._bar.start()
            self._task = self._bar.add_task(self.what, total=self.total, rate="")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()
        elif exc[0] is None:
            self._line(time.perf_counter())

    def advance(self, n: int = 1, *, extra: int = 0) -> None:
        self.done += int(n)
        self.extra_done += int(extra)
        now = time.perf_counter()
        if self._bar is not None:
            self._bar.update(self._task, advance=n, rate=self._rate(now))
        elif now - self._last >= self.every_s:
            self._line(now)

    def _rate(self, now: float) -> str:
        elapsed = max(now - self._t0, 1e-9)
        return f"{self.done / elapsed:.3g} {self.unit}/s"

    def line(self, now: float | None = None) -> str:
        """The plain progress line (what is printed off a terminal)."""
        now = time.perf_counter() if now is None else now
        elapsed = now - self._t0
        share = f" ({self.done / self.total:.0%})" if self.total else ""
        parts = [f"{self.what}: {self.done}/{self.total} {self.unit}{share}"]
        if self.extra:
            parts.append(f"{self.extra_done:,} {self.extra}")
        parts.append(self._rate(now))
        if 0 < self.done < self.total:
            left = elapsed / self.done * (self.total - self.done)
            parts.append(f"~{left:.0f} s left")
        return ", ".join(parts) + f" ({elapsed:.1f} s)"

    def _line(self, now: float) -> None:
        self._last = now
        print(self.line(now), file=self.stream, flush=True)
