"""The documented `on_error` defaults are the code's: scans skip and count, the loader raises.

A scan (fcp index, ScanConfig, shard specs for `fcp plan --shards` or a Blend) records every
left-out sample in the index header, and the loader counts them per batch; a sample that was
indexed but no longer reads at training time means the data changed, so the loader stops on it
unless told to skip. docs/loader.md and docs/reliability-readers.md say so; this test keeps them
true.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from fcp.cli import build_parser
from fcp_data.loader import LoaderOptions
from fcp_data.loader.global_batch import BatchBuilder
from fcp_data.loader.source import open_source
from fcp_data.readers.errors import ErrorPolicy
from fcp_data.readers.scan import ScanConfig

ROOT = Path(__file__).resolve().parents[2]


def _index_default() -> str:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    index = sub.choices["index"]  # type: ignore[attr-defined]
    return next(a.default for a in index._actions if a.dest == "on_error")


def test_loader_raises_and_scans_skip_by_default() -> None:
    assert LoaderOptions().on_error == "raise"
    assert BatchBuilder.__dataclass_fields__["on_error"].default == "raise"  # type: ignore[attr-defined]
    assert ScanConfig().on_error == "skip"
    assert ErrorPolicy().on_error == "skip"
    assert inspect.signature(open_source).parameters["on_error"].default == "skip"
    assert _index_default() == "skip"


def test_the_docs_state_the_same_defaults() -> None:
    readme = " ".join((ROOT / "docs/loader.md").read_text().split())
    assert 'The loader\'s default, `LoaderOptions(on_error="raise")`' in readme
    assert re.search(r"Scans default to `\"skip\"`", readme)
    assert '`LoaderOptions(on_error="skip")` (the default)' not in readme
    readers = " ".join((ROOT / "docs/reliability-readers.md").read_text().split())
    assert 'The loader\'s own default is `"raise"`' in readers
