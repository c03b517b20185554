"""The text-only HF parity job: tiny Qwen3 and Llama (transformers) through fcp vs one process.

Seven text samples of distinct lengths (a real tar, a real BPE tokenizer), the same explicit
mixed plan as the VLM job (degree 3 + degree 1, then 2 + 2). fcp: `Qwen3ForCausalLM` and
`LlamaForCausalLM` with attn_implementation "fcp_ring" on the rank-local shard and 1-D
positions; reference: the same weights with sdpa, one unsharded sample at a time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ._vlm_job import explicit_planner, load_tokenizer, token_loss, tokenizer_path

WORDS = "the cat sits on the mat and looks at the camera while captions describe each clip "
LENGTHS = (7, 300, 29, 131, 64, 2, 11)  # words per sample (distinct token counts)


def build_text_data(tmp: Path) -> tuple[Path, Path]:
    from webdataset import TarWriter

    from fcp_data.readers import build_index

    tok_path = tokenizer_path(tmp)
    words = WORDS.split()
    url = str(tmp / "text.tar")
    with TarWriter(url) as w:
        for i, n in enumerate(LENGTHS):
            text = " ".join(words[(i + k) % len(words)] for k in range(n))
            w.write({"__key__": f"t{i}", "txt": text.encode()})
    build_index(url, tmp / "text-index", counter=load_tokenizer(tok_path))
    return tmp / "text-index", tok_path


def make_text_loader(
    index: Path, tok_path: Path, replicas: int, replica: int, planner: Any = None
) -> Any:
    """planner: default the explicit mixed plan on several replicas, the real one on one."""
    from fcp_data.loader import FCPDataLoader, LoaderOptions
    from fcp_data.planner import Cluster, CostModel
    from fcp_data.readers import LengthIndex

    return FCPDataLoader(
        LengthIndex.open(index),
        cluster=Cluster(replicas, tokens_per_replica=4096),
        cost=CostModel.from_model("qwen3-1.7b", "cpu"),
        replica=replica,
        global_batch_size=len(LENGTHS),
        num_workers=0,
        tokenizer=load_tokenizer(tok_path),
        options=LoaderOptions(
            planner=planner or (explicit_planner if replicas > 1 else None)
        ),  # Cluster(idle="placeholder") is the default
    )


KINDS = ("qwen3", "llama")


def make_text_model(kind: str, state: Path | None = None, seed: int = 0, attn: str = "sdpa") -> Any:
    import transformers

    torch.manual_seed(seed)
    config_cls, model_cls = {
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
    }[kind]
    cfg = config_cls(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, vocab_size=512, max_position_embeddings=4096,
        bos_token_id=0, eos_token_id=0, attn_implementation=attn,
    )  # fmt: skip
    model = model_cls(cfg).float()
    if state is not None:
        model.load_state_dict(torch.load(state, weights_only=True))
    return model


def text_reference(index: Path, tok_path: Path, kind: str, state: Path) -> tuple[float, dict]:
    model = make_text_model(kind, state)
    (mb,) = list(make_text_loader(index, tok_path, 1, 0))
    cu_p, cu = mb.cu_seqlens_padded.tolist(), mb.cu_seqlens.tolist()
    total = torch.zeros(())
    for j in range(len(mb.keys)):
        a, n = cu_p[j], cu[j + 1] - cu[j]
        logits = model(input_ids=mb.tokens[a : a + n][None]).logits[0]
        total = total + token_loss(logits, mb.labels[a : a + n], mb.loss_mask[a : a + n])
    loss = total / mb.global_num_loss_tokens
    loss.backward()
    return float(loss.detach()), {n: p.grad.clone() for n, p in model.named_parameters()}


def text_worker(rank: int, world: int, index: str, tok_path: str, states: dict, out: str) -> None:
    """Every model of `states` (kind -> weights file) through the same micro-batches."""
    import torch.distributed as dist

    from fcp_exec import CPGroupCache, ReplicaRanks, all_reduce_gradients, cp_context
    from fcp_exec.hf import hf_attention_kwargs, hf_position_ids, register_attention

    cache = CPGroupCache(ReplicaRanks(world_size=world))
    mbs = list(make_text_loader(Path(index), Path(tok_path), world, rank))
    result: dict[str, Any] = {}
    for kind, state in states.items():
        model = make_text_model(kind, Path(state), attn=register_attention())
        loss_sum, degrees = torch.zeros(()), []
        for mb in mbs:
            with cp_context(mb.rank_plan, groups=cache, wave_groups=mb.wave_groups) as cp:
                if mb.is_empty:
                    continue
                logits = model(
                    input_ids=mb.tokens[None],
                    position_ids=hf_position_ids(mb),
                    **hf_attention_kwargs(mb, cp),
                ).logits[0]
                loss = token_loss(logits, mb.labels, mb.loss_mask) / mb.global_num_loss_tokens
                loss.backward()
                loss_sum += loss.detach()
                degrees.append(cp.degree)
        all_reduce_gradients(model)
        dist.all_reduce(loss_sum)
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        result[kind] = {"loss": float(loss_sum), "grads": grads, "degrees": degrees}
    if rank == 0:
        torch.save(result, out)


def save_states(tmp: Path, seed: int) -> dict[str, str]:
    """Random weights of every model kind, saved once so fcp and the reference share them."""
    states = {}
    for k, kind in enumerate(KINDS):
        states[kind] = str(tmp / f"{kind}.pt")
        torch.save(make_text_model(kind, seed=seed + k).state_dict(), states[kind])
    return states


def assert_matches_reference(
    got: dict, index: Path, tok_path: Path, kind: str, state: Path, tol: float = 1e-5
) -> None:
    """fcp's summed loss and every gradient equal the unsharded model's, to `tol` relative."""
    ref_loss, ref_grads = text_reference(index, tok_path, kind, state)
    assert abs(got["loss"] - ref_loss) <= tol * abs(ref_loss), kind
    assert set(got["grads"]) == set(ref_grads)
    for name, g in ref_grads.items():
        err = float((got["grads"][name] - g).norm() / g.norm())
        assert err <= tol, (kind, name, err)
