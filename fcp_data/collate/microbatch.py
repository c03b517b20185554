"""MicroBatch: what one replica runs in one wave, with the plan that says how.

Every replica yields one MicroBatch per wave of a global batch, so a training loop counts
`plan.num_waves` micro-batches per optimizer step and steps after the one with
`is_last_wave`. `global_num_loss_tokens` is the loss-token count of the whole global batch
over all replicas and waves (known from the plan, no collective), so summing per-token
losses and dividing by it gives the exact per-token mean after the gradient all-reduce. A sample
that fails to read under on_error="skip" is masked out by its own group only; the others cannot
know, so it stays in that count (listed in `skipped`): all-reduce `num_loss_tokens` when exact
means matter under skipping.

A replica that has no CP group in a wave gets a *placeholder* (`is_placeholder`): one
loss-free sequence of 2 x unit tokens run at degree 1. Its loss mask is all zero, so it adds
exactly 0 to the loss and to every gradient, yet the model runs, so the replica takes part in
every collective its framework issues inside forward and backward (FSDP all-gathers and
reduce-scatters, DDP buckets, pipeline send/recv): skipping the forward on one rank deadlocks
a sharded or pipelined job. `Cluster(idle="empty")` yields zero-token micro-batches
(`is_empty`) instead, for plain loops with no collective inside the step.

A MicroBatch is plain data (tensors and the plan); turning it into a training framework's
arguments is the training side's job (megatron-core: `fcp_exec.megatron.packed_seq_params`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np
import torch

from ..errors import ConfigError
from ..planner.plan import RankPlan
from .pack import IGNORE_INDEX, PackedShard

__all__ = ["MicroBatch", "VisionInput"]


@dataclass(kw_only=True, slots=True)
class VisionInput:
    """Decoded frames of one video and where their placeholder tokens sit in this buffer.

    Placeholders form temporal groups (Qwen: 2 frames each, InternVL: 1); only the groups with
    a placeholder on this replica are decoded (a group straddling a chunk boundary is decoded
    by both owners). `groups` are the global group ids decoded, `frame_indices` their source
    frames (len(groups) * frames_per_group), `pixels` uint8 (T, H, W, 3); `token_positions` are
    local positions in the packed buffer and `token_group[k]` indexes `groups` for token k.
    """

    sample_id: int
    key: str
    groups: torch.Tensor
    frame_indices: torch.Tensor
    pixels: torch.Tensor | None
    token_positions: torch.Tensor
    token_group: torch.Tensor
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(kw_only=True, slots=True)
class MicroBatch:
    """One replica's zigzag-sharded THD micro-batch of one wave (see fcp_data.collate.pack).

    Vision payload (None on text-only loaders; set when the loader has `LoaderOptions.vision`;
    full contract in docs/vision-payload.md). T = tokens.numel(), positions are local indices
    into `tokens`:

    * `mrope_position_ids` int64 [3, T] (Qwen families; None for InternVL, which uses the 1-D
      `position_ids`): M-RoPE (temporal, height, width) ids computed on each whole sample and
      sliced to this replica; `position_ids` stays the 1-D text row (global position inside
      the sequence) that `cu_seqlens` describe. Never re-slice either by CP rank.
    * `pixel_values` float32, normalised as the family's processor does. Qwen: [P, C*2*p*p]
      rows (1176 for p = 14, 1536 for p = 16) in the processor's order: per run, per unit
      (tubelet) in time order, merged-h, merged-w, then the 2x2 window; columns channel,
      frame, patch-y, patch-x. InternVL: [N, 3, 448, 448] tiles / frames.
    * `grid_thw` int64 [R, 3]: one row per run of consecutive units of one image or video
      held here: (units, grid_h, grid_w) in patches (InternVL: (units, 32, 32)). Encode
      `pixel_values` with it as transformers' `visual(pixel_values, grid_thw)` takes it; the
      encoder returns sum(t*h*w/4) merged rows in run order.
    * `vision_runs` int64 [R, 4]: (sequence index in this micro-batch, kind 1 image / 2 video,
      first unit in the media, unit count) of each run.
    * `vision_scatter` int64 [M] with M = sum over runs of t*h*w/4: merged encoder row i goes
      to local token position `vision_scatter[i]`, or is dropped when -1 (a unit cut by a
      chunk edge is encoded whole by both owners; each keeps only its own tokens). Kept
      positions are distinct and are exactly the placeholder tokens of this replica:
      `(vision_scatter >= 0).sum()` equals the number of pad tokens in `tokens`.
    * `vision_units` / `vision_partial_units`: units encoded here / of them cut by an edge
      (the duplicated encoder work, for metrics).
    """

    tokens: torch.Tensor
    labels: torch.Tensor
    loss_mask: torch.Tensor
    position_ids: torch.Tensor
    cu_seqlens: torch.Tensor
    cu_seqlens_padded: torch.Tensor
    local_cu_seqlens: torch.Tensor
    local_cu_seqlens_padded: torch.Tensor
    max_seqlen: int
    local_max_seqlen: int
    sample_ids: tuple[int, ...]
    keys: tuple[str, ...]
    causal: tuple[bool, ...]
    rank_plan: RankPlan
    global_num_loss_tokens: int
    wave_groups: tuple[tuple[int, ...], ...] = ()
    """Replicas of every CP group of this wave (what fcp_exec.cp_context prepares)."""
    wave_ulysses: tuple[int, ...] = ()
    """The transport (u) of each of `wave_groups`, empty when every group is a ring: pass it
    with them (`cp_context(..., wave_groups=mb.wave_groups, wave_ulysses=mb.wave_ulysses)`)
    so the cache also creates the all-to-all blocks of head-parallel groups."""
    epoch: int = 0
    batch_index: int = 0
    vision: tuple[VisionInput, ...] = ()
    skipped: tuple[tuple[str, str], ...] = ()
    """(key, reason) of samples of this group that failed to read: masked out of the loss."""
    mrope_position_ids: torch.Tensor | None = None
    pixel_values: torch.Tensor | None = None
    grid_thw: torch.Tensor | None = None
    vision_runs: torch.Tensor | None = None
    vision_scatter: torch.Tensor | None = None
    vision_units: int = 0
    vision_partial_units: int = 0
    host_cu_seqlens: tuple[int, ...] = ()
    """`cu_seqlens` on the host, kept when the batch moves to a device (`to`), so that the
    attention layout is built without reading the device (`host_offsets`)."""
    host_cu_seqlens_padded: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.host_cu_seqlens and self.cu_seqlens.device.type == "cpu":
            self.host_cu_seqlens = tuple(int(x) for x in self.cu_seqlens.tolist())
        if not self.host_cu_seqlens_padded and self.cu_seqlens_padded.device.type == "cpu":
            self.host_cu_seqlens_padded = tuple(int(x) for x in self.cu_seqlens_padded.tolist())

    # ---- views -------------------------------------------------------------------------
    @property
    def is_empty(self) -> bool:
        """No token to run (`Cluster(idle="empty")`); a placeholder is not empty."""
        return self.rank_plan.is_empty and self.tokens.numel() == 0

    @property
    def is_placeholder(self) -> bool:
        """Runs like any micro-batch but holds no sample: loss and gradients exactly 0."""
        return self.rank_plan.is_empty and self.tokens.numel() > 0

    @property
    def degree(self) -> int:
        """The CP degree this micro-batch runs at: 1 for a placeholder, 0 when empty."""
        return self.rank_plan.degree or (1 if self.tokens.numel() else 0)

    @property
    def wave(self) -> int:
        return self.rank_plan.wave

    @property
    def is_last_wave(self) -> bool:
        return self.rank_plan.is_last_wave

    @property
    def digest(self) -> str:
        return self.rank_plan.digest

    @property
    def num_tokens(self) -> int:
        return int(self.tokens.numel())

    @property
    def trained_tokens(self) -> int:
        """Tokens of the sequences this micro-batch's CP group trains, counted once per group
        (on its member 0; 0 on the other d - 1 members and on placeholders), so summing it over
        every replica of a wave counts each trained token once: what tokens/s should count,
        not the samples drawn (a planner-dropped sample trains nothing)."""
        if self.is_placeholder or self.rank_plan.index_in_group != 0:
            return 0
        return int(sum(self.rank_plan.seqlens))

    @property
    def num_loss_tokens(self) -> int:
        """Loss tokens on this replica in this wave (float mask summed, exact up to 2**24)."""
        return int(self.loss_mask.sum().item())

    # ---- construction ------------------------------------------------------------------
    @classmethod
    def from_packed(
        cls,
        packed: PackedShard,
        *,
        rank_plan: RankPlan,
        sample_ids: tuple[int, ...],
        keys: tuple[str, ...],
        global_num_loss_tokens: int,
        wave_groups: tuple[tuple[int, ...], ...] = (),
        epoch: int = 0,
        batch_index: int = 0,
        vision: tuple[VisionInput, ...] = (),
        skipped: tuple[tuple[str, str], ...] = (),
        payload: dict[str, Any] | None = None,
    ) -> MicroBatch:
        """`payload`: the vision fields (fcp_data.vision.payload.build_payload), if any."""

        def t(a: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(a))

        return cls(
            tokens=t(packed.tokens),
            labels=t(packed.labels),
            loss_mask=t(packed.loss_mask),
            position_ids=t(packed.position_ids),
            cu_seqlens=t(packed.cu_seqlens),
            cu_seqlens_padded=t(packed.cu_seqlens_padded),
            local_cu_seqlens=t(packed.local_cu_seqlens),
            local_cu_seqlens_padded=t(packed.local_cu_seqlens_padded),
            max_seqlen=packed.max_seqlen,
            local_max_seqlen=packed.local_max_seqlen,
            sample_ids=sample_ids,
            keys=keys,
            causal=tuple(bool(c) for c in rank_plan.causal),
            rank_plan=rank_plan,
            global_num_loss_tokens=global_num_loss_tokens,
            wave_groups=wave_groups,
            epoch=epoch,
            batch_index=batch_index,
            vision=vision,
            skipped=skipped,
            **(payload or {}),
        )

    @classmethod
    def empty(
        cls,
        rank_plan: RankPlan,
        *,
        global_num_loss_tokens: int,
        wave_groups: tuple[tuple[int, ...], ...] = (),
        epoch: int = 0,
        batch_index: int = 0,
    ) -> MicroBatch:
        """The no-op micro-batch of a replica that sits a wave out (zero tokens, cu_seqlens [0])."""
        z = torch.zeros(0, dtype=torch.int64)
        c = torch.zeros(1, dtype=torch.int32)
        return cls(
            tokens=z,
            labels=z.clone(),
            loss_mask=torch.zeros(0, dtype=torch.float32),
            position_ids=z.clone(),
            cu_seqlens=c,
            cu_seqlens_padded=c.clone(),
            local_cu_seqlens=c.clone(),
            local_cu_seqlens_padded=c.clone(),
            max_seqlen=0,
            local_max_seqlen=0,
            sample_ids=(),
            keys=(),
            causal=(),
            rank_plan=rank_plan,
            global_num_loss_tokens=global_num_loss_tokens,
            wave_groups=wave_groups,
            epoch=epoch,
            batch_index=batch_index,
        )

    @classmethod
    def placeholder(
        cls,
        rank_plan: RankPlan,
        *,
        global_num_loss_tokens: int,
        unit: int = 1,
        pad_id: int = 0,
        wave_groups: tuple[tuple[int, ...], ...] = (),
        epoch: int = 0,
        batch_index: int = 0,
    ) -> MicroBatch:
        """The micro-batch of a replica that sits a wave out but must still run the model.

        One causal sequence of `2 * unit` pad tokens (the fewest the layout allows: 2 at
        TP = 1, 2 x TP under sequence parallel), labels `ignore_index` and loss mask 0, so the
        loss it adds is exactly 0 and so is every gradient it produces. It runs at degree 1
        (attention is local; cp_context binds this rank alone).
        """
        if not rank_plan.is_empty:
            raise ConfigError(
                f"a placeholder stands in for a wave the replica sits out; replica "
                f"{rank_plan.replica} has a degree-{rank_plan.degree} group in wave "
                f"{rank_plan.wave}"
            )
        n = 2 * int(unit)
        cu = torch.tensor([0, n], dtype=torch.int32)
        return cls(
            tokens=torch.full((n,), int(pad_id), dtype=torch.int64),
            labels=torch.full((n,), IGNORE_INDEX, dtype=torch.int64),
            loss_mask=torch.zeros(n, dtype=torch.float32),
            position_ids=torch.arange(n, dtype=torch.int64),
            cu_seqlens=cu,
            cu_seqlens_padded=cu.clone(),
            local_cu_seqlens=cu.clone(),
            local_cu_seqlens_padded=cu.clone(),
            max_seqlen=n,
            local_max_seqlen=n,
            sample_ids=(),
            keys=(),
            causal=(True,),
            rank_plan=rank_plan,
            global_num_loss_tokens=global_num_loss_tokens,
            wave_groups=wave_groups,
            epoch=epoch,
            batch_index=batch_index,
        )

    # ---- use ---------------------------------------------------------------------------
    def host_offsets(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(cu_seqlens, cu_seqlens_padded) as host tuples: the copies kept since the batch was
        on the host, else read from the device (one host sync)."""
        cu = self.host_cu_seqlens or tuple(int(x) for x in self.cu_seqlens.tolist())
        cup = self.host_cu_seqlens_padded or tuple(int(x) for x in self.cu_seqlens_padded.tolist())
        return cu, cup

    def to(self, device: torch.device | str, *, non_blocking: bool = False) -> MicroBatch:
        """A copy with every tensor on `device` (cu_seqlens included: TE reads them on device);
        the host copies of the offsets stay (`host_offsets`)."""
        changes: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, torch.Tensor):
                changes[f.name] = v.to(device, non_blocking=non_blocking)
        return replace(self, **changes)

    def pin_memory(self) -> MicroBatch:
        """Called by torch's DataLoader when pin_memory=True."""
        changes = {
            f.name: getattr(self, f.name).pin_memory()
            for f in fields(self)
            if isinstance(getattr(self, f.name), torch.Tensor)
        }
        return replace(self, **changes)
