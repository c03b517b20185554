"""The `fcp` command line: one entry point, one module per subcommand in `fcp.commands`.

Each module there defines `register(subparsers)` that adds its parser and sets `func` (a
callable taking the parsed args and returning an exit code). Modules are discovered when `main`
runs, not at import.

Errors: a deliberate error (`fcp_data.errors.FCPError`) and the builtin errors that bad
arguments raise (ValueError, a missing or unreadable file) print as one line,
`fcp COMMAND: error: MESSAGE`, with exit status 2, the status argparse uses for a bad flag.
Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Sequence
from typing import NoReturn

from fcp_data.errors import FCPError

__all__ = ["USAGE_ERRORS", "build_parser", "main", "one_line"]

# what bad input raises: our errors, and the builtins of bad values and missing / unreadable files
USAGE_ERRORS: tuple[type[BaseException], ...] = (FCPError, ValueError, OSError)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fcp")
    except PackageNotFoundError:  # a source tree on PYTHONPATH, not installed
        from fcp_data import __version__

        return __version__


class OneLineParser(argparse.ArgumentParser):
    """argparse with the CLI's error contract: a bad flag is one line and exit status 2.

    argparse's default prints the whole usage block before the error; here the error line
    names the flag and value and points at `--help`, like every other `fcp` error.
    """

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")

    def _get_values(self, action: argparse.Action, arg_strings: list[str]) -> object:
        """argparse drops a lone "--" value (`--workers=--`) and hands the flag an empty
        list, past its type check: a TypeError deep in the command (found by the fuzzer,
        tests/fuzz/corpus/cli_flags). One value is expected: refuse it as a bad value."""
        if action.option_strings and action.nargs is None and arg_strings == ["--"]:
            self.error(f"argument {'/'.join(action.option_strings)}: expected a value, got '--'")
        return super()._get_values(action, arg_strings)


def build_parser() -> argparse.ArgumentParser:
    from . import commands

    parser = OneLineParser(
        prog="fcp",
        description=(
            "Flexible Context Parallelism: plan and feed long-context training on long-tailed "
            "data. Run `fcp COMMAND --help` for each command."
        ),
    )
    parser.add_argument("--version", action="version", version=f"fcp {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        module.register(sub)
    return parser


def one_line(exc: BaseException) -> str:
    """The message of `exc` on one line (its lines joined by "; ")."""
    parts = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return "; ".join(parts) or type(exc).__name__


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except USAGE_ERRORS as exc:
        print(f"fcp {args.command}: error: {one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"fcp {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
