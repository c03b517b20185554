"""A Blend of media sources indexed with other vision rules is refused, by source and setting;
text sources (whatever rule their header records) blend with any media source."""

from __future__ import annotations

import pytest
from vision_helpers import video_sample, write_shards

from fcp_data.errors import IndexMismatchError
from fcp_data.loader import Blend
from fcp_data.readers import build_index
from fcp_data.readers.scan import ScanConfig


def _index(tmp_path, tok, name, rule, samples, **over):
    url = write_shards(tmp_path / f"{name}.tar", samples)
    cfg = ScanConfig(vision_rule=rule, rule_overrides=over, on_error="raise")
    return build_index(url, tmp_path / f"idx-{name}", config=cfg, counter=tok)


def test_media_sources_with_other_rules_are_refused(tmp_path, tok) -> None:
    clip = [video_sample("v0", 12, 64, 48, 6, seed=0)]
    q25 = _index(tmp_path, tok, "q25", "qwen2.5-vl", clip)
    q3 = _index(tmp_path, tok, "q3", "qwen3-vl", [video_sample("w0", 12, 64, 48, 6, seed=1)])
    with pytest.raises(
        IndexMismatchError, match=r"'b' .*idx-q3\).*name: 'qwen2.5-vl' vs 'qwen3-vl'"
    ):
        Blend([q25, q3], weights=[0.5, 0.5], names=["a", "b"])
    # the same rule with other overrides counts other tokens: refused, naming the setting
    small = _index(
        tmp_path,
        tok,
        "small",
        "qwen2.5-vl",
        [video_sample("u0", 12, 64, 48, 6, seed=2)],
        max_frames=4,
    )
    with pytest.raises(IndexMismatchError, match=r"'source1'.*max_frames"):
        Blend([q25, small], weights=[0.5, 0.5])


def test_text_sources_blend_with_any_rule_and_the_media_rule_is_the_blends(tmp_path, tok) -> None:
    text = _index(tmp_path, tok, "t", "qwen2.5-vl", [{"__key__": "t0", "txt": b"a plain text"}])
    q3 = _index(tmp_path, tok, "q3", "qwen3-vl", [video_sample("w0", 12, 64, 48, 6, seed=1)])
    blend = Blend([text, q3], weights=[0.5, 0.5])  # text first: its header says qwen2.5-vl
    assert blend.header.rule["name"] == "qwen3-vl"  # what the loader builds media with
