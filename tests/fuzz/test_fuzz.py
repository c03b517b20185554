"""The fuzz harness inside `make test`: a short seeded pass of every target, and its corpus.

`make fuzz` (tests/fuzz/run.py) runs each target for a bounded time with fresh seeds; here
each runs EXAMPLES inputs from a fixed seed (hypothesis `derandomize`), a few seconds for all
of them, so the suite stays deterministic. Every case the fuzzer found is kept in
`corpus/<target>/` and replayed here: each one failed before its fix (the file says what it
found), so these are the regression tests of those fixes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from targets import TARGETS, Finding, from_json, guard

EXAMPLES = 40
CORPUS = Path(__file__).resolve().parent / "corpus"


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_a_seeded_pass_finds_nothing(name: str, tmp_path: Path) -> None:
    target = TARGETS[name]
    tried: list[int] = []

    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(target.strategy)
    def run(value: object) -> None:
        tried.append(1)
        with guard():
            target.check(value, tmp_path)

    run()
    assert len(tried) >= EXAMPLES // 2  # the target really ran (not filtered away)


CASES = sorted(CORPUS.glob("*/*.json"))


@pytest.mark.parametrize("path", CASES, ids=[f"{p.parent.name}/{p.stem}" for p in CASES])
def test_every_found_case_stays_fixed(path: Path, tmp_path: Path) -> None:
    name = path.parent.name
    doc = json.loads(path.read_text())
    assert doc["finding"]  # what it found, in words
    with guard():
        TARGETS[name].check(from_json(name, doc["input"]), tmp_path)


def test_the_corpus_is_not_empty_and_names_real_targets() -> None:
    assert len(CASES) >= 5
    assert {p.parent.name for p in CASES} <= set(TARGETS)


def test_a_finding_is_raised_for_a_raw_error(tmp_path: Path) -> None:
    """The oracle is not vacuous: a parser that lets a raw error out is a Finding."""
    from targets import _allowed

    def broken() -> None:
        raise KeyError("a raw error")

    with pytest.raises(Finding, match="KeyError"):
        _allowed(broken)
