"""Subcommands of `fcp`: one module each, discovered by `fcp.cli`."""
