"""Properties of the GOP-aware decode plan (`fcp_data.vision.decode.gop.plan_runs`), checked
against a brute-force decoder simulation on random keyframe layouts and wanted sets.

A simulated decoder may start only at a keyframe and produces every frame from there; the plan
must (1) deliver every wanted frame exactly once, in order, (2) start each run at a keyframe
at or before its first frame, (3) never decode more frames than the single-seek decoder it
replaced (seek to the keyframe before the first wanted frame, decode through the last), and
(4) decode at most, per maximal chunk of wanted frames that share no GOP with the one before,
the frames of that chunk's span plus the GOP it starts in: the "1/d + one GOP per held chunk"
bound of the benchmark.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fcp_data.vision.decode.gop import keyframe_at_or_before, plan_runs


@st.composite
def layouts(draw: st.DrawFn) -> tuple[int, list[int], list[int]]:
    n = draw(st.integers(1, 400))
    keys = sorted({0, *draw(st.lists(st.integers(0, n - 1), max_size=12))})
    wanted = sorted(set(draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=40))))
    return n, keys, wanted


def _simulate(runs: list, keys: list[int]) -> tuple[list[int], int]:
    """Frames a decoder following `runs` hands back (the wanted ones) and frames it decodes."""
    got, decoded, position = [], 0, -1  # position: last frame decoded
    for run in runs:
        if run.seek or position < 0:
            assert run.start in keys or run.start == 0
            position = run.start - 1
        assert position + 1 <= run.frames[0]
        for f in range(position + 1, run.stop + 1):
            decoded += 1
            if f in run.frames:
                got.append(f)
        position = run.stop
    return got, decoded


@settings(max_examples=300, deadline=None)
@given(layouts())
def test_plan_delivers_every_frame_once_and_never_decodes_more(layout) -> None:
    _n, keys, wanted = layout
    karr = np.asarray(keys)
    runs = plan_runs(wanted, keys)
    got, decoded = _simulate(runs, keys)
    assert got == wanted
    for run in runs:
        assert run.start == keyframe_at_or_before(karr, run.frames[0])
    one_seek = wanted[-1] - keyframe_at_or_before(karr, wanted[0]) + 1
    assert decoded <= one_seek
    # per chunk of wanted frames (split where a new GOP starts past the previous frame):
    # the chunk's span plus the head of the GOP it starts in
    bound, chunk_start, prev = 0, wanted[0], wanted[0]
    for w in [*wanted[1:], None]:
        if w is None or keyframe_at_or_before(karr, w) > prev + 1:
            bound += prev - keyframe_at_or_before(karr, chunk_start) + 1
            chunk_start = w if w is not None else chunk_start
        if w is not None:
            prev = w
    assert decoded <= bound
