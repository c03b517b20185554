"""A replica that sits a wave out runs a placeholder through a real Qwen2.5-VL: exactly zero.

The loader plans the VLM job's 4-replica waves on 5 replicas, so replica 4 has no group in any
wave; its micro-batches must be placeholders that a transformers Qwen2.5-VL (vision hook, fcp
ring attention at degree 1, M-RoPE ids) runs like any other, adding exactly 0 to the loss and
to every gradient while still reaching every parameter's hook path (a framework collective
would fire there).
"""

from __future__ import annotations

from pathlib import Path

import torch

from fcp_exec import CPBinding

from ._vlm_job import build_data, make_loader, make_model, run_micro_batch


def test_idle_replica_placeholder_adds_exactly_zero_through_qwen25_vl(tmp_path: Path) -> None:
    from fcp_exec.hf import register_attention

    index, tok = build_data(tmp_path)
    mbs = list(make_loader(index, tok, 5, 4))
    assert mbs and all(mb.is_placeholder and mb.rank_plan.is_empty for mb in mbs)
    mb = mbs[0]
    assert mb.mrope_position_ids is not None and mb.mrope_position_ids.shape == (3, 2)
    assert mb.pixel_values is not None and mb.pixel_values.shape[0] == 0
    assert mb.num_loss_tokens == 0 and mb.global_num_loss_tokens > 0
    model = make_model(tok, seed=3)
    model.set_attn_implementation({"text_config": register_attention()})
    # what cp_context binds for a wave this replica sits out: a degree-1 ring of itself
    loss = run_micro_batch(model, mb, CPBinding.of((0,), 0, rank_plan=mb.rank_plan))
    loss.backward()
    assert loss.item() == 0.0
    reached = [n for n, p in model.named_parameters() if p.grad is not None]
    assert "model.language_model.embed_tokens.weight" in reached  # the forward really ran
    assert len(reached) > 10
    for n, p in model.named_parameters():
        if p.grad is not None:
            assert torch.count_nonzero(p.grad) == 0, f"{n}: the placeholder moved a gradient"
