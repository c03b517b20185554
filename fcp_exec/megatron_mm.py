"""megatron-core decoders fed by a vision tower: decoder_input + M-RoPE from rank-local ids.

    rope = mrope_for_shard(mb, mrope_section=[16, 24, 24], kv_channels=128)
    embeds = encode_and_scatter(visual, mb, model.embedding.word_embeddings(mb.tokens), ...)
    logits = gpt_forward(model, embeds, rope, packed_seq_params(mb))  # fcp_exec.megatron

Why not GPTModel(position_embedding_type="mrope"): megatron-core 0.16's
`MultimodalRotaryEmbedding` computes the embedding of a whole [3, b, s] row and then, when the
CP group has more than one member, cuts that row into 2*cp chunks with
`get_pos_emb_on_this_cp_rank`. For a packed THD micro-batch the cut is per *sequence*, not per
row, and fcp's `MicroBatch.mrope_position_ids` are already this rank's tokens, so a second cut
would rotate with the wrong ids (its constructor also needs CUDA). fcp therefore computes the
M-RoPE angles itself from the rank-local ids (same arithmetic: per-axis angles, channel
sections [t, h, w] repeated twice) and hands them to the decoder as `rotary_pos_emb`.

The decoder's THD RoPE (`_apply_rotary_pos_emb_thd`) still selects, per sequence, the zigzag
chunks of this CP rank from a table indexed by position in the padded unsharded pack (its
"exact mapping" case, when the table has cu_seqlens_padded[-1] rows). fcp writes each local
token's angles at exactly the packed position that token came from (`local_token_index`), so
that selection returns the local angles unchanged: nothing is re-derived from a row cut. The
table costs S_padded x dim floats per micro-batch (S_padded = d * local tokens).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from fcp_data.errors import ConfigError, ExecError
from fcp_exec.layout import local_token_index

__all__ = ["gpt_forward", "mrope_angles", "mrope_for_shard"]


def mrope_angles(
    positions: torch.Tensor,
    mrope_section: Sequence[int],
    kv_channels: int,
    *,
    rotary_base: float = 10000.0,
) -> torch.Tensor:
    """M-RoPE angles [T, 1, 1, kv_channels] of ids [3, T] (temporal, height, width).

    Channel pair k rotates with axis a(k) = the section k falls in (sections repeated for the
    second half), as megatron's MultimodalRotaryEmbedding and transformers' Qwen2-VL do.
    """
    if positions.dim() != 2 or positions.shape[0] != 3:
        raise ExecError(f"M-RoPE ids must be [3, T], got shape {tuple(positions.shape)}")
    half = kv_channels // 2
    if sum(mrope_section) != half:
        raise ConfigError(
            f"mrope_section {list(mrope_section)} sums to {sum(mrope_section)}; it must sum to "
            f"kv_channels / 2 = {half}"
        )
    inv_freq = 1.0 / (
        rotary_base ** (torch.arange(0, kv_channels, 2, dtype=torch.float32) / kv_channels)
    )
    freqs = positions.to(torch.float32)[:, :, None] * inv_freq[None, None, :]  # [3, T, half]
    emb = torch.cat((freqs, freqs), dim=-1)  # [3, T, dim]
    parts = emb.split(list(mrope_section) * 2, dim=-1)
    out = torch.cat([p[i % 3] for i, p in enumerate(parts)], dim=-1)  # [T, dim]
    return out[:, None, None, :]


def mrope_for_shard(
    mb: Any,
    mrope_section: Sequence[int],
    kv_channels: int,
    *,
    rotary_base: float = 10000.0,
    index: int | None = None,
) -> torch.Tensor:
    """`rotary_pos_emb` for a megatron decoder running `mb` (see module docstring).

    Rows of the padded unsharded pack; this rank's rows hold the angles of its own tokens'
    M-RoPE ids, every other row is 0 (never read by this rank). index: this rank's position in
    the ring (default mb.rank_plan.index_in_group).
    """
    if mb.mrope_position_ids is None:
        raise ExecError(
            "the micro-batch has no mrope_position_ids: build the loader with "
            "LoaderOptions(vision=VisionOptions(...)) and a Qwen vision rule"
        )
    degree = max(int(mb.rank_plan.degree), 1)
    me = mb.rank_plan.index_in_group if index is None else index
    local = mrope_angles(mb.mrope_position_ids, mrope_section, kv_channels, rotary_base=rotary_base)
    rows = local_token_index(mb.cu_seqlens_padded, degree, me)
    if rows.numel() != local.shape[0]:
        raise ExecError(
            f"mrope_position_ids has {local.shape[0]} tokens but rank {me} of degree {degree} "
            f"holds {rows.numel()}; the ids must be this micro-batch's own"
        )
    table = local.new_zeros((int(mb.cu_seqlens_padded[-1]), *local.shape[1:]))
    table[rows] = local
    return table


def gpt_forward(
    model: Any, embeds: torch.Tensor, rotary_pos_emb: torch.Tensor, packed_seq_params: Any
) -> torch.Tensor:
    """Logits [T, vocab] of a megatron-core GPTModel run on `embeds` [T, hidden] as decoder input.

    Calls the model's own decoder, final norm and output layer (`GPTModel.decoder`,
    `output_layer`) with fcp's rotary table, so the GPTModel's built-in position embedding is
    not used (build it with position_embedding_type="none").
    """
    if getattr(model, "position_embedding_type", "none") != "none":
        raise ConfigError(
            f"GPTModel(position_embedding_type={model.position_embedding_type!r}) would add its "
            "own positions; build it with position_embedding_type='none' and pass fcp's M-RoPE"
        )
    hidden = model.decoder(
        hidden_states=embeds[:, None, :],
        attention_mask=None,
        rotary_pos_emb=rotary_pos_emb,
        packed_seq_params=packed_seq_params,
    )
    weight = (
        model.shared_embedding_or_output_weight()
        if model.share_embeddings_and_output_weights
        else None
    )
    logits, _ = model.output_layer(hidden, weight=weight)
    return logits[:, 0, :]
