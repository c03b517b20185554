"""Tiny transformers Qwen3 and Llama through fcp (registered ring attention) equal one process.

4 real gloo processes, the loader's micro-batches under an explicit mixed plan (degree 3 +
degree 1, then 2 + 2), rank-local 1-D positions; loss and every gradient after the sum over
replicas agree with the unsharded model (sdpa, one sample at a time) to 1e-5 relative.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ._dist import run_distributed
from ._hf_text_job import (
    KINDS,
    assert_matches_reference,
    build_text_data,
    save_states,
    text_worker,
)


def test_qwen3_and_llama_loss_and_gradients_match_the_single_process_model(
    tmp_path: Path,
) -> None:
    index, tok = build_text_data(tmp_path)
    states = save_states(tmp_path, seed=3)
    out = tmp_path / "fcp.pt"
    run_distributed(text_worker, 4, str(index), str(tok), states, str(out), timeout=300)
    results = torch.load(out, weights_only=True)
    for kind in KINDS:
        got = results[kind]
        assert got["degrees"] == [3, 2]  # rank 0: the degree-3 group, then a degree-2 group
        assert_matches_reference(got, index, tok, kind, Path(states[kind]))
