"""One planning problem in array form.

`Problem` validates the inputs once (lengths, causal flags, cluster, cost model) and
precomputes per-sequence aggregates so that candidates (`paper`, `lanes`, `moldable`,
`baselines`), the lower bound (`bounds`) and the scorer (`schedule`) share them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ...errors import ArgumentTypeError, ConfigError
from ...layout import min_degree
from ..kernels import (
    BETA1,
    BETA2,
    BETA3,
    INTER_NODE_BANDWIDTH,
    INTRA_NODE_BANDWIDTH,
    REPLICAS_PER_NODE,
    TRANSPORTS,
    window_transports,
)
from .cluster import Cluster
from .model import CostModel
from .transports import blocks_span_nodes
from .vision import VisionLoad

__all__ = ["Problem"]


def _as_lengths(seqlens: Sequence[int] | np.ndarray) -> np.ndarray:
    arr = np.asarray(seqlens)
    if arr.ndim != 1:
        raise ConfigError(f"seqlens must be one-dimensional, got shape {arr.shape}")
    if arr.size == 0:
        raise ConfigError("seqlens is empty: a global batch needs at least one sequence")
    if arr.dtype.kind == "f":
        if not np.all(np.isfinite(arr)) or np.any(arr != np.round(arr)):
            bad = arr[~np.isfinite(arr) | (arr != np.round(arr))][:3]
            raise ConfigError(f"seqlens must be whole token counts, got {bad.tolist()}")
    elif arr.dtype.kind not in "iu":
        raise ConfigError(f"seqlens must be integers, got dtype {arr.dtype}")
    arr = arr.astype(np.int64)
    if np.any(arr < 1):
        idx = np.flatnonzero(arr < 1)[:3]
        raise ConfigError(
            f"sequence lengths must be >= 1 token; sequence ids {idx.tolist()} have "
            f"{arr[idx].tolist()} (drop empty samples before planning)"
        )
    return arr


@dataclass(slots=True)
class Problem:
    """Validated inputs and per-sequence aggregates of one global batch.

    Per sequence: `lens` (tokens), `causal`, `att` / `lin` / `comm` (its d = 1 attention
    seconds, per-token-layer seconds and ring bytes), `work` (att + lin, the replica-seconds it
    needs at the least), `dmin` (smallest allowed degree holding it alone, 0 when none does),
    `overhead` (its share of β1) and `order` (longest first). `cap` is the tokens one replica
    holds and `unit` the layout's pad unit (`Cluster.pad_unit`: TP under sequence parallel,
    else 1): a group of degree d fits when Σ_k shard_tokens(s_k, d, unit) <= cap, the shard
    the collator allocates (TP = 8 under sequence parallel: a 21-token sequence at d = 1 holds
    32 tokens, not 22). `allowed[d]` whether degree d may be used, `cost_params` the kernels'
    packed cost constants (see `kernels`). With `vision` (a batch's priced vision work), `lin`
    also holds each sequence's vision replica-seconds (what the candidates balance) and the
    scorer adds each group's exact vision time (`vision.py`); `lin_llm` is the language
    model's part. `idle_s` holds the seconds each replica's placeholder micro-batch costs in a
    wave it sits out (`CostModel.placeholder_seconds`: 1.79 ms for Qwen3-8B on one H200, zeros
    under `Cluster(idle="empty")`) and `sync` whether every wave ends with a barrier
    (`Cluster.sync_waves`); the scorer prices both (`kernels.priced_critical_path`).
    """

    cost: CostModel
    cluster: Cluster
    lens: np.ndarray
    causal: np.ndarray
    cap: int
    num_replicas: int
    replicas_per_node: int
    speed: np.ndarray
    cost_params: np.ndarray
    allowed: np.ndarray
    vision: VisionLoad | None = None
    unit: int = 1
    idle_s: np.ndarray | None = None
    sync: bool = False
    att: np.ndarray = field(init=False)
    lin: np.ndarray = field(init=False)
    lin_llm: np.ndarray = field(init=False)
    comm: np.ndarray = field(init=False)
    work: np.ndarray = field(init=False)
    dmin: np.ndarray = field(init=False)
    order: np.ndarray = field(init=False)
    overhead: np.ndarray = field(init=False)

    @classmethod
    def build(
        cls,
        seqlens: Sequence[int] | np.ndarray,
        cluster: Cluster,
        cost: CostModel,
        *,
        causal: bool | Sequence[bool] | np.ndarray = True,
        pow2: bool = False,
        seed: int = 0,
        vision: VisionLoad | None = None,
    ) -> Problem:
        if not isinstance(cluster, Cluster):
            raise ArgumentTypeError(
                f"cluster must be a fcp_data.planner.Cluster, got {type(cluster)}"
            )
        if not isinstance(cost, CostModel):
            raise ArgumentTypeError(f"cost must be a fcp_data.planner.CostModel, got {type(cost)}")
        lens = _as_lengths(seqlens)
        flags = np.asarray(causal)
        if flags.ndim == 0:
            flags = np.full(lens.shape, bool(flags))
        elif flags.shape != lens.shape:
            raise ConfigError(
                f"causal has {flags.size} flags for {lens.size} sequences: give one bool or one "
                "per sequence"
            )
        flags = flags.astype(bool)
        num_replicas = cluster.num_replicas
        allowed = np.zeros(num_replicas + 1, dtype=np.bool_)
        if pow2:
            d = 1
            while d <= num_replicas:
                allowed[d] = True
                d *= 2
        else:
            allowed[1:] = True
        cost_params = np.zeros(TRANSPORTS)
        cost_params[BETA1] = cost.beta1
        cost_params[BETA2] = cost.beta2
        cost_params[INTRA_NODE_BANDWIDTH] = cost.intra_node_bandwidth
        cost_params[INTER_NODE_BANDWIDTH] = cost.inter_node_bandwidth
        cost_params[REPLICAS_PER_NODE] = cluster.replicas_per_node
        cost_params[BETA3] = cost.beta3
        cost_params = np.concatenate([cost_params, cost.transport_params()])
        prob = cls(
            cost=cost,
            cluster=cluster,
            lens=lens,
            causal=flags,
            cap=cost.capacity_tokens(cluster),
            num_replicas=num_replicas,
            replicas_per_node=cluster.replicas_per_node,
            speed=cluster.speeds(),
            cost_params=cost_params,
            allowed=allowed,
            vision=vision,
            unit=cluster.pad_unit,
            idle_s=cost.placeholder_seconds(cluster),
            sync=cluster.sync_waves,
        )
        prob._aggregate(seed)
        return prob

    def _aggregate(self, seed: int) -> None:
        s = self.lens.astype(np.float64)
        eta = np.where(self.causal, 0.0, self.cost.eta_full)
        self.att = self.cost.alpha1 * (1.0 + eta) * s * s
        self.lin = self.lin_llm = self.cost.alpha2 * s
        if self.vision is not None:
            self.lin = self.lin_llm + self.vision.total
        self.comm = self.cost.alpha3 * s
        self.work = self.att + self.lin
        self.dmin = self.min_degrees(self.lens)
        # β1 share of each sequence: a micro-batch of d × cap tokens pays β1 once per replica.
        self.overhead = self.cost_params[BETA1] * self.lens / self.cap
        # Longest first; equal lengths in an order fixed by the seed (deterministic).
        tie = np.random.default_rng(seed).permutation(self.lens.size)
        self.order = np.lexsort((tie, -self.work)).astype(np.int64)

    @property
    def priced(self) -> bool:
        """Whether idle slots cost time or waves end with barriers: the wave-aware scorer."""
        return self.sync or (self.idle_s is not None and bool(np.any(self.idle_s > 0)))

    def min_degrees(self, lens: np.ndarray) -> np.ndarray:
        """Smallest allowed degree holding each sequence alone (0 where none does)."""
        # any larger degree fits too: shards shrink with d
        d = min_degree(lens, self.cap, self.unit)
        allowed_deg = np.flatnonzero(self.allowed)
        pos = np.searchsorted(allowed_deg, d)
        out = np.where(
            (pos < allowed_deg.size) & (d > 0),
            allowed_deg[np.minimum(pos, allowed_deg.size - 1)],
            0,
        )
        return out.astype(np.int64)

    def group_times(
        self, starts: np.ndarray, degs: np.ndarray, units: np.ndarray, unit_group: np.ndarray
    ) -> np.ndarray:
        """Predicted time of each group (window + its sequences), vectorised over groups."""
        g = starts.size
        att = np.bincount(unit_group, weights=self.att[units], minlength=g)
        lin = np.bincount(unit_group, weights=self.lin_llm[units], minlength=g)
        comm = np.bincount(unit_group, weights=self.comm[units], minlength=g)
        times = self.window_times(att, lin, comm, starts, degs)
        if self.vision is not None:
            speed = self.speed if self.cluster.heterogeneous else None
            times = times + self.vision.group_seconds(
                self.lens, speed, starts, degs, units, unit_group
            )
        return times

    def set_time(self, members: np.ndarray, replicas: np.ndarray) -> float:
        """Time of one group on an arbitrary replica set (slow path, baselines only)."""
        return self.set_transport(members, replicas)[0]

    def set_transport(self, members: np.ndarray, replicas: np.ndarray) -> tuple[float, int]:
        """(time, u) of one group on an arbitrary replica set, its blocks in the given order."""
        nodes = {int(r) // self.replicas_per_node for r in replicas}
        vision = 0.0
        if self.vision is not None:
            vision = self.vision.set_seconds(self.lens, self.speed, members, replicas)
        reps = [int(r) for r in replicas]
        t, u = self.cost.transport_from_aggregates(
            float(self.att[members].sum()),
            float(self.lin_llm[members].sum()),
            float(self.comm[members].sum()),
            len(replicas),
            inter_node=len(nodes) > 1,
            speed=float(self.speed[replicas].min()),
            blocks_inter_node=lambda k: blocks_span_nodes(reps, k, self.replicas_per_node),
        )
        return vision + t, u

    def window_times(
        self,
        att: np.ndarray,
        lin: np.ndarray,
        comm: np.ndarray,
        starts: np.ndarray,
        degs: np.ndarray,
    ) -> np.ndarray:
        return self.window_transports(att, lin, comm, starts, degs)[0]

    def window_transports(
        self,
        att: np.ndarray,
        lin: np.ndarray,
        comm: np.ndarray,
        starts: np.ndarray,
        degs: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray]:
        """(time, u) of each window's fastest transport, vectorised over windows; u = 1 (the
        ring) wins ties. All-to-all blocks are exact here: a block spans nodes when its own
        replicas do."""
        d = degs.astype(np.float64)
        per_node = self.replicas_per_node
        inter = (starts // per_node) != ((starts + degs - 1) // per_node)
        if self.cluster.heterogeneous:
            sp = np.array([self.speed[s : s + k].min() for s, k in zip(starts, degs)])
        else:
            sp = np.ones(len(starts))
        p = self.cost_params
        bw = np.where(inter, p[INTER_NODE_BANDWIDTH], p[INTRA_NODE_BANDWIDTH])
        c = np.where(degs > 1, (d - 1) / d * comm / bw + p[BETA2] * (d - 1), 0.0)
        times = lin / d / sp + np.maximum(att / d / sp, c) + p[BETA1] / sp
        if p.size <= TRANSPORTS:
            return times, np.ones(len(starts), np.int64)
        ulysses = window_transports(
            att, lin, comm, starts.astype(np.int64), degs.astype(np.int64), sp, times, p
        )
        return times, ulysses

    def group_transports(
        self, starts: np.ndarray, degs: np.ndarray, units: np.ndarray, unit_group: np.ndarray
    ) -> np.ndarray:
        """The u each window's fastest transport uses (1: the ring), as `group_times` priced
        it (vision work does not depend on the transport: a member holds the same tokens)."""
        g = starts.size
        if not self.cost.has_transports:
            return np.ones(g, np.int64)
        att = np.bincount(unit_group, weights=self.att[units], minlength=g)
        lin = np.bincount(unit_group, weights=self.lin_llm[units], minlength=g)
        comm = np.bincount(unit_group, weights=self.comm[units], minlength=g)
        return self.window_transports(att, lin, comm, starts, degs)[1]
