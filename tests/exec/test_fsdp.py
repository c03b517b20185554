"""fcp under FSDP2 (fully_shard) and HSDP equals one process: loss and every gradient.

One spawn of 4 real gloo processes runs both cases on the same micro-batches: a tiny
transformers Qwen3 with "fcp_ring" attention and activation checkpointing, fully_shard per
decoder layer and the root (FSDP: a 1-D mesh of 4; HSDP: 2 replicate x 2 shard), an explicit
plan in which replica 3 sits wave 1 out and trains the loader's placeholder. The gathered
gradients match the single-process sdpa model to 1e-5 relative only if FSDP sums over the 4
ranks (its default mean would leave them 4x too small) and the placeholder runs (skipping it
leaves the other ranks waiting in the next all-gather: the run's deadline fails the test).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fcp_data.errors import ConfigError
from fcp_exec.fsdp import fsdp_sum_gradients, fully_shard_for_fcp

from ._dist import run_distributed
from ._fsdp_job import CASES, fsdp_worker, make_idle_loader
from ._hf_text_job import build_text_data, make_text_model, text_reference

# (degree, is_placeholder) per rank and wave, from WAVES in _fsdp_job
EXPECTED_MICRO_BATCHES = [
    [(3, False), (2, False)],
    [(3, False), (2, False)],
    [(3, False), (1, False)],
    [(1, False), (1, True)],
]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp(min=1e-30))


def test_fsdp_and_hsdp_gradients_match_the_single_process_model(tmp_path: Path) -> None:
    index, tok = build_text_data(tmp_path)
    rank3 = [mb.is_placeholder for mb in make_idle_loader(index, tok, 4, 3)]
    assert rank3 == [False, True], "the plan gives replica 3 no idle wave: vacuous"
    state = tmp_path / "qwen3.pt"
    torch.save(make_text_model("qwen3", seed=11).state_dict(), state)
    out = tmp_path / "fsdp.pt"
    run_distributed(fsdp_worker, 4, str(index), str(tok), str(state), str(out), timeout=200)
    got = torch.load(out, weights_only=True)
    (refusal,) = got["refusals"]
    assert "not sharded by any FSDPModule" in refusal and "1.weight" in refusal
    assert got["ignored_tower_error"] <= 1e-6  # a part FSDP ignores, summed by fcp
    ref_loss, ref_grads = text_reference(index, tok, "qwen3", state)
    assert all(float(g.norm()) > 0 for g in ref_grads.values()), "a zero reference gradient"
    placements = {"fsdp": ["(Shard(dim=0),)"], "hsdp": ["(Replicate(), Shard(dim=0))"]}
    for case in CASES:
        res = got[case]
        assert [[tuple(x) for x in r] for r in res["micro_batches"]] == EXPECTED_MICRO_BATCHES
        assert res["placements"] == placements[case], res["placements"]
        assert res["fsdp_units"] == 3  # 2 decoder layers + the root
        assert res["attention_calls"] == 4, "activation checkpointing did not recompute"
        assert abs(res["loss"] - ref_loss) <= 1e-5 * abs(ref_loss), (case, res["loss"], ref_loss)
        assert set(res["grads"]) == set(ref_grads)
        worst = max((_rel(res["grads"][n], g), n) for n, g in ref_grads.items())
        assert worst[0] <= 1e-5, (case, worst)


def test_helpers_refuse_a_model_that_is_not_sharded() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    with pytest.raises(ConfigError, match="not fully_shard-ed"):
        fsdp_sum_gradients(model)
    with pytest.raises(ConfigError, match="layers is empty"):
        fully_shard_for_fcp(model, layers=[])
    with pytest.raises(ConfigError, match=r"layers\[0\] \(Linear\) is not a submodule"):
        fully_shard_for_fcp(model, layers=[torch.nn.Linear(2, 2)])
