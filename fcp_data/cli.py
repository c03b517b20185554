"""The `fcp` command line: one entry point, one module per subcommand in `fcp_data.commands`.

Each module there defines `register(subparsers)` that adds its parser and sets `func` (a
callable taking the parsed args and returning an exit code). Modules are discovered when `main`
runs, not at import.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Sequence

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    from . import commands

    parser = argparse.ArgumentParser(
        prog="fcp",
        description=(
            "Flexible Context Parallelism: plan and feed long-context training on long-tailed "
            "data. Run `fcp COMMAND --help` for each command."
        ),
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from .errors import FCPError

    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except (FCPError, ValueError, FileNotFoundError) as exc:
        print(f"fcp {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
