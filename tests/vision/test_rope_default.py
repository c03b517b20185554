"""`VisionOptions(next_text="auto")`, the default, follows the installed transformers by behaviour.

The oracle is transformers' own `get_rope_index` on the tiny offline Qwen2/2.5-VL models (the
same as tests/vision/test_positions.py), on clips long enough that the two conventions differ.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from test_positions import CLIPS, TEXT_CFG, _sample, qwen25  # noqa: F401 (fixture)

from fcp_data.errors import ConfigError
from fcp_data.vision import TokenizerText, VisionOptions, mrope_positions, rope_check
from fcp_data.vision.families import get_rule
from fcp_data.vision.options import family_spec
from fcp_data.vision.rope_check import RopeProbe, probe_next_text, resolve_next_text

LONG = [(240, 24.0, 56, 56), (600, 30.0, 112, 112)]  # t ids pass the spatial extent here


def test_default_equals_transformers_get_rope_index_qwen25(tok, qwen25) -> None:  # noqa: F811
    rule = get_rule("qwen2.5-vl", text_counter=lambda s: len(TokenizerText(tok)(s)))
    differ = 0
    for n, fps, h, w in CLIPS + LONG:
        vt = rule.video(num_frames=n, fps=fps, height=h, width=w)
        em, ids, types = _sample(tok, "qwen2.5-vl", 2, vt, VisionOptions(), n, fps)
        spg = 2 / (len(vt.frame_indices) / n * fps)
        want, _ = qwen25.get_rope_index(
            ids,
            types,
            video_grid_thw=torch.tensor([vt.grid]),
            second_per_grid_ts=torch.tensor([spg]),
        )
        np.testing.assert_array_equal(em.mrope, want[:, 0].numpy(), err_msg=str((n, fps)))
        other = _sample(tok, "qwen2.5-vl", 2, vt, VisionOptions(next_text="max+1"), n, fps)[0]
        differ += not np.array_equal(other.mrope, em.mrope)
    assert differ >= 2  # the check has teeth: the old default would have failed it


def test_default_equals_transformers_get_rope_index_qwen2vl(tok) -> None:
    from transformers import Qwen2VLConfig, Qwen2VLModel

    cfg = Qwen2VLConfig(
        text_config={**TEXT_CFG, "rope_scaling": {"type": "mrope", "mrope_section": [2, 1, 1]}},
        vision_config=dict(depth=1, embed_dim=16, hidden_size=32, num_heads=2, mlp_ratio=2),
    )
    model = Qwen2VLModel(cfg).eval()
    rule = get_rule("qwen2-vl", text_counter=lambda s: len(TokenizerText(tok)(s)))
    for n, fps, h, w in CLIPS + LONG:
        vt = rule.video(num_frames=n, fps=fps, height=h, width=w)
        em, ids, types = _sample(tok, "qwen2-vl", 2, vt, VisionOptions(), n, fps)
        want, _ = model.get_rope_index(ids, types, video_grid_thw=torch.tensor([vt.grid]))
        np.testing.assert_array_equal(em.mrope, want[:, 0].numpy(), err_msg=str((n, fps)))


class _Stub:
    """A stand-in model whose get_rope_index returns `shift`-adjusted ids of one convention."""

    def __init__(self, mode: str, rule: str, shift: int = 0, new_signature: bool = True) -> None:
        self.mode, self.rule, self.shift, self.new = mode, rule, shift, new_signature
        self.calls: list[dict] = []

    def get_rope_index(self, input_ids, mm_token_type_ids=None, video_grid_thw=None, **kw):
        self.calls.append({"types": mm_token_type_ids, **kw})
        interval = 2.0 if self.rule == "qwen2.5-vl" else 1.0
        length, layouts, _ = rope_check._probe_layout(interval)
        ids = mrope_positions(length, layouts, interval=interval, next_text=self.mode)
        ids[:, -rope_check.PROBE_SUFFIX :] += self.shift
        return torch.from_numpy(ids)[:, None], None


@pytest.mark.parametrize("mode", ["max+1", "spatial"])
@pytest.mark.parametrize("rule", ["qwen2-vl", "qwen2.5-vl"])
def test_probe_detects_each_convention_by_behaviour(mode, rule) -> None:
    stub = _Stub(mode, rule)
    probe = probe_next_text(stub, rule, "stub")
    assert probe.matches == (mode,)
    assert stub.calls[0]["types"] is not None  # 5.x signature: token types passed


def test_probe_against_the_installed_transformers() -> None:
    for rule in ("qwen2-vl", "qwen2.5-vl"):
        probe = rope_check.transformers_next_text(rule)
        assert isinstance(probe, RopeProbe), probe
        assert probe.matches == ("spatial",), probe  # transformers 5.x


@pytest.fixture
def fake_probe(monkeypatch):
    """Replace the cached transformers probe by a given answer; fresh once-only statements."""

    def use(answer):
        monkeypatch.setattr(rope_check, "transformers_next_text", lambda rule: answer)
        rope_check._state.cache_clear()

    yield use
    rope_check._state.cache_clear()


def test_auto_follows_the_probe_and_states_it_once(fake_probe, caplog) -> None:
    spec = family_spec("qwen2.5-vl")
    for mode in ("max+1", "spatial"):
        fake_probe(RopeProbe("qwen2.5-vl", "9.9", (mode,), ""))
        with caplog.at_level(logging.INFO, logger="fcp_data.vision.rope_check"):
            caplog.clear()
            assert [resolve_next_text("auto", spec) for _ in range(5)] == [mode] * 5
        assert len(caplog.records) == 1 and mode in caplog.text and "9.9" in caplog.text


def test_auto_refuses_when_transformers_matches_neither(fake_probe) -> None:
    fake_probe(RopeProbe("qwen2.5-vl", "9.9", (), "max+1: token 52 ours [27] theirs [7]"))
    with pytest.raises(ConfigError, match=r"9\.9.*neither.*token 52"):
        resolve_next_text("auto", family_spec("qwen2.5-vl"))
    # a stub computing a third convention is reported as matching neither
    assert probe_next_text(_Stub("spatial", "qwen2-vl", shift=1), "qwen2-vl").matches == ()


def test_explicit_choice_is_kept_and_warned_once_when_it_differs(fake_probe, caplog) -> None:
    spec = family_spec("qwen2-vl")
    fake_probe(RopeProbe("qwen2-vl", "9.9", ("spatial",), ""))
    with caplog.at_level(logging.INFO, logger="fcp_data.vision.rope_check"):
        assert [resolve_next_text("max+1", spec) for _ in range(3)] == ["max+1"] * 3
        assert resolve_next_text("spatial", spec) == "spatial"  # agrees: no warning
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "'max+1'" in warned[0].getMessage()
    assert "spatial" in warned[0].getMessage()


def test_without_transformers_auto_is_max1_with_one_warning(fake_probe, caplog) -> None:
    fake_probe("transformers' Qwen2VLModel is not usable here (ImportError())")
    with caplog.at_level(logging.WARNING, logger="fcp_data.vision.rope_check"):
        assert resolve_next_text("auto", family_spec("qwen2-vl")) == "max+1"
        assert resolve_next_text("auto", family_spec("qwen2-vl")) == "max+1"
        assert resolve_next_text("spatial", family_spec("qwen2-vl")) == "spatial"
    assert len(caplog.records) == 1 and "not usable" in caplog.text


def test_families_without_a_difference_are_not_probed(fake_probe) -> None:
    fake_probe(None)  # would fail if used
    assert resolve_next_text("auto", family_spec("qwen3-vl")) == "max+1"
    assert resolve_next_text("auto", family_spec("internvl")) == "max+1"
    with pytest.raises(ConfigError, match="next_text='max'"):
        resolve_next_text("max", family_spec("qwen3-vl"))


def test_loader_resolves_auto_before_its_workers_start(tmp_path, tok) -> None:
    from vision_helpers import video_sample, write_shards

    from fcp_data.loader import FCPDataLoader, LoaderOptions
    from fcp_data.planner import Cluster, CostModel
    from fcp_data.readers import build_index
    from fcp_data.readers.scan import ScanConfig

    url = write_shards(tmp_path / "v.tar", [video_sample("v0", 40, 96, 64, 10, seed=0)])
    cfg = ScanConfig(vision_rule="qwen2.5-vl", on_error="raise")
    index = build_index(url, tmp_path / "idx", config=cfg, counter=tok)
    ld = FCPDataLoader(
        index,
        cluster=Cluster(1, tokens_per_replica=int(index.seqlens.max()) + 64),
        cost=CostModel.from_model("qwen3-1.7b", "cpu"),
        replica=0,
        global_batch_size=1,
        num_workers=0,
        tokenizer=tok,
        options=LoaderOptions(vision=VisionOptions()),
    )
    # what workers receive, concrete
    assert ld._builder.encoder.vision_encoder.options.next_text == "spatial"
    assert ld.options.vision.next_text == "auto"  # the user's options are not mutated
