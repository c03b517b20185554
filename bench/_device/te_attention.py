"""TransformerEngine attention on fcp's groups, on a GPU box that has TE and megatron-core.

A small GPTModel built with `fcp_te_spec` (TE's layers, `FCPTEDotProductAttention`) and the same
model with `fcp_gpt_spec` (FCPCoreAttention) run one packed micro-batch of several sequences at
degree 1 (one GPU holds one member; TE gets no group, as for a placeholder), bf16, and their
losses and the gradients of the attention inputs' projection must agree within bf16 tolerance.
Skipped, naming the package, where TE or megatron-core is missing (the lent box has neither;
the CPU tests check the plumbing against a stand-in of TE's contract).
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

__all__ = ["bench_te_attention"]


def bench_te_attention(device: torch.device) -> dict[str, Any]:
    for pkg in ("transformer_engine", "megatron.core"):
        if importlib.util.find_spec(pkg.split(".")[0]) is None:
            return {"status": "skipped", "reason": f"{pkg} is not installed on this box"}
    if device.type != "cuda":
        return {"status": "skipped", "reason": "TransformerEngine runs on CUDA only"}
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.packed_seq_params import PackedSeqParams
    from megatron.core.transformer.transformer_config import TransformerConfig

    from fcp_exec.megatron import fcp_gpt_spec, fcp_process_groups
    from fcp_exec.megatron_te import check_te_layout, fcp_te_spec

    if not dist.is_initialized():
        dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29533", rank=0,
                                world_size=1)  # fmt: skip
    ps.initialize_model_parallel(1, 1)
    config = TransformerConfig(num_layers=2, hidden_size=1024, num_attention_heads=16,
                               num_query_groups=4, attention_dropout=0.0, hidden_dropout=0.0,
                               bf16=True, params_dtype=torch.bfloat16)  # fmt: skip
    check_te_layout(config)
    lens = [1000, 37, 2048, 511]
    padded = [n + n % 2 for n in lens]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    cup = torch.tensor([0, *torch.tensor(padded).cumsum(0).tolist()], dtype=torch.int32)
    params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu.to(device),
                             cu_seqlens_kv=cu.to(device), cu_seqlens_q_padded=cup.to(device),
                             cu_seqlens_kv_padded=cup.to(device), max_seqlen_q=max(padded),
                             max_seqlen_kv=max(padded))  # fmt: skip
    t = int(cup[-1])
    tokens = torch.randint(0, 1024, (1, t), device=device)
    pos = torch.cat([torch.arange(p) for p in padded])[None].to(device)
    out: dict[str, Any] = {"status": "ok", "tokens": t, "sequences": len(lens)}
    losses = {}
    for name, spec in (("te", fcp_te_spec(config)), ("fcp", fcp_gpt_spec(config))):
        torch.manual_seed(0)
        model = GPTModel(config=config, transformer_layer_spec=spec, vocab_size=1024,
                         max_sequence_length=4096, pg_collection=fcp_process_groups()
                         ).to(device)  # fmt: skip
        logits = model(tokens, pos, None, packed_seq_params=params)
        loss = logits.float().logsumexp(-1).mean()
        loss.backward()
        losses[name] = loss.item()
    out["loss_te"], out["loss_fcp"] = losses["te"], losses["fcp"]
    out["loss_rel"] = abs(losses["te"] - losses["fcp"]) / abs(losses["fcp"])
    out["all_pass"] = out["loss_rel"] <= 2.5e-2
    ps.destroy_model_parallel()
    return out
