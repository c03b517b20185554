"""A tiny Qwen2.5-VL trained through fcp equals the single-process model (loss and gradients).

fcp side: 4 real gloo processes, the loader's micro-batches (explicit mixed plan: a degree-3
group + a degree-1 replica, then two degree-2 groups), each replica encodes only the tubelets
it holds, scatters them, and runs the HF language model with ring attention registered in
transformers' AttentionInterface; gradients summed over replicas. Reference: transformers'
own forward per unsharded sample (its vision tower over all frames, its get_rope_index).
"""

from __future__ import annotations

from pathlib import Path

import torch

from ._dist import run_distributed
from ._vlm_job import build_data, fcp_worker, make_model, reference


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp(min=1e-30))


def test_qwen25_vl_loss_and_every_gradient_match_the_single_process_model(tmp_path: Path) -> None:
    index, tok = build_data(tmp_path)
    state = tmp_path / "weights.pt"
    torch.save(make_model(tok, seed=7).state_dict(), state)
    out = tmp_path / "fcp.pt"
    run_distributed(fcp_worker, 4, str(index), str(tok), str(state), str(out), timeout=300)
    got = torch.load(out, weights_only=True)
    ref_loss, ref_grads = reference(index, tok, state)
    assert abs(got["loss"] - ref_loss) <= 1e-5 * abs(ref_loss)
    _units, partial, multi = got["stats"]
    assert partial > 0 and multi > 0, "no tubelet was cut by a chunk edge: vacuous"
    assert set(got["grads"]) == set(ref_grads)
    vision = [n for n in ref_grads if ".visual." in n]
    assert vision and all(ref_grads[n].norm() > 0 for n in vision)
    worst = max((_rel(got["grads"][n], g), n) for n, g in ref_grads.items())
    assert worst[0] <= 1e-5, worst
