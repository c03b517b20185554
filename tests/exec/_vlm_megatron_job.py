"""The megatron-core VLM parity job: GPTModel fed decoder_input + fcp's M-RoPE, 4 gloo processes.

The vision tower is the tiny Qwen2.5-VL ViT of the HF job; the decoder a megatron-core GPTModel
with FCPCoreAttention and no built-in position embedding. Every replica encodes what it holds
and runs its rank-local M-RoPE; rank 0 then runs the same weights unsharded (one degree-1
micro-batch of whole samples, whole-video encoding) and compares loss and gradients.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from fcp_exec.megatron import packed_seq_params

from ._vlm_job import make_loader, make_model, token_loss

MROPE_SECTION = (2, 1, 1)  # kv_channels 8: 4 rotary pairs


def make_gpt(seed: int) -> Any:
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    from fcp_exec.megatron import FCPCoreAttention, fcp_process_groups

    torch.manual_seed(seed)
    config = TransformerConfig(
        num_layers=2, hidden_size=32, num_attention_heads=4, num_query_groups=2, kv_channels=8,
        ffn_hidden_size=64, gated_linear_unit=True, normalization="RMSNorm",
        use_cpu_initialization=True, attention_dropout=0.0, hidden_dropout=0.0,
        params_dtype=torch.float32, pipeline_dtype=torch.float32, apply_rope_fusion=False,
    )  # fmt: skip
    spec = get_gpt_layer_local_spec(normalization="RMSNorm")
    spec.submodules.self_attention.submodules.core_attention = FCPCoreAttention
    return GPTModel(
        config=config, transformer_layer_spec=spec, vocab_size=512, max_sequence_length=4096,
        position_embedding_type="none", pg_collection=fcp_process_groups(),
    )  # fmt: skip


class VLM(torch.nn.Module):
    """A vision tower + a megatron GPT decoder (one parameter set for the gradient sum)."""

    def __init__(self, tok_path: Path, state: Path) -> None:
        super().__init__()
        self.visual = make_model(tok_path, state).model.visual
        self.gpt = make_gpt(11)

    def loss(self, mb: Any, group: Any) -> torch.Tensor:
        from fcp_exec.megatron_mm import gpt_forward, mrope_for_shard
        from fcp_exec.vision import encode_and_scatter

        embeds = self.gpt.embedding.word_embeddings(mb.tokens)
        embeds = encode_and_scatter(self.visual, mb, embeds, group=group)
        rope = mrope_for_shard(mb, MROPE_SECTION, 8)
        logits = gpt_forward(self.gpt, embeds, rope, packed_seq_params(mb))
        return token_loss(logits, mb.labels, mb.loss_mask) / mb.global_num_loss_tokens


def megatron_vlm_worker(rank: int, world: int, index: str, tok_path: str, state: str) -> None:
    from megatron.core import parallel_state as ps

    from fcp_exec import CPGroupCache, ReplicaRanks, all_reduce_gradients, cp_context

    ps.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
    model = VLM(Path(tok_path), Path(state))
    cache = CPGroupCache(ReplicaRanks(world_size=world))
    loss_sum, degrees = torch.zeros(()), []
    for mb in make_loader(Path(index), Path(tok_path), world, rank):
        with cp_context(mb.rank_plan, groups=cache, wave_groups=mb.wave_groups) as cp:
            if mb.is_empty:
                continue
            loss = model.loss(mb, cp.group)
            loss.backward()
            loss_sum += loss.detach()
            degrees.append(cp.degree)
    all_reduce_gradients(model)
    dist.all_reduce(loss_sum)
    if rank == 0:  # the unsharded reference: same weights, every sample whole, degree 1
        assert degrees == [3, 2], degrees
        ref = VLM(Path(tok_path), Path(state))
        (mb,) = list(make_loader(Path(index), Path(tok_path), 1, 0))
        ref_loss = ref.loss(mb, None)
        ref_loss.backward()
        assert abs(float(loss_sum) - float(ref_loss)) <= 1e-5 * abs(float(ref_loss))
        got = dict(model.named_parameters())
        for name, p in ref.named_parameters():
            err = float((got[name].grad - p.grad).norm() / p.grad.norm())
            assert err <= 1e-5, (name, err)
    ps.destroy_model_parallel()
