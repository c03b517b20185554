"""megatron-core path: GPTModel on decoder_input (text + scattered vision) and rank-local M-RoPE.

4 real gloo processes under the explicit mixed plan (degree 3 + 1, then 2 + 2) equal the same
model run unsharded (loss, every decoder and vision-tower gradient, 1e-5 relative). The M-RoPE
angles equal transformers' Qwen2.5-VL rotary embedding on the same ids.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ._dist import run_distributed
from ._vlm_job import build_data, make_model
from ._vlm_megatron_job import megatron_vlm_worker


def test_mrope_angles_equal_transformers_qwen25_vl_rotary() -> None:
    from transformers import Qwen2_5_VLConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import (
        Qwen2_5_VLRotaryEmbedding,
        apply_rotary_pos_emb,
    )

    from fcp_exec.megatron_mm import mrope_angles

    cfg = Qwen2_5_VLConfig(text_config=dict(
        hidden_size=64, num_attention_heads=4, rope_scaling={"type": "mrope",
        "mrope_section": [4, 2, 2]}))  # fmt: skip
    ids = torch.randint(0, 300, (3, 1, 50))
    q = torch.randn(1, 4, 50, 16)
    cos, sin = Qwen2_5_VLRotaryEmbedding(cfg.text_config)(q, ids)
    want, _ = apply_rotary_pos_emb(q, q, cos, sin)
    theta = cfg.text_config.rope_parameters["rope_theta"]
    ang = mrope_angles(ids[:, 0], [4, 2, 2], 16, rotary_base=theta)[:, 0, 0]  # [T, dim]
    half = torch.cat((-q[..., 8:], q[..., :8]), dim=-1)
    got = q * ang.cos() + half * ang.sin()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_gpt_model_with_vision_and_local_mrope_matches_unsharded(tmp_path: Path) -> None:
    index, tok = build_data(tmp_path)
    state = tmp_path / "weights.pt"
    torch.save(make_model(tok, seed=5).state_dict(), state)
    run_distributed(megatron_vlm_worker, 4, str(index), str(tok), str(state), timeout=300)
