"""The pieces of the demo training job: tokenizer, a capped source, the model, the loader.

The model is a small megatron-core GPTModel (RoPE) with the shape of the shipped `cpu-small`
profile, whose measured coefficients the planner uses; `FCPCoreAttention` runs exact ring
attention over each wave's CP group. Text is tokenized 4 bytes to a token (ids hashed into the
vocabulary), so token counts equal `fcp index`'s default `bytes:4` count exactly; video samples
enter as their placeholder tokens (no vision encoder).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fcp_data.errors import ConfigError

__all__ = [
    "EOD",
    "SPECIAL",
    "VISION",
    "CappedSource",
    "ChunkTokenizer",
    "build_loader",
    "build_model",
    "no_cp_planner",
]

TEXT_IDS, EOD, SPECIAL, VISION = 500, 501, 502, 503  # ids 1..500 text, 0 padding


class ChunkTokenizer:
    """4 utf-8 bytes -> one id in 1..500 (a multiplicative hash): ceil(bytes / 4) tokens."""

    spec = "bytes:4"

    def __call__(self, text: str) -> np.ndarray:
        raw = text.encode("utf-8")
        buf = np.frombuffer(raw + b"\0" * (-len(raw) % 4), dtype="<u4").astype(np.uint64)
        return 1 + ((buf * np.uint64(2654435761)) % np.uint64(1 << 32)) % np.uint64(TEXT_IDS)


class CappedSource:
    """A length index seen without its samples longer than `max_tokens` (arrays re-indexed)."""

    def __init__(self, source: Any, max_tokens: int) -> None:
        self._src = source
        self._keep = np.flatnonzero(np.asarray(source.seqlens) <= max_tokens)
        self._n = len(source.seqlens)
        if self._keep.size == 0:
            raise ConfigError(f"no sample has <= {max_tokens} tokens; raise --max-tokens")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        value = getattr(self._src, name)
        if isinstance(value, np.ndarray) and value.shape[:1] == (self._n,):
            return value[self._keep]
        return value

    def read(self, i: int) -> Any:
        return self._src.read(int(self._keep[i]))


def no_cp_planner(seqlens: Any, cluster: Any, cost: Any, *, causal: Any = True, **_: Any) -> Any:
    """Every sequence on one replica (degree 1), dealt longest first to the least loaded."""
    from fcp_data.planner import CPGroup, Plan, Wave

    lens = np.asarray(seqlens, np.int64)
    flags = np.broadcast_to(np.asarray(causal, bool), lens.shape)
    load = np.zeros(cluster.num_replicas)
    owned: list[list[int]] = [[] for _ in range(cluster.num_replicas)]
    for i in np.argsort(-lens, kind="stable"):
        r = int(np.argmin(load))
        owned[r].append(int(i))
        load[r] += cost.group_time(lens[[i]], 1, causal=flags[[i]])
    groups = tuple(
        CPGroup(
            replicas=(r,),
            degree=1,
            sequence_ids=tuple(ids),
            seqlens=tuple(int(x) for x in lens[ids]),
            causal=tuple(bool(c) for c in flags[ids]),
            predicted_time=cost.group_time(lens[ids], 1, causal=flags[ids]),
        )
        for r, ids in enumerate(owned)
        if ids
    )
    return Plan(
        num_replicas=cluster.num_replicas,
        waves=(Wave(groups=groups),),
        predicted_time=max(g.predicted_time for g in groups),
        lower_bound=0.0,
        strategy="no-cp",
        winner="no-cp",
    ).with_digest()


def build_model(seed: int) -> Any:
    """The cpu-small GPTModel with FCPCoreAttention; the same weights on every replica."""
    import torch
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    from fcp.profiling import SHAPES
    from fcp_exec.megatron import FCPCoreAttention, fcp_process_groups, keep_rotary_on_cpu

    s = SHAPES["cpu-small"]
    torch.manual_seed(seed)
    config = TransformerConfig(
        num_layers=s.layers,
        hidden_size=s.hidden,
        num_attention_heads=s.heads,
        num_query_groups=s.kv_heads,
        kv_channels=s.head_dim,
        ffn_hidden_size=s.ffn,
        gated_linear_unit=True,
        normalization="RMSNorm",
        use_cpu_initialization=True,
        attention_dropout=0.0,
        hidden_dropout=0.0,
        params_dtype=torch.float32,
    )
    spec = get_gpt_layer_local_spec(normalization="RMSNorm")
    spec.submodules.self_attention.submodules.core_attention = FCPCoreAttention
    model = GPTModel(
        config=config,
        transformer_layer_spec=spec,
        vocab_size=s.vocab,
        max_sequence_length=1 << 16,
        position_embedding_type="rope",
        pg_collection=fcp_process_groups(),
    )
    keep_rotary_on_cpu(model)
    return model


def build_loader(cfg: Any, rank: int, *, strategy: str, no_cp: bool) -> Any:
    """This replica's FCPDataLoader over the capped source, planned with the cpu-small profile."""
    from fcp_data.loader import FCPDataLoader, LoaderOptions
    from fcp_data.planner import Cluster, CostModel
    from fcp_data.profiles import resolve_cost

    if cfg.index:
        from fcp_data.readers import LengthIndex

        src: Any = LengthIndex.open(cfg.index)
    else:
        from fcp_data.loader.source import open_source

        src = open_source(cfg.shards, tokenizer=ChunkTokenizer())
    options = LoaderOptions(
        eod_id=EOD,
        special_token_id=SPECIAL,
        vision_token_id=VISION,
        planner=no_cp_planner if no_cp else None,
    )
    return FCPDataLoader(
        CappedSource(src, cfg.max_tokens),
        replica=rank,
        global_batch_size=cfg.global_batch,
        cluster=Cluster(cfg.replicas, tokens_per_replica=cfg.tokens_per_replica),
        cost=CostModel.load(resolve_cost(cfg.cost)),
        seed=cfg.seed,
        num_workers=cfg.workers,
        tokenizer=ChunkTokenizer(),
        strategy=strategy,
        options=options,
    )
