"""examples/grpo_logprobs.py: GRPO log-probs, clipped loss and gradients via fcp equal 1 process.

Its `main()` runs here as its second documented command (`--replicas 4 --capacity 200`: 4
spawned gloo replicas, the real planner with the shipped `cpu-small` profile: a degree-2 CP
group, degree-1 groups and a wave two replicas sit out; on its 3-replica default the profile's
measured ring price fills every slot, [[2, 1], [1, 1, 1]], and no placeholder would run). Per-token
log-probs of the behaviour and the current policy gathered in sample order, the clipped
policy-gradient loss and every gradient after the sum over replicas must match the plain
models run in this process, one whole sequence at a time, to 1e-5 relative. It costs about 41
CPU-seconds (measured), most of them four processes importing torch and transformers.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
from e2e_helpers import REPO


def test_grpo_example_matches_the_single_process_model(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.syspath_prepend(str(REPO / "examples"))  # the spawned replicas import it too
    example = importlib.import_module("grpo_logprobs")
    assert Path(example.__file__).parent == REPO / "examples"
    res = example.main(["--replicas", "4", "--capacity", "200"])
    fcp, ref = res["fcp"], res["reference"]
    degrees = [d for wave in fcp["waves"] for d in wave]
    assert max(degrees) >= 2, fcp["waves"]  # ring attention over a CP group
    assert fcp["idle"] >= 1, fcp["waves"]  # a placeholder micro-batch ran
    assert len(set(fcp["digests"])) == 1  # every replica planned the same batch alike
    assert fcp["groups_agree"]  # gather_sequences == all_gather_sequences, bit for bit
    for key in ("old_logprobs", "logprobs"):  # behaviour and current policy, every token
        assert len(fcp[key]) == len(ref[key]) == 8
        for got, want in zip(fcp[key], ref[key]):
            assert got.shape == want.shape
            assert float((got - want).norm()) <= 1e-5 * float(want.norm()), key
    assert res["loss_rel"] <= 1e-5, res["loss_rel"]
    assert res["grads_rel"] <= 1e-5, res["grads_rel"]
    assert set(fcp["grads"]) == set(ref["grads"])
    assert 0 < fcp["clipped"] < fcp["loss_tokens"]  # the clip was exercised, not everywhere
    out = capsys.readouterr().out
    assert "the same on every replica: True" in out and "max relative difference" in out
