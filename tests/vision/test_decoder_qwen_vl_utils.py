"""Oracle: qwen-vl-utils' own frame indices, decoded per CP member, equal the same frames of a
whole sequential decode, on clips with a short GOP, one keyframe, B-frames and a variable
frame rate.

qwen-vl-utils samples `smart_nframes(...)` frames at `linspace(0, total - 1, n).round()` and
decodes the whole video on every rank; fcp's members decode only the GOPs holding their
tubelets. The indices here come from qwen-vl-utils itself (its pure functions, imported with an
empty torchvision stand-in: `vision_helpers.qwen_vl_utils_vision_process`), split into the
zigzag chunks of every member of d = 2, 3, 4.
"""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch
from test_decoder import CLIPS, FPS, H, N, W, _held_chunks, clips  # noqa: F401 (fixture)
from vision_helpers import qwen_vl_utils_vision_process

from fcp_data.vision.decode import DecodeStats, decode_video_frames
from fcp_data.vision.families import get_rule


@pytest.fixture(scope="module")
def vp() -> types.ModuleType:
    return qwen_vl_utils_vision_process()


@pytest.mark.parametrize("clip", list(CLIPS))
def test_members_decode_qwen_vl_utils_frames_exactly(clips, vp, clip: str) -> None:  # noqa: F811
    data, whole, _gop = clips[clip]
    n = vp.smart_nframes({}, total_frames=N, video_fps=FPS)
    oracle = torch.linspace(0, N - 1, n).round().long().tolist()
    vt = get_rule("qwen2.5-vl").video(num_frames=N, fps=FPS, height=H, width=W)
    assert list(vt.frame_indices) == oracle  # the index's frames are qwen-vl-utils'
    checked = 0
    for degree in (2, 3, 4):
        for member in range(degree):
            wanted = [f for chunk in _held_chunks(tuple(oracle), vt, degree, member) for f in chunk]
            if not wanted:
                continue
            stats = DecodeStats()
            got = decode_video_frames(data, wanted, (H, W), backend="pyav", stats=stats)
            np.testing.assert_array_equal(got, whole[wanted])
            assert stats.frames_decoded <= N
            checked += 1
    assert checked >= 2 + 3 + 3  # members holding at least one tubelet
