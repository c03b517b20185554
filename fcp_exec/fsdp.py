"""FSDP2 (`torch.distributed.fsdp.fully_shard`) with fcp: gradients SUMMED over replicas.

    from fcp_exec.fsdp import fully_shard_for_fcp
    model = fully_shard_for_fcp(model, layers=model.model.layers, mesh=mesh)
    for mb in loader:                                   # every micro-batch runs, placeholders too
        with cp_context(mb.rank_plan, groups=cache, wave_groups=mb.wave_groups) as cp:
            loss = per_token_loss_sum(model, mb, cp) / mb.global_num_loss_tokens
            loss.backward()                             # FSDP reduce-scatters here: a SUM
        if mb.is_last_wave:
            optimizer.step()                            # no all_reduce_gradients: FSDP did it
            optimizer.zero_grad()

fcp's loss on a replica is its per-token loss sum divided by the *global* batch's loss-token
count, so each replica's gradient is already its exact share of the global mean and the shares
must be summed over all N replicas. FSDP2 averages by default: its reduce-scatter (and, under
HSDP, the all-reduce across replica groups) divides by the whole data-parallel size, shard x
replicate, so on 4 ranks every gradient is 4x too small and the effective learning rate depends
on the cluster size. `fsdp_sum_gradients` sets, on every FSDPModule of the model:

- `set_gradient_divide_factor(1.0)`: divide by 1 instead of the data-parallel size;
- `set_force_sum_reduction_for_comms(True)`: issue plain `ReduceOp.SUM` collectives. With the
  factor alone FSDP uses `ReduceOp.PREMUL_SUM(1 / factor)`, which gloo rejects ("Cannot use
  ReduceOp.PREMUL_SUM with Gloo") and which NCCL would run as a needless multiply; with the
  flag the factor 1.0 becomes no scaling at all.

Both methods act on one FSDPModule only (they are not recursive), hence the walk over every
module. Sharded (FSDP) and hybrid-sharded (HSDP, a 2-D mesh: replicate x shard) models are
handled alike: HSDP reduce-scatters over the shard dimension and all-reduces over the
replicate dimension, both as sums.

Every rank must run the model on every micro-batch: FSDP all-gathers each layer's parameters in
its forward and reduce-scatters its gradients in its backward, collectives over the whole mesh.
The loader's default placeholder micro-batch (`Cluster(idle="placeholder")`: 2 loss-free
tokens at degree 1) lets a replica that sits a wave out join them while adding exactly 0.

Never `fcp_exec.all_reduce_gradients` an FSDP model: its sharded gradients are already summed
and each rank holds another shard. Only a part FSDP ignores (`fully_shard_for_fcp(...,
ignored=[tower])`, e.g. a vision tower that a replica without vision tokens never calls, which
would leave the others waiting in its all-gather) is summed that way, after the last wave.
Guide and measured figures: docs/layouts/fsdp.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from fcp_data.errors import ConfigError, MissingDependencyError

__all__ = ["fsdp_modules", "fsdp_sum_gradients", "fully_shard_for_fcp"]


def _fsdp_api() -> tuple[type, Any]:
    """(FSDPModule, fully_shard) from torch, or a MissingDependencyError naming the version."""
    try:
        from torch.distributed.fsdp import FSDPModule, fully_shard
    except ImportError as e:
        raise MissingDependencyError(
            f"torch {torch.__version__} has no torch.distributed.fsdp.fully_shard (FSDP2); "
            "fcp_exec.fsdp needs torch >= 2.8: pip install -U torch"
        ) from e
    for name in ("set_gradient_divide_factor", "set_force_sum_reduction_for_comms"):
        if not hasattr(FSDPModule, name):
            raise MissingDependencyError(
                f"torch {torch.__version__}: FSDPModule has no {name}(); fcp needs it to make "
                "FSDP sum gradients instead of averaging them (torch >= 2.8): pip install -U torch"
            )
    return FSDPModule, fully_shard


def fsdp_modules(module: torch.nn.Module) -> list[torch.nn.Module]:
    """Every module of `module` (itself included) that `fully_shard` was applied to."""
    fsdp_module, _ = _fsdp_api()
    return [m for m in module.modules() if isinstance(m, fsdp_module)]


def fsdp_sum_gradients(
    module: torch.nn.Module, *, unsharded: Iterable[torch.nn.Parameter] = ()
) -> int:
    """Make every FSDPModule in `module` reduce gradients as a SUM over the mesh; returns how many.

    Call after `fully_shard` (of the layers and the root) and before the first forward;
    calling it again changes nothing. unsharded: parameters FSDP was told to ignore
    (`ignored_params`) that the caller sums itself after the last wave
    (`fcp_exec.all_reduce_gradients`), e.g. a replicated vision tower. Raises ConfigError when
    `module` holds no FSDPModule, or when any other trainable parameter is not FSDP's (not a
    DTensor): FSDP would never reduce it, so its gradient would silently stay one replica's
    share. fully_shard the root module too.
    """
    from torch.distributed.tensor import DTensor

    fsdp = fsdp_modules(module)
    if not fsdp:
        raise ConfigError(
            f"{type(module).__name__} is not fully_shard-ed: no FSDPModule inside it. Apply "
            "torch.distributed.fsdp.fully_shard to its layers and to the root first, or use "
            "fcp_exec.fsdp.fully_shard_for_fcp(model, layers=...)"
        )
    own = {id(p) for p in unsharded}
    stray = [
        n
        for n, p in module.named_parameters()
        if p.requires_grad and not isinstance(p, DTensor) and id(p) not in own
    ]
    if stray:
        shown = ", ".join(stray[:3]) + (f" and {len(stray) - 3} more" if len(stray) > 3 else "")
        raise ConfigError(
            f"{len(stray)} trainable parameter(s) of {type(module).__name__} are not sharded by "
            f"any FSDPModule ({shown}); FSDP reduces none of them. fully_shard the root module "
            "as well (after its layers), or pass the ones you sum yourself with "
            "fcp_exec.all_reduce_gradients as unsharded=... (call this before the first "
            "forward: the root keeps its parameters gathered between forward and backward)"
        )
    for m in fsdp:
        m.set_gradient_divide_factor(1.0)  # type: ignore[attr-defined]
        m.set_force_sum_reduction_for_comms(True)  # type: ignore[attr-defined]
    return len(fsdp)


def fully_shard_for_fcp(
    model: torch.nn.Module,
    *,
    layers: Iterable[torch.nn.Module],
    mesh: Any = None,
    ignored: Iterable[torch.nn.Module] = (),
    **fully_shard_kwargs: Any,
) -> torch.nn.Module:
    """fully_shard each of `layers`, then `model` itself, then `fsdp_sum_gradients(model)`.

    layers: the repeated blocks, one FSDP unit each (a transformers decoder:
    `model.model.layers`), so one layer's parameters are gathered at a time; mesh: a 1-D
    DeviceMesh (FSDP) or a 2-D one (HSDP, dimensions replicate x shard), default the whole
    world; ignored: submodules FSDP leaves alone (not sharded, not reduced), for a part that
    not every rank runs, such as a vision tower that a replica without vision tokens never
    calls: sum their gradients with `fcp_exec.all_reduce_gradients(module)` after the last
    wave; fully_shard_kwargs go to every fully_shard call (reshard_after_forward, mp_policy,
    ...). Apply activation checkpointing before or after: transformers (>= 5) checkpoints a
    layer's forward inside FSDP's hooks, so a recomputed layer is not gathered twice. Returns
    `model` (fully_shard changes its class in place).
    """
    _, fully_shard = _fsdp_api()
    blocks, skipped = list(layers), list(ignored)
    if not blocks:
        raise ConfigError(
            "layers is empty: pass the model's repeated blocks (a transformers decoder: "
            "layers=model.model.layers) so each is its own FSDP unit"
        )
    inside = {id(m) for m in model.modules()}
    for what, mods in (("layers", blocks), ("ignored", skipped)):
        for i, block in enumerate(mods):
            if id(block) not in inside or block is model:
                raise ConfigError(
                    f"{what}[{i}] ({type(block).__name__}) is not a submodule of "
                    f"{type(model).__name__}; pass blocks of the model itself (the root is "
                    "sharded last, on its own)"
                )
    unsharded = {p for m in skipped for p in m.parameters()}
    if unsharded:
        fully_shard_kwargs = {**fully_shard_kwargs, "ignored_params": unsharded}
    for block in blocks:
        fully_shard(block, mesh=mesh, **fully_shard_kwargs)
    fully_shard(model, mesh=mesh, **fully_shard_kwargs)
    fsdp_sum_gradients(model, unsharded=unsharded)
    return model
