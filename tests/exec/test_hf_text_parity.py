"""Tiny transformers Qwen3 and Llama through fcp (registered ring attention) equal one process.

4 real gloo processes, the loader's micro-batches under an explicit mixed plan (degree 3 +
degree 1, then 2 + 2), rank-local 1-D positions; loss and every gradient after the sum over
replicas agree with the unsharded model (sdpa, one sample at a time) to 1e-5 relative.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ._dist import run_distributed
from ._hf_text_job import KINDS, build_text_data, make_text_model, text_reference, text_worker


def test_qwen3_and_llama_loss_and_gradients_match_the_single_process_model(
    tmp_path: Path,
) -> None:
    index, tok = build_text_data(tmp_path)
    states = {}
    for seed, kind in enumerate(KINDS):
        states[kind] = str(tmp_path / f"{kind}.pt")
        torch.save(make_text_model(kind, seed=3 + seed).state_dict(), states[kind])
    out = tmp_path / "fcp.pt"
    run_distributed(text_worker, 4, str(index), str(tok), states, str(out), timeout=300)
    results = torch.load(out, weights_only=True)
    for kind in KINDS:
        got = results[kind]
        assert got["degrees"] == [3, 2]  # rank 0: the degree-3 group, then a degree-2 group
        ref_loss, ref_grads = text_reference(index, tok, kind, Path(states[kind]))
        assert abs(got["loss"] - ref_loss) <= 1e-5 * abs(ref_loss), kind
        assert set(got["grads"]) == set(ref_grads)
        for name, g in ref_grads.items():
            err = float((got["grads"][name] - g).norm() / g.norm())
            assert err <= 1e-5, (kind, name, err)
