"""The per-replica cost model (docs/design.md, the paper's Eq. 7-10 written per replica).

For an atomic group G of sequences s_k run by a CP group of degree d, one member replica spends

    attention  A(G, d) = Σ_k α1 (1 + η_k) |s_k|² / d        (η_k = 0 causal, η = 1 full)
    linear     L(G, d) = Σ_k α2 |s_k| / d  (+ α_v · vision tokens / d for the vision encoder)
    comm       C(G, d) = [d > 1] · ((d − 1)/d · Σ_k α3 |s_k| / v + β2 (d − 1))
    time       T(G, d) = A + L + C − min(A, C) + β1 = L + max(A, C) + β1

since ring P2P overlaps attention. v is the ring's slowest link (intra- or inter-node).
A cost model with head-parallel degrees (`head_parallel`, `transports.py`) also prices the
hybrid u x r (d = u r) of each allowed u dividing d,

    T_u(G, d) = L + max(A, C_ring_u) + C_a2a_u + β1,
    C_ring_u = [r > 1] ((r − 1)/r · share_u · Σ_k α3 |s_k| / v + β2 (r − 1)),
    C_a2a_u  = (u − 1)/u · bytes_u · Σ_k |s_k| / d / v_a2a + β3,

(the all-to-all does not hide behind attention) and a group runs the fastest transport: the
time of a group is min(T, min_u T_u), and the planner records the u it chose in the plan.
Without head-parallel degrees (the default) every time is the ring's, bit for bit. A CP
group runs at the pace of its slowest member: compute terms are divided by the smallest speed
factor of the group; communication is not.

Memory (Eq. 7) is checked on the padded shard actually held (`fcp_data.layout`): a sequence is
padded to a multiple of 2d·u (zigzag chunks, 2 at d = 1; u is the cluster's pad unit, TP under
sequence parallel and 1 otherwise) and each member holds 1/d of it, so a group fits when
Σ_k shard_tokens(s_k, d, u) ≤ tokens_per_replica. At TP = 8 with sequence parallel a 1000-token
sequence at d = 2 holds 512 tokens per member (1024 padded), not 500.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import ConfigError
from ...layout import padded_length, shard_tokens
from .cluster import Cluster
from .presets import DeviceSpec, ModelSpec
from .vision import VisionCost

__all__ = ["CostModel", "ring_bytes_per_token"]

# the head-parallel transport's fields (tuples, one entry per u, and its latency); see
# transports.py
TRANSPORT_FIELDS = ("head_parallel", "a2a_bytes", "ring_shares")
DKV_BYTES = 4  # dK/dV accumulators travel in fp32 so that the d block terms sum exactly


def ring_bytes_per_token(
    *, kv_heads: int, head_dim: int, activation_bytes: int = 2, layers: int = 1
) -> int:
    """Bytes per token that ring attention moves through one member, fwd + bwd (alpha3).

    Per layer and token of the packed (padded) sequence, `fcp_exec.ring_attention` sends K and V
    in the activation dtype twice (the forward ring and the backward ring) and dK/dV once in
    fp32, each over d - 1 hops of a 1/d shard: (d-1)/d * 2*H_kv*D * (2*activation_bytes + 4).
    The (d-1)/d factor is the comm term's; this returns the rest. bf16 Qwen3-8B (8 KV heads of
    128, 36 layers): 589,824 B per token, 1.33x the 3 passes of bf16 K/V a model without fp32
    dK/dV would assume.
    """
    return layers * 2 * kv_heads * head_dim * (2 * activation_bytes + DKV_BYTES)


@dataclass(kw_only=True, slots=True, frozen=True)
class CostModel:
    """Coefficients of the per-replica model. Times in seconds, sizes in bytes.

    alpha1: seconds per token² of causal attention, fwd+bwd, on one replica (d = 1).
    alpha2: seconds per token of the per-token layers (projections, MLP, LM head), fwd+bwd.
    alpha3: bytes per token that the ring moves (K and V forward, K, V and fp32 dK, dV
        backward; `ring_bytes_per_token`), times (d - 1)/d for a degree-d ring.
    beta1: fixed seconds per micro-batch (launches, optimizer-free overhead).
    beta2: seconds of latency per ring step (d − 1 steps per pass).
    intra_node_bandwidth / inter_node_bandwidth: bytes/s of one P2P link (v in Eq. 9).
    bytes_per_token: activation bytes one token keeps alive on its replica (M_token).
    static_bytes: model states per replica (M_ms).
    eta_full: extra attention work of a bidirectional sequence over a causal one (η).
    alpha_vision: seconds per vision token of the vision encoder (0 for text-only models).
    name: where the coefficients came from (preset, profile file), for reports.
    vision: the vision encoder's and decoder's terms per unit a replica holds (`vision.py`;
    None for text-only models); used when a batch's vision work is given to the planner.
    head_parallel: the u >= 2 of the head-parallel hybrid the model's heads allow
        (`transports.head_parallel_degrees`); empty (the default) prices the ring alone.
    a2a_bytes: per u, bytes a member's all-to-alls move per local token, fwd + bwd, without
        the (u - 1)/u factor (`transports.a2a_bytes_per_token`).
    ring_shares: per u, the share of alpha3 the hybrid's ring moves (`transports.ring_share`).
    beta3: seconds of latency of a micro-batch's all-to-alls (4 per layer).
    a2a_efficiency: bandwidth an all-to-all reaches over the link's P2P bandwidth (1.0 in the
        presets; `fcp profile --head-parallel` measures it).
    """

    alpha1: float
    alpha2: float
    alpha3: float = 0.0
    beta1: float = 0.0
    beta2: float = 0.0
    intra_node_bandwidth: float = 1e11
    inter_node_bandwidth: float = 2.5e10
    bytes_per_token: float = 0.0
    static_bytes: float = 0.0
    eta_full: float = 1.0
    alpha_vision: float = 0.0
    name: str = "custom"
    vision: VisionCost | None = None
    head_parallel: tuple[int, ...] = ()
    a2a_bytes: tuple[float, ...] = ()
    ring_shares: tuple[float, ...] = ()
    beta3: float = 0.0
    a2a_efficiency: float = 1.0

    def __post_init__(self) -> None:
        self._check_transports()
        for f in fields(self):
            if f.name in ("name", "vision") or f.name in TRANSPORT_FIELDS:
                continue
            v = getattr(self, f.name)
            ok = isinstance(v, (int, float)) and not isinstance(v, bool)
            if not ok or not math.isfinite(v) or v < 0:
                raise ConfigError(
                    f"CostModel.{f.name}={v!r} must be a finite number >= 0 "
                    "(refit the profile or fix the preset)"
                )
        if not isinstance(self.name, str):
            raise ConfigError(f"CostModel.name={self.name!r} must be a string")
        for f in ("intra_node_bandwidth", "inter_node_bandwidth"):
            if getattr(self, f) <= 0:
                raise ConfigError(f"CostModel.{f}={getattr(self, f)!r} must be > 0 (bytes/s)")
        if self.alpha1 == 0 and self.alpha2 == 0:
            raise ConfigError("CostModel needs alpha1 > 0 or alpha2 > 0: every plan would cost 0")

    def _check_transports(self) -> None:
        """Tuples (a JSON file gives lists), one entry per u, u >= 2 distinct, finite >= 0."""
        for name in TRANSPORT_FIELDS:
            raw = getattr(self, name)
            if not isinstance(raw, (tuple, list)):
                raise ConfigError(f"CostModel.{name}={raw!r} must be a tuple (one entry per u)")
            object.__setattr__(self, name, tuple(raw))
        us, sizes, shares = self.head_parallel, self.a2a_bytes, self.ring_shares
        if not len(us) == len(sizes) == len(shares):
            raise ConfigError(
                f"CostModel.head_parallel={us}, a2a_bytes={sizes} and ring_shares={shares} need "
                "one entry per head-parallel degree u"
            )
        if any(isinstance(u, bool) or not isinstance(u, int) or u < 2 for u in us) or len(
            set(us)
        ) != len(us):
            raise ConfigError(
                f"CostModel.head_parallel={us} must hold distinct integers u >= 2 (the ring, u = "
                "1, is always allowed)"
            )
        for name, vals in (("a2a_bytes", sizes), ("ring_shares", shares)):
            for v in vals:
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                    raise ConfigError(f"CostModel.{name}={vals} must hold finite numbers >= 0")
                if v < 0:
                    raise ConfigError(f"CostModel.{name}={vals} must hold finite numbers >= 0")
        eff = self.a2a_efficiency
        if isinstance(eff, bool) or not isinstance(eff, (int, float)) or not eff > 0:
            raise ConfigError(
                f"CostModel.a2a_efficiency={eff!r} must be > 0 (all-to-all bandwidth over the "
                "link's P2P bandwidth; 1.0 when unmeasured)"
            )
        if us and self.alpha3 <= 0:
            raise ConfigError(
                f"CostModel.head_parallel={us} needs alpha3 > 0 (the ring's bytes per token): "
                "without ring traffic there is nothing for a head-parallel transport to save"
            )

    # ---- the model ---------------------------------------------------------------------
    @property
    def has_transports(self) -> bool:
        """Whether a head-parallel hybrid is priced beside the ring."""
        return bool(self.head_parallel)

    def transport_params(self) -> np.ndarray:
        """The transports as the kernels read them: (u, a2a_bytes / alpha3 / a2a_efficiency,
        ring share) per u, flattened (an empty array without transports)."""
        rows = [
            (float(u), a / self.alpha3 / self.a2a_efficiency, sh)
            for u, a, sh in zip(self.head_parallel, self.a2a_bytes, self.ring_shares)
        ]
        return np.array(rows, dtype=np.float64).reshape(-1)

    def bandwidth(self, inter_node: bool) -> float:
        return self.inter_node_bandwidth if inter_node else self.intra_node_bandwidth

    def aggregates(
        self,
        seqlens: Sequence[int] | np.ndarray,
        causal: bool | Sequence[bool] | np.ndarray = True,
        vision_tokens: Sequence[int] | np.ndarray | None = None,
    ) -> tuple[float, float, float]:
        """(attention, linear, comm bytes) of a group at d = 1: Σα1(1+η)s², Σα2 s, Σα3 s."""
        s = np.asarray(seqlens, dtype=np.float64)
        c = np.broadcast_to(np.asarray(causal, dtype=bool), s.shape)
        att = float(np.sum(self.alpha1 * (1.0 + np.where(c, 0.0, self.eta_full)) * s * s))
        lin = float(self.alpha2 * s.sum())
        if vision_tokens is not None:
            lin += float(self.alpha_vision * np.sum(np.asarray(vision_tokens, dtype=np.float64)))
        return att, lin, float(self.alpha3 * s.sum())

    def time_from_aggregates(
        self,
        att: float,
        lin: float,
        comm: float,
        degree: int,
        *,
        inter_node: bool = False,
        speed: float = 1.0,
        blocks_inter_node: Callable[[int], bool] | None = None,
    ) -> float:
        """T(G, d) from a group's d = 1 aggregates (see module docstring): the fastest
        transport's time. `blocks_inter_node(u)` says whether an all-to-all block of u members
        spans nodes (default: when the group does)."""
        return self.transport_from_aggregates(
            att,
            lin,
            comm,
            degree,
            inter_node=inter_node,
            speed=speed,
            blocks_inter_node=blocks_inter_node,
        )[0]

    def transport_from_aggregates(
        self,
        att: float,
        lin: float,
        comm: float,
        degree: int,
        *,
        inter_node: bool = False,
        speed: float = 1.0,
        blocks_inter_node: Callable[[int], bool] | None = None,
        ulysses: int | None = None,
    ) -> tuple[float, int]:
        """(T(G, d), u) of the fastest transport; u = 1 is the ring, which wins ties.

        `ulysses` prices that one transport instead (a saved plan's choice, `score_plan`);
        ValueError when it does not divide the degree or the model does not allow it."""
        d = int(degree)
        if ulysses not in (None, 1) and (d % ulysses or ulysses not in self.head_parallel):
            raise ConfigError(
                f"ulysses={ulysses} at degree {d}: u must divide the degree and be one of "
                f"the cost model's head-parallel degrees {self.head_parallel} (1: the ring)"
            )
        a = att / d / speed
        lin_t = lin / d / speed
        c = 0.0
        if d > 1:
            c = (d - 1) / d * comm / self.bandwidth(inter_node) + self.beta2 * (d - 1)
        best, best_u = lin_t + max(a, c) + self.beta1 / speed, 1
        if d == 1 or not self.head_parallel or ulysses == 1:
            return best, best_u
        if ulysses is not None:
            best = math.inf
        for u, nbytes, share in zip(self.head_parallel, self.a2a_bytes, self.ring_shares):
            if d % u or (ulysses is not None and u != ulysses):
                continue
            r = d // u
            ring = 0.0
            if r > 1:
                ring = (r - 1) / r * share * comm / self.bandwidth(inter_node)
                ring += self.beta2 * (r - 1)
            block_inter = inter_node if blocks_inter_node is None else blocks_inter_node(u)
            # comm = α3 Σ|s_k|: the kernels' form, same rounding
            ratio = nbytes / self.alpha3 / self.a2a_efficiency
            a2a = (u - 1) / u * ratio * comm / d / self.bandwidth(block_inter) + self.beta3
            t = lin_t + max(a, ring) + a2a + self.beta1 / speed
            if t < best:
                best, best_u = t, u
        return best, best_u

    def group_time(
        self,
        seqlens: Sequence[int] | np.ndarray,
        degree: int,
        *,
        causal: bool | Sequence[bool] | np.ndarray = True,
        inter_node: bool = False,
        vision_tokens: Sequence[int] | np.ndarray | None = None,
        speed: float = 1.0,
        blocks_inter_node: Callable[[int], bool] | None = None,
        ulysses: int | None = None,
    ) -> float:
        """Predicted seconds for one replica of a degree-`degree` CP group running `seqlens`
        (the fastest transport, or the one `ulysses` names; `transport_from_aggregates` also
        says which)."""
        if int(degree) < 1:
            raise ConfigError(f"degree={degree} must be >= 1")
        att, lin, comm = self.aggregates(seqlens, causal, vision_tokens)
        return self.transport_from_aggregates(
            att,
            lin,
            comm,
            degree,
            inter_node=inter_node,
            speed=speed,
            blocks_inter_node=blocks_inter_node,
            ulysses=ulysses,
        )[0]

    def placeholder_seconds(self, cluster: Cluster) -> np.ndarray:
        """Seconds each replica spends on one placeholder micro-batch, zeros when it runs none.

        A replica that sits a wave out runs the loader's placeholder under `cluster.idle`
        "placeholder" or "fill": one causal sequence of 2 x pad_unit tokens at degree 1
        (`MicroBatch.placeholder`), at the replica's own speed. It is almost all beta1: 1.79 ms
        for Qwen3-8B on one H200, 1.62 ms of it beta1. Under "empty" it runs nothing (0 s).
        """
        if cluster.idle == "empty":
            return np.zeros(cluster.num_replicas)
        att, lin, comm = self.aggregates([2 * cluster.pad_unit], True)
        speeds = cluster.speeds()
        by_speed = {
            s: self.time_from_aggregates(att, lin, comm, 1, speed=s)
            for s in sorted(set(speeds.tolist()))
        }
        return np.array([by_speed[s] for s in speeds.tolist()], dtype=np.float64)

    def ring_bytes(
        self, seqlens: Sequence[int] | np.ndarray, degree: int, *, unit: int = 1
    ) -> float:
        """Bytes one member of a degree-d ring sends for these sequences (fwd + bwd).

        Counts the padded lengths that really travel (multiples of 2d × `unit`, the pad unit);
        the time model's comm term charges the real lengths (padding adds < 2d·unit tokens per
        sequence).
        """
        d = int(degree)
        if d <= 1:
            return 0.0
        tokens = sum(padded_length(int(s), d, unit) for s in np.asarray(seqlens).reshape(-1))
        return (d - 1) * self.alpha3 * tokens / d

    def sequence_work(self, seqlens: np.ndarray, causal: np.ndarray | bool = True) -> np.ndarray:
        """Replica-seconds each sequence needs at the least (d · T without comm or β1).

        d·A and d·L do not depend on d, so this is a lower bound on any plan's work.
        """
        s = np.asarray(seqlens, dtype=np.float64)
        c = np.broadcast_to(np.asarray(causal, dtype=bool), s.shape)
        return self.alpha1 * (1.0 + np.where(c, 0.0, self.eta_full)) * s * s + self.alpha2 * s

    def capacity_tokens(self, cluster: Cluster) -> int:
        return cluster.capacity_tokens(self.bytes_per_token, self.static_bytes)

    def shard_tokens(
        self, seqlens: Sequence[int] | np.ndarray, degree: int, cluster: Cluster
    ) -> int:
        """Tokens one member of a degree-d group holds, padding included: Σ_k shard_tokens(s_k,
        d, cluster.pad_unit), what the collator allocates (21 + 10 tokens at d = 1: 22 + 10;
        at TP = 4 under sequence parallel: 24 + 16)."""
        s = np.asarray(seqlens, dtype=np.int64).reshape(-1)
        return int(np.sum(shard_tokens(s, int(degree), cluster.pad_unit)))

    def fits(self, seqlens: Sequence[int] | np.ndarray, degree: int, cluster: Cluster) -> bool:
        """Whether a degree-d group of these sequences fits one replica's capacity (Eq. 7)."""
        return self.shard_tokens(seqlens, degree, cluster) <= self.capacity_tokens(cluster)

    def min_degree(self, seqlens: Sequence[int] | np.ndarray, cluster: Cluster) -> int:
        """Smallest degree whose padded per-replica shard fits (Eq. 3 / Eq. 7), padded with the
        cluster's pad unit.

        Raises ValueError when even all N replicas cannot hold the group.
        """
        cap = self.capacity_tokens(cluster)
        unit = cluster.pad_unit
        s = np.asarray(seqlens, dtype=np.int64)
        if s.size == 0:
            return 1
        d = max(1, -(-int(s.sum()) // cap))
        while d <= cluster.num_replicas:
            local = int(np.sum(shard_tokens(s, d, unit)))
            if local <= cap:
                return d
            d += 1
        raise ConfigError(
            f"{int(s.sum())} tokens (longest sequence {int(s.max())}) do not fit on all "
            f"{cluster.num_replicas} replicas of {cap} tokens each; raise tokens_per_replica / "
            "memory_bytes, add replicas, or drop such sequences (plan_global_batch(..., "
            "on_too_long='drop'))"
        )

    # ---- construction ------------------------------------------------------------------
    @classmethod
    def from_model(
        cls,
        model: str | ModelSpec,
        device: str | DeviceSpec,
        *,
        tensor_parallel: int = 1,
        pipeline_parallel: int = 1,
        pipeline_micro_batches: int = 8,
        head_parallel: bool = False,
        **overrides: Any,
    ) -> CostModel:
        """Estimate coefficients from a model config and a device (no profile needed).

        `model` and `device` are preset names (`"qwen3-8b"`, `"h200"`, ...; see
        `fcp_data.planner.cost.presets`) or specs. A replica is `tensor_parallel` ×
        `pipeline_parallel` devices: TP = 8 gives it 8x the compute of one device and 8 rings
        in parallel, each carrying 1/8 of the K/V bytes; PP stages pipeline with the 1F1B
        bubble of `pipeline_micro_batches` micro-batches (`estimate.estimate_cost_model`).
        `head_parallel=True` also prices the head-parallel hybrid u x r for every u the heads
        of one TP rank allow (`transports.py`); the training side must then attend with
        `fcp_exec.cp_attention`, which runs each group's transport. Keyword overrides replace
        single coefficients. A TP that does not divide the heads or KV heads raises ConfigError.
        """
        from .estimate import estimate_cost_model  # the room's one cycle: it builds CostModels

        est = estimate_cost_model(
            model,
            device,
            tensor_parallel=tensor_parallel,
            pipeline_parallel=pipeline_parallel,
            pipeline_micro_batches=pipeline_micro_batches,
            head_parallel=head_parallel,
        )
        return replace(est, **overrides)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps({"fcp_cost_model": 1, **asdict(self)}, indent=2))

    @classmethod
    def load(cls, path: str | Path) -> CostModel:
        """Read a cost model saved by `save` or written by `fcp profile`, or a shipped profile by
        name: `CostModel.load("cpu-small")` as `fcp plan --cost cpu-small` takes it.

        An existing file wins over a shipped name (the CLI's rule, `profiles.resolve_cost`);
        neither is a ConfigError naming the file looked for and every shipped profile."""
        file = Path(path)
        if not file.is_file():
            from ...profiles import resolve_cost  # stdlib only: no torch, no numpy

            file = resolve_cost(path, what="CostModel.load")
        raw = json.loads(file.read_text())
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: a cost model file holds a JSON object, got {type(raw)}")
        raw = dict(raw.get("cost_model", raw))
        raw.pop("fcp_cost_model", None)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ConfigError(
                f"{path}: unknown cost-model fields {unknown}; known: {sorted(known)}"
            )
        if isinstance(raw.get("vision"), dict):  # the vision encoder's terms (vision.py)
            raw["vision"] = VisionCost(**raw["vision"])
        return cls(**raw)

    def perturbed(self, rng: np.random.Generator, noise: float) -> CostModel:
        """A copy with alpha/beta coefficients scaled by U(1 − noise, 1 + noise) (robustness)."""
        keys = ("alpha1", "alpha2", "alpha3", "beta1", "beta2")
        return replace(
            self, **{k: getattr(self, k) * float(rng.uniform(1 - noise, 1 + noise)) for k in keys}
        )
