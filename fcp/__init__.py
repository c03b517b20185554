"""fcp, the application over the two libraries: the `fcp` command line and what it runs.

`fcp_data` (the input side) and `fcp_exec` (the training side) are libraries a training job
imports; this package is what a person runs: `cli` and its `commands`, the bundled `demo`,
and `profiling` (measuring this machine into a cost profile, the ring timing included). It
may import both libraries; neither ever imports it.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """`fcp ARGS...` as a function; the command line loads only when called, so importing
    `fcp` stays light and `python -m fcp.cli` finds `fcp.cli` not yet imported."""
    from .cli import main as run

    return run(argv)
