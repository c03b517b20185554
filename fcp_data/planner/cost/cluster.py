"""The cluster a plan is made for: replicas, nodes, per-replica capacity and speed."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from ...errors import ConfigError
from .memory import MemoryBudget
from .memory import replicas_per_node as rpn_of

__all__ = ["IDLE_POLICIES", "Cluster", "IdlePolicy"]

# What a replica runs in a wave it has no CP group in, and so what that (replica, wave) slot
# costs the plan (docs/design.md, "The cost model"):
# - "placeholder": the loader's placeholder micro-batch, one loss-free sequence of 2 x pad_unit
#   tokens at degree 1. It still pays a full forward and backward, mostly the fixed beta1 (1.79
#   ms of which 1.62 ms is beta1 for Qwen3-8B on one H200), and is what FSDP, megatron DDP with
#   overlapped gradient reduction and pipeline parallelism need: every rank runs every
#   micro-batch or the job deadlocks.
# - "empty": nothing runs (a zero-token micro-batch; plain loops without collectives inside the
#   step). The slot costs nothing: the plans and times of the planner before idle pricing.
# - "fill": the planner gives idle slots real work where that is predicted no slower (it widens
#   a group of that wave onto idle neighbours, or moves a sequence there); the slots left run a
#   placeholder and are priced as one.
IDLE_POLICIES = ("placeholder", "empty", "fill")
IdlePolicy = Literal["placeholder", "empty", "fill"]


def _whole(name: str, value: object) -> int:
    """An integer >= 1; 1.5 (which int() would read as 1), bools and strings are refused."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ConfigError(f"{name}={value!r} must be an integer >= 1, got {type(value).__name__}")
    if value < 1:
        raise ConfigError(f"{name}={value} must be >= 1")
    return int(value)


def _replicas_per_node(
    num_replicas: int,
    replicas_per_node: int | None,
    devices_per_node: int | None,
    tensor_parallel: int,
    pipeline_parallel: int,
) -> int:
    """The one rule for replicas per node (the constructor, `from_budget` and the CLI).

    `devices_per_node` // (TP x PP) when the devices per node are given (8 GPUs at TP = 8 -> 1,
    `memory.replicas_per_node`); `replicas_per_node` when given (both given must agree); all
    replicas on one node when a replica is one device and neither is given. A replica of
    several devices with neither given is refused: assuming one node would price every ring of
    a 64-GPU job as intra-node."""
    rpn = None if replicas_per_node is None else _whole("replicas_per_node", replicas_per_node)
    if devices_per_node is not None:
        derived = rpn_of(devices_per_node, tensor_parallel, pipeline_parallel)
        if rpn is not None and rpn != derived:
            raise ConfigError(
                f"replicas_per_node={rpn} contradicts devices_per_node={devices_per_node} at "
                f"TP x PP = {tensor_parallel} x {pipeline_parallel} ({derived} replicas per "
                "node); give one of them"
            )
        return derived
    if rpn is not None:
        return rpn
    per = _whole("tensor_parallel", tensor_parallel) * _whole(
        "pipeline_parallel", pipeline_parallel
    )
    if per > 1:
        raise ConfigError(
            f"a replica spans TP x PP = {tensor_parallel} x {pipeline_parallel} = {per} devices, "
            "so the replicas per node depend on the node: give devices_per_node= (8 on an "
            f"8-GPU node -> {max(8 // per, 1)} per node) or replicas_per_node="
        )
    return num_replicas


