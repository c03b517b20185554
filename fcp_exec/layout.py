"""The THD context-parallel layout and the zigzag block schedule, as pure functions.

Layout (Transformer Engine's THD CP layout, defined once in `fcp_data.layout` and produced by
`fcp_data.collate`): every sequence of a pack is padded to a multiple of 2d, cut into 2d equal
chunks, and ring member i holds chunks i and 2d-1-i back to back. Causal work is then
balanced: member 0 holds the cheapest and the dearest chunk, member d-1 the two middle ones,
and every member's chunk indices sum to 2d-1, so each does the same 1/d of the causal triangle.

Two facts make the schedule cheap and exact without any attention mask:
- the local order of a shard is monotone in global position (chunk i < chunk 2d-1-i), so the
  causal mask of the diagonal block is the plain lower triangle of the local shard;
- padding is a suffix of each sequence, so the real tokens of any set of chunks taken in order
  are a prefix. Every block is therefore "real prefix of Q" x "real prefix of KV", computed
  with no mask (off-diagonal) or `is_causal` (diagonal); padding rows are never computed and
  get zero output and zero gradients.

Per ring step, with src the member whose KV is held (for causal sequences):
- src == me: diagonal, causal;
- src < me: all of my Q against src's first KV half (chunk src precedes both my chunks);
- src > me: my second Q half against all of src's KV (both src chunks precede chunk 2d-1-me).
Full-attention sequences take every real query against every real key at every step.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from fcp_data import layout as contract
from fcp_data.errors import ConfigError
from fcp_exec.schedule import RingSchedule, build_schedule

__all__ = ["Block", "ShardLayout", "local_token_index", "step_blocks"]


@dataclass(frozen=True, slots=True)
class Block:
    """One kernel call: local rows [q_start, q_start+q_len) vs KV rows [k_start, k_start+k_len)."""

    q_start: int
    q_len: int
    k_start: int
    k_len: int
    causal: bool


def _as_list(name: str, t: torch.Tensor | Sequence[int]) -> list[int]:
    if isinstance(t, torch.Tensor):
        if t.dim() != 1:
            raise ConfigError(
                f"{name} must be 1-D (num_sequences + 1,), got shape {tuple(t.shape)}"
            )
        return [int(x) for x in t.tolist()]
    return [int(x) for x in t]


@dataclass(frozen=True, slots=True)
class ShardLayout:
    """Where each sequence of a pack sits in one member's local shard.

    Built once per micro-batch from host data (`hf_attention_kwargs`, `packed_seq_params` and
    the loader's `MicroBatch` keep the offsets on the host; building from device tensors reads
    them back, one host sync) and validated so that a wrong pack fails here with the offending
    value, not as a hang or a silent wrong gradient inside the ring. Every layer then passes
    the same object: the device-side schedule of each member (`schedule`) and other per-batch
    tensors (`cached`) are built on first use and reused, forward and backward, so no layer
    reads from or copies to the device for its layout.
    """

    degree: int
    seqlens: tuple[int, ...]  # real lengths of the unsharded sequences
    padded: tuple[int, ...]  # padded lengths (multiples of 2 * degree)
    causal: tuple[bool, ...]
    local_offsets: tuple[int, ...]  # start of each sequence in the local shard
    num_local_tokens: int
    _cache: dict[Any, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def build(
        cls,
        cu_seqlens: torch.Tensor | Sequence[int],
        cu_seqlens_padded: torch.Tensor | Sequence[int],
        degree: int,
        causal: bool | Sequence[bool] | torch.Tensor = True,
    ) -> ShardLayout:
        if degree < 1:
            raise ConfigError(f"degree={degree}: a ring needs at least one member")
        cu = _as_list("cu_seqlens", cu_seqlens)
        cup = _as_list("cu_seqlens_padded", cu_seqlens_padded)
        if len(cu) != len(cup) or len(cu) < 2:
            raise ConfigError(
                f"cu_seqlens has {len(cu)} entries and cu_seqlens_padded {len(cup)}: both must "
                "be num_sequences + 1 >= 2 cumulative offsets of the same sequences"
            )
        if cu[0] != 0 or cup[0] != 0:
            raise ConfigError(f"cu_seqlens must start at 0, got {cu[0]} and {cup[0]} (padded)")
        lens = [b - a for a, b in itertools.pairwise(cu)]
        pads = [b - a for a, b in itertools.pairwise(cup)]
        chunks = contract.num_chunks(degree)
        for j, (n, p) in enumerate(zip(lens, pads)):
            if n < 0 or p < n:
                raise ConfigError(
                    f"sequence {j}: real length {n} and padded length {p}; cu_seqlens must be "
                    "non-decreasing and each padded length >= the real length"
                )
            if p % chunks:
                raise ConfigError(
                    f"sequence {j}: padded length {p} is not a multiple of 2*degree={chunks}; "
                    f"pad each sequence to a multiple of {chunks} (TE THD CP layout)"
                )
        if isinstance(causal, torch.Tensor):
            causal = [bool(c) for c in causal.tolist()]
        flags = (bool(causal),) * len(lens) if isinstance(causal, bool) else tuple(causal)
        if len(flags) != len(lens):
            raise ConfigError(
                f"causal has {len(flags)} flags for {len(lens)} sequences: pass a bool or one "
                "flag per sequence"
            )
        offsets = tuple(c // degree for c in cup[:-1])
        return cls(
            degree=degree,
            seqlens=tuple(lens),
            padded=tuple(pads),
            causal=tuple(bool(f) for f in flags),
            local_offsets=offsets,
            num_local_tokens=cup[-1] // degree,
        )

    @classmethod
    def of(cls, mb: Any) -> ShardLayout:
        """The layout of a loader `MicroBatch` from its host offsets (no device read, also
        after `mb.to(device)`): what `hf_attention_kwargs` and `packed_seq_params` carry."""
        cu, cup = mb.host_offsets()
        return cls.build(cu, cup, max(int(mb.degree), 1), tuple(bool(c) for c in mb.causal))

    def cached(self, key: Any, build: Callable[[], Any]) -> Any:
        """`build()` once per key for this micro-batch (device tensors derived from it)."""
        if key not in self._cache:
            self._cache[key] = build()
        return self._cache[key]

    def schedule(self, index: int, device: torch.device | str) -> RingSchedule:
        """The `fcp_exec.schedule.RingSchedule` of member `index` on `device` (built once)."""
        device = torch.device(device)
        return self.cached(
            ("ring", index, device),
            lambda: build_schedule(
                self.seqlens, self.padded, self.causal, self.degree, index, device
            ),
        )

    def with_degree(self, degree: int) -> ShardLayout:
        """The same sequences in the layout of another degree (the r-ring of a hybrid u x r),
        cached on this layout."""
        return self.cached(
            ("degree", degree),
            lambda: ShardLayout.build(
                _cumsum(self.seqlens), _cumsum(self.padded), degree, self.causal
            ),
        )

    def real_in_chunk(self, seq: int, chunk: int) -> int:
        """Real (non-padding) tokens of chunk `chunk` (of 2d) of sequence `seq`."""
        c = self.padded[seq] // contract.num_chunks(self.degree)
        return max(0, min(c, self.seqlens[seq] - chunk * c))


def _cumsum(lengths: Sequence[int]) -> list[int]:
    return [0, *itertools.accumulate(lengths)]


def step_blocks(layout: ShardLayout, me: int, src: int) -> list[Block]:
    """The unmasked blocks member `me` computes against member `src`'s KV (see module doc)."""
    d = layout.degree
    my_chunks, src_chunks = contract.chunk_ids(d, me), contract.chunk_ids(d, src)
    out: list[Block] = []
    for j, off in enumerate(layout.local_offsets):
        c = layout.padded[j] // contract.num_chunks(d)
        q_first, q_second = (layout.real_in_chunk(j, chunk) for chunk in my_chunks)
        k_first, k_second = (layout.real_in_chunk(j, chunk) for chunk in src_chunks)
        if not layout.causal[j]:
            blk = Block(off, q_first + q_second, off, k_first + k_second, False)
        elif src == me:
            blk = Block(off, q_first + q_second, off, q_first + q_second, True)
        elif src < me:
            blk = Block(off, q_first + q_second, off, k_first, False)
        else:
            blk = Block(off + c, q_second, off, k_first + k_second, False)
        if blk.q_len > 0 and blk.k_len > 0:
            out.append(blk)
    return out


def local_token_index(
    cu_seqlens_padded: torch.Tensor | Sequence[int], degree: int, index: int
) -> torch.Tensor:
    """Indices into the padded unsharded pack of the tokens member `index` holds, in order.

    `packed[local_token_index(cu_p, d, i)]` is member i's shard; tests and collators use it to
    shard tokens, labels and position ids the same way ring attention expects.
    """
    if not 0 <= index < degree:
        raise ConfigError(f"index={index} is outside [0, degree={degree})")
    cup = _as_list("cu_seqlens_padded", cu_seqlens_padded)
    parts: list[torch.Tensor] = []
    for a, b in itertools.pairwise(cup):
        c = (b - a) // contract.num_chunks(degree)
        for chunk in contract.chunk_ids(degree, index):
            parts.append(torch.arange(a + chunk * c, a + (chunk + 1) * c))
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)
