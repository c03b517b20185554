"""Subcommands of `fcp`: one module each, discovered by `fcp_data.cli`."""
