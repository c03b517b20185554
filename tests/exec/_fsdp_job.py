"""The FSDP2 parity job: a tiny transformers Qwen3 under fully_shard (FSDP, then HSDP) through fcp.

The text data of the HF parity job (seven samples, a real tar, a real BPE tokenizer) under an
explicit plan in which replica 3 sits wave 1 out: wave 0 runs (0, 1, 2) at degree 3 and (3,)
at degree 1, wave 1 runs (0, 1) at degree 2 and (2,) at degree 1. Replica 3 then trains the
loader's placeholder micro-batch, so it still joins every all-gather and reduce-scatter of the
sharded model. Each case: "fcp_ring" attention, activation checkpointing (transformers'),
`fully_shard_for_fcp` per decoder layer and the root; the gathered gradient (full_tensor of
every sharded .grad) is compared with the single-process sdpa model in the test.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ._hf_text_job import LENGTHS, make_text_loader, make_text_model
from ._vlm_job import plan_of_waves, token_loss

# by length rank (0 = longest): (replicas, ranks of its sequences); replica 3 idle in wave 1
WAVES = (
    (((0, 1, 2), (0, 6)), ((3,), (3, 4))),
    (((0, 1), (1, 5)), ((2,), (2,))),
)
CASES = ("fsdp", "hsdp")


def idle_planner(seqlens: Any, cluster: Any, cost: Any, *, causal: Any = True, **_: Any) -> Any:
    """The fixed plan of WAVES (sequences found by length rank): replica 3 idles in wave 1."""
    return plan_of_waves(WAVES, len(LENGTHS), seqlens, cluster, cost, causal=causal)


def make_idle_loader(index: Path, tok_path: Path, replicas: int, replica: int) -> Any:
    return make_text_loader(index, tok_path, replicas, replica, planner=idle_planner)


def enable_checkpointing(model: Any) -> None:
    """transformers' activation checkpointing (non-reentrant), by its new or its old name."""
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable()
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def _mesh(case: str, world: int) -> Any:
    from torch.distributed.device_mesh import init_device_mesh

    if case == "fsdp":
        return init_device_mesh("cpu", (world,), mesh_dim_names=("shard",))
    return init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("replicate", "shard"))


def _refusals(world: int) -> list[str]:
    """fsdp_sum_gradients on a model whose root was left unsharded: the ConfigError's text."""
    from torch.distributed.fsdp import fully_shard

    from fcp_data.errors import ConfigError
    from fcp_exec.fsdp import fsdp_sum_gradients

    mesh = _mesh("fsdp", world)
    seq = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    fully_shard(seq[0], mesh=mesh)  # seq[1] and the root stay plain: never reduced
    try:
        fsdp_sum_gradients(seq)
    except ConfigError as e:
        return [str(e)]
    return []


class _Tower(torch.nn.Module):
    """A decoder of 2 FSDP layers and a 'tower' only some ranks call (a vision tower's shape)."""

    def __init__(self) -> None:
        super().__init__()
        self.tower = torch.nn.Linear(3, 4)
        self.layers = torch.nn.ModuleList([torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)])

    def forward(self, x: torch.Tensor, media: torch.Tensor | None = None) -> torch.Tensor:
        if media is not None:
            x = x + self.tower(media)
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x.sum()


def _tower_inputs(rank: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    g = torch.Generator().manual_seed(100 + rank)
    media = torch.randn(5, 3, generator=g) if rank % 2 == 0 else None  # odd ranks: text only
    return torch.randn(5, 4, generator=g), media


def _ignored_tower_error(rank: int, world: int) -> float:
    """fully_shard_for_fcp(ignored=[tower]) + all_reduce_gradients(tower) vs the summed grads.

    Only even ranks call the tower; FSDP never sees it, so odd ranks skip it without leaving
    anyone in a collective. Returns the worst relative error against the sum over ranks of an
    unsharded copy's gradients (computed on every rank from every rank's inputs).
    """
    from fcp_exec import all_reduce_gradients
    from fcp_exec.fsdp import fully_shard_for_fcp

    torch.manual_seed(5)
    ref = _Tower()
    model = _Tower()
    model.load_state_dict(ref.state_dict())
    for r in range(world):
        ref(*_tower_inputs(r)).backward()
    mesh = _mesh("fsdp", world)
    fully_shard_for_fcp(model, layers=model.layers, mesh=mesh, ignored=[model.tower])
    model(*_tower_inputs(rank)).backward()
    all_reduce_gradients(model.tower)
    worst = 0.0
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        assert name.startswith("tower") != hasattr(p.grad, "full_tensor"), name
        worst = max(worst, float((g - q.grad).norm() / q.grad.norm()))
    return worst


def fsdp_worker(rank: int, world: int, index: str, tok_path: str, state: str, out: str) -> None:
    """Both cases of CASES through the same micro-batches; rank 0 saves what the test checks.

    Runs as an FSDP job without megatron-core: cp_context then binds nothing into megatron's
    parallel state (an HF model reads none of it) and no process pays megatron's import
    (seconds each, 4 processes on a small box).
    """
    import sys

    sys.modules.setdefault("megatron.core.parallel_state", None)  # type: ignore[arg-type]
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from fcp_exec import CPGroupCache, ReplicaRanks, cp_context
    from fcp_exec.fsdp import fsdp_sum_gradients, fully_shard_for_fcp
    from fcp_exec.hf import hf_attention_kwargs, hf_position_ids, register_attention

    cache = CPGroupCache(ReplicaRanks(world_size=world))
    mbs = list(make_idle_loader(Path(index), Path(tok_path), world, rank))
    result: dict[str, Any] = {
        "refusals": _refusals(world),
        "ignored_tower_error": _ignored_tower_error(rank, world),
    }
    for case in CASES:
        model = make_text_model("qwen3", Path(state), attn=register_attention())
        enable_checkpointing(model)
        calls: list[int] = []  # one entry per attention forward of layer 0 (recompute too)
        model.model.layers[0].self_attn.register_forward_hook(lambda *_, c=calls: c.append(1))
        fully_shard_for_fcp(model, layers=model.model.layers, mesh=_mesh(case, world))
        units = fsdp_sum_gradients(model)  # a second call: idempotent
        loss_sum, seen = torch.zeros(()), []
        for mb in mbs:
            with cp_context(mb.rank_plan, groups=cache, wave_groups=mb.wave_groups) as cp:
                logits = model(
                    input_ids=mb.tokens[None],
                    position_ids=hf_position_ids(mb),
                    use_cache=False,
                    **hf_attention_kwargs(mb, cp),
                ).logits[0]
                loss = token_loss(logits, mb.labels, mb.loss_mask) / mb.global_num_loss_tokens
                loss.backward()
                loss_sum += loss.detach()
                seen.append((cp.degree, mb.is_placeholder))
        dist.all_reduce(loss_sum)
        per_rank: list[Any] = [None] * world
        dist.all_gather_object(per_rank, seen)
        grads, placements = {}, set()
        for name, p in model.named_parameters():
            assert isinstance(p.grad, DTensor), (case, name, type(p.grad))
            placements.add(str(p.grad.placements))
            grads[name] = p.grad.full_tensor()  # a collective: every rank, same order
        result[case] = {
            "loss": float(loss_sum),
            "grads": grads,
            "micro_batches": per_rank,
            "placements": sorted(placements),
            "fsdp_units": units,
            "attention_calls": len(calls),
        }
    if rank == 0:
        torch.save(result, out)
