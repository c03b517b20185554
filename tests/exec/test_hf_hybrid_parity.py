"""Tiny transformers Qwen3 and Llama through fcp's head-parallel transports equal one process.

4 real gloo processes run the loader's micro-batches of a plan with hybrid groups (2 x 2 at
d = 4, all-to-all only at d = 2 beside a ring, and all-to-all over 4 members with the 2 KV
heads replicated); loss and every gradient after the sum over replicas agree with the
unsharded model (sdpa, one sample at a time) to 1e-5 relative.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ._dist import run_distributed
from ._hf_hybrid_job import hybrid_worker
from ._hf_text_job import KINDS, assert_matches_reference, build_text_data, save_states


def test_hybrid_transports_match_the_single_process_model(tmp_path: Path) -> None:
    index, tok = build_text_data(tmp_path)
    states = save_states(tmp_path, seed=7)
    out = tmp_path / "fcp.pt"
    run_distributed(hybrid_worker, 4, str(index), str(tok), states, str(out), timeout=300)
    results = torch.load(out, weights_only=True)
    for kind in KINDS:
        got = results[kind]
        # rank 0's groups: (d, u) = (4, 2), (2, 2), (4, 4): every transport really ran
        assert got["transports"] == [(4, 2), (2, 2), (4, 4)], got["transports"]
        assert_matches_reference(got, index, tok, kind, Path(states[kind]))
