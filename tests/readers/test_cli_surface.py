"""`fcp index` and `fcp make-shards` options are a public surface: changes are deliberate."""

from __future__ import annotations

import argparse

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fcp.cli import build_parser
from fcp_data.vision.families import closest_grid


def _options(name: str) -> set[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    cmd = sub.choices[name]
    assert cmd.description and len(cmd.description) > 80  # a real description, not a stub
    return {s for a in cmd._actions for s in a.option_strings}


def test_index_options_frozen() -> None:
    assert _options("index") == {
        "-h",
        "--help",
        "-o",
        "--output",
        "--vision-rule",
        "--rule-option",
        "--tokenizer",
        "--text-field",
        "--text-special-tokens",
        "--video-attention",
        "--on-error",
        "--max-consecutive-failures",
        "--probe-backend",
        "--probe-timeout",
        "--stream-timeout",
        "--stream-max-bytes",
        "--workers",
        "--store-tokens",
        "--no-store",
    }


def test_make_shards_options_frozen() -> None:
    assert _options("make-shards") == {
        "-h",
        "--help",
        "-o",
        "--output",
        "--text",
        "--video",
        "--seed",
        "--samples-per-shard",
        "--time-scale",
        "--overwrite",
    }


def test_rule_option_needs_key_value(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    from fcp.cli import main

    assert main(["index", str(tmp_path), "-o", str(tmp_path / "i"), "--rule-option", "oops"]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err


@given(w=st.integers(1, 6000), h=st.integers(1, 6000), lo=st.integers(1, 4), hi=st.integers(4, 12))
def test_internvl_grid_within_bounds(w: int, h: int, lo: int, hi: int) -> None:
    cols, rows = closest_grid(w, h, min_num=lo, max_num=hi)
    assert lo <= cols * rows <= hi or (cols, rows) == (1, 1)
    # no candidate grid is strictly closer in aspect ratio
    best = abs(w / h - cols / rows)
    for i in range(1, hi + 1):
        for j in range(1, hi + 1):
            if lo <= i * j <= hi:
                assert abs(w / h - i / j) >= best - 1e-12


def test_internvl_grid_rejects_bad_bounds() -> None:
    with pytest.raises(ValueError, match="1 <= min <= max"):
        closest_grid(10, 10, min_num=3, max_num=2)
