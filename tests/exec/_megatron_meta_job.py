"""1-process megatron-core job: GPTModel with FCPCoreAttention, forward + backward on `meta`.

The whole model runs on shape-only tensors through the CUDA kernel's own calls (torch's flash
ops have meta kernels), so any read of device data back to the host inside a layer (`.item()`,
`.tolist()`, `.cpu()`) raises here; the layout comes from the micro-batch's host offsets
through `packed_seq_params`.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from megatron.core import parallel_state as ps
from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
from megatron.core.models.gpt import GPTModel
from megatron.core.transformer.transformer_config import TransformerConfig

from fcp_exec import CPBinding
from fcp_exec.kernels import TorchFlashKernel
from fcp_exec.megatron import (
    FCPCoreAttention,
    fcp_process_groups,
    keep_rotary_on_cpu,
    packed_seq_params,
)

__all__ = ["megatron_meta_worker"]


class _Counting(TorchFlashKernel):
    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[str] = Counter()

    def forward(self, *a: Any, **kw: Any) -> Any:
        self.calls["fwd"] += 1
        return super().forward(*a, **kw)

    def backward(self, *a: Any, **kw: Any) -> Any:
        self.calls["bwd"] += 1
        return super().backward(*a, **kw)


class _Choice:
    def __init__(self, kern: Any) -> None:
        self.kern = kern

    def get(self, *shape: Any) -> Any:
        return self.kern


def megatron_meta_worker(rank: int, world: int) -> None:
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    from .test_hot_path import _micro_batch

    ps.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
    config = TransformerConfig(
        num_layers=2, hidden_size=256, num_attention_heads=4, num_query_groups=2,
        kv_channels=64, use_cpu_initialization=True, attention_dropout=0.0, hidden_dropout=0.0,
        params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16, bf16=True,
    )  # fmt: skip
    spec = get_gpt_layer_local_spec()
    spec.submodules.self_attention.submodules.core_attention = FCPCoreAttention
    model = GPTModel(
        config=config, transformer_layer_spec=spec, vocab_size=64, max_sequence_length=512,
        position_embedding_type="rope", pg_collection=fcp_process_groups(),
    )  # fmt: skip
    keep_rotary_on_cpu(model)
    model = model.to("meta")
    for module in model.modules():  # megatron keeps inv_freq as a plain attribute, not a buffer
        if isinstance(module, RotaryEmbedding):
            module.inv_freq = module.inv_freq.to("meta")
    mb = _micro_batch([37, 101, 6])  # tensors on meta, host offsets kept
    params = packed_seq_params(mb)
    layout = params.fcp_layout
    assert layout is not None and layout.num_local_tokens == mb.tokens.numel()
    kern = _Counting()
    layout.cached("kernels", lambda: _Choice(kern))
    binding = CPBinding.of((0,), 0)
    ps._FCP_CP_BINDING = binding
    ps._CONTEXT_PARALLEL_GLOBAL_RANKS = [0]
    try:
        out = model(mb.tokens[None], mb.position_ids[None], None, labels=mb.labels[None],
                    packed_seq_params=params)  # fmt: skip
        out.float().sum().backward()
    finally:
        delattr(ps, "_FCP_CP_BINDING")
    assert out.device.type == "meta"
    assert kern.calls == Counter({"fwd": 2, "bwd": 2}), kern.calls  # one call per layer
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and g.device.type == "meta" for g in grads)
