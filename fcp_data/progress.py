"""Progress of long commands, on a terminal and off it.

On a terminal a rich bar shows the count, the rate and the time left. Off a terminal (CI logs,
`nohup`, a pipe) a bar prints nothing until the end, so a long `fcp index` looked hung: there
a plain line is printed every `every_s` seconds (10 by default) and once at the end, e.g.

    fcp index: 12/40 shards (30%), 48,210 samples, 1.9 shards/s, ~15 s left (6.3 s)

With `unit="bytes"` the counts read as sizes (`fcp index` counts bytes read inside every
file, so one 55 MB JSON Lines file is not silent until done), and a total of 0 means unknown
(remote or `pipe:` shards): no share and no time left. The closing line is printed only when
something moved since the last one (a one-file index used to print its last line twice).

One object per command; `advance` is called from the thread that owns it.
"""

from __future__ import annotations

import sys
import time
from typing import IO, Any

__all__ = ["Progress", "human_bytes"]


def human_bytes(n: float) -> str:
    """`n` bytes as "512 B", "3.4 kB", "55.0 MB", "1.20 GB" (decimal units, as `ls -h --si`)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            value = n / scale
            return f"{value:.2f} {unit}" if unit == "GB" else f"{value:.1f} {unit}"
    return f"{n:.0f} B"


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
        self._printed: tuple[int, int] | None = None  # (done, extra_done) of the last line
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

            count = MofNCompleteColumn()
            if self.unit == "bytes":
                from rich.progress import DownloadColumn

                count = DownloadColumn()
            self._bar = Bar(
                TextColumn("{task.description}"),
                BarColumn(),
                count,
                TaskProgressColumn(),
                TextColumn("{task.fields[rate]}"),
                TimeRemainingColumn(),
                console=Console(file=self.stream),
                transient=False,
            )
            self._bar.start()
            self._task = self._bar.add_task(self.what, total=self.total or None, rate="")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()
        elif exc[0] is None and self._printed != (self.done, self.extra_done):
            self._line(time.perf_counter())

    def advance(self, n: int = 1, *, extra: int = 0) -> None:
        self.done += int(n)
        self.extra_done += int(extra)
        now = time.perf_counter()
        if self._bar is not None:
            rate = self._rate(now)
            if self.extra:
                rate = f"{self.extra_done:,} {self.extra}, {rate}"
            self._bar.update(self._task, advance=n, rate=rate)
        elif now - self._last >= self.every_s:
            self._line(now)

    def _count(self, n: float) -> str:
        return human_bytes(n) if self.unit == "bytes" else f"{n:.0f}"

    def _rate(self, now: float) -> str:
        elapsed = max(now - self._t0, 1e-9)
        if self.unit == "bytes":
            return f"{human_bytes(self.done / elapsed)}/s"
        return f"{self.done / elapsed:.3g} {self.unit}/s"

    def line(self, now: float | None = None) -> str:
        """The plain progress line (what is printed off a terminal)."""
        now = time.perf_counter() if now is None else now
        elapsed = now - self._t0
        share = f" ({self.done / self.total:.0%})" if self.total else ""
        unit = "" if self.unit == "bytes" else f" {self.unit}"
        done = self._count(self.done)
        of = f"/{self._count(self.total)}" if self.total or self.unit != "bytes" else ""
        parts = [f"{self.what}: {done}{of}{unit}{share}"]
        if self.extra:
            parts.append(f"{self.extra_done:,} {self.extra}")
        parts.append(self._rate(now))
        if 0 < self.done < self.total:
            left = elapsed / self.done * (self.total - self.done)
            parts.append(f"~{left:.0f} s left")
        return ", ".join(parts) + f" ({elapsed:.1f} s)"

    def _line(self, now: float) -> None:
        self._last = now
        self._printed = (self.done, self.extra_done)
        print(self.line(now), file=self.stream, flush=True)