@dataclass(kw_only=True, slots=True, frozen=True, init=False)
class Cluster:
    """N replicas (each a full TP×PP model copy), grouped into nodes.

    Capacity is given either in tokens (`tokens_per_replica`: a CP group of degree d holds at
    most d × tokens_per_replica tokens, padding included) or in bytes (`memory_bytes`, turned into
    tokens through the cost model's activation and model-state terms by `capacity_tokens`).
    `speed` holds optional per-replica speed factors (1.0 = the profiled device): a CP group runs
    at the pace of its slowest member, so mixed hardware is planned, not averaged away.

    Two fields say how the training framework runs the micro-batches, and so how a plan is
    priced. `idle` (`IDLE_POLICIES`, default "placeholder", the loader's default) is what a
    replica runs in a wave it sits out: a placeholder micro-batch (priced at its real cost, in
    the replica's own order of micro-batches, so it may delay the replica's next group), nothing
    ("empty"), or real work the planner moves there ("fill"). `sync_waves` (default False) puts
    a barrier after every wave, as under FSDP / ZeRO-3 where each layer's all-gather spans every
    rank, so a wave ends when its slowest member does.

    Replicas per node (what prices a ring as intra- or inter-node): `devices_per_node` //
    (TP x PP) when given, else `replicas_per_node`; without either, every replica on one node,
    which a replica of several devices refuses (`_replicas_per_node`).
    """

    num_replicas: int
    replicas_per_node: int
    tokens_per_replica: int | None
    memory_bytes: float | None
    speed: tuple[float, ...] | None = field(default=None)
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    sequence_parallel: bool = False
    idle: IdlePolicy = "placeholder"
    sync_waves: bool = False

    def __init__(
        self,
        num_replicas: int,
        *,
        replicas_per_node: int | None = None,
        devices_per_node: int | None = None,
        tokens_per_replica: int | None = None,
        memory_bytes: float | None = None,
        speed: tuple[float, ...] | list[float] | np.ndarray | None = None,
        tensor_parallel: int = 1,
        pipeline_parallel: int = 1,
        sequence_parallel: bool = False,
        idle: IdlePolicy = "placeholder",
        sync_waves: bool = False,
    ) -> None:
        num_replicas = _whole("num_replicas", num_replicas)
        rpn = _replicas_per_node(
            num_replicas, replicas_per_node, devices_per_node, tensor_parallel, pipeline_parallel
        )
        if (tokens_per_replica is None) == (memory_bytes is None):
            raise ConfigError(
                "give exactly one of tokens_per_replica= (capacity in tokens) or memory_bytes= "
                f"(device memory, turned into tokens by the cost model); got "
                f"tokens_per_replica={tokens_per_replica!r}, memory_bytes={memory_bytes!r}"
            )
        if tokens_per_replica is not None:
            tokens_per_replica = _whole("tokens_per_replica", tokens_per_replica)
        if memory_bytes is not None and not (
            isinstance(memory_bytes, (int, float, np.number))
            and not isinstance(memory_bytes, bool)
            and math.isfinite(float(memory_bytes))
            and float(memory_bytes) > 0
        ):
            raise ConfigError(f"memory_bytes={memory_bytes!r} must be a positive finite number")
        sp: tuple[float, ...] | None = None
        if speed is not None:
            sp = tuple(float(s) for s in speed)
            if len(sp) != num_replicas:
                raise ConfigError(
                    f"speed has {len(sp)} factors but num_replicas={num_replicas}: give one "
                    "speed factor per replica"
                )
            bad = [s for s in sp if not (math.isfinite(s) and s > 0)]
            if bad:
                raise ConfigError(f"speed factors must be positive and finite, got {bad[:3]}")
            if all(s == 1.0 for s in sp):
                sp = None
        object.__setattr__(self, "num_replicas", int(num_replicas))
        object.__setattr__(self, "replicas_per_node", min(rpn, int(num_replicas)))
        object.__setattr__(
            self,
            "tokens_per_replica",
            None if tokens_per_replica is None else int(tokens_per_replica),
        )
        object.__setattr__(
            self, "memory_bytes", None if memory_bytes is None else float(memory_bytes)
        )
        object.__setattr__(self, "speed", sp)
        object.__setattr__(self, "tensor_parallel", _whole("tensor_parallel", tensor_parallel))
        object.__setattr__(
            self, "pipeline_parallel", _whole("pipeline_parallel", pipeline_parallel)
        )
        if not isinstance(sequence_parallel, (bool, np.bool_)):
            raise ConfigError(f"sequence_parallel={sequence_parallel!r} must be True or False")
        object.__setattr__(self, "sequence_parallel", bool(sequence_parallel))
        if not isinstance(idle, str) or idle not in IDLE_POLICIES:
            raise ConfigError(
                f"idle={idle!r} is not one of {IDLE_POLICIES}: 'placeholder' when the framework "
                "needs every rank in every micro-batch (FSDP, DDP with overlapped reduction, "
                "pipeline parallel), 'empty' for a plain loop, 'fill' to let the planner give "
                "idle replicas real work"
            )
        object.__setattr__(self, "idle", idle)
        if not isinstance(sync_waves, (bool, np.bool_)):
            raise ConfigError(
                f"sync_waves={sync_waves!r} must be True (a barrier after every wave, as under "
                "FSDP / ZeRO-3) or False"
            )
        object.__setattr__(self, "sync_waves", bool(sync_waves))

    @classmethod
    def from_budget(
        cls,
        budget: MemoryBudget,
        *,
        devices_per_node: int | None = None,
        replicas_per_node: int | None = None,
        speed: tuple[float, ...] | list[float] | np.ndarray | None = None,
        idle: IdlePolicy = "placeholder",
        sync_waves: bool = False,
    ) -> Cluster:
        """The cluster a derived memory budget describes (`memory.derive_tokens_per_replica`):
        its N replicas, tokens_per_replica and layout (TP, PP, sequence parallel); `idle` and
        `sync_waves` as in the constructor.

        Replicas per node follow the layout: `devices_per_node` // (TP × PP), 8 H200 at TP = 8
        -> 1 (`memory.replicas_per_node`); or give `replicas_per_node` itself. Both given and
        disagreeing raises ConfigError.
        """
        lay = budget.layout
        return cls(
            budget.num_replicas,
            replicas_per_node=replicas_per_node,
            devices_per_node=devices_per_node,
            tokens_per_replica=budget.tokens_per_replica,
            speed=speed,
            tensor_parallel=lay.tensor_parallel,
            pipeline_parallel=lay.pipeline_parallel,
            sequence_parallel=lay.sequence_parallel,
            idle=idle,
            sync_waves=sync_waves,
        )

    @property
    def pad_unit(self) -> int:
        """Per-chunk multiple of the layout contract (`fcp_data.layout.pad_unit`): TP under
        sequence parallel, else 1. The planner's memory check and the collator both use it."""
        return self.tensor_parallel if self.sequence_parallel else 1

    @property
    def prices_idle(self) -> bool:
        """Whether a replica that sits a wave out still runs (and pays for) a micro-batch."""
        return self.idle != "empty"

    @property
    def num_nodes(self) -> int:
        return -(-self.num_replicas // self.replicas_per_node)

    def node_of(self, replica: int) -> int:
        return replica // self.replicas_per_node

    def speeds(self) -> np.ndarray:
        if self.speed is None:
            return np.ones(self.num_replicas)
        return np.asarray(self.speed, dtype=np.float64)

    @property
    def heterogeneous(self) -> bool:
        return self.speed is not None

    def capacity_tokens(self, bytes_per_token: float, static_bytes: float) -> int:
        """Tokens one replica can hold: Eq. 7 solved for the token count."""
        if self.tokens_per_replica is not None:
            return self.tokens_per_replica
        assert self.memory_bytes is not None
        free = self.memory_bytes - static_bytes
        cap = int(free // bytes_per_token) if bytes_per_token > 0 else 0
        if cap < 1:
            raise ConfigError(
                f"memory_bytes={self.memory_bytes:.3g} leaves no room for activations: model "
                f"states take {static_bytes:.3g} bytes and a token {bytes_per_token:.3g} bytes; "
                "give more memory or a smaller model"
            )
        return cap

    def spans_nodes(self, replicas: tuple[int, ...] | list[int]) -> bool:
        return len({r // self.replicas_per_node for r in replicas}) > 1
