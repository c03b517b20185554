"""The pixel payload of one replica's micro-batch on the vision path (`LoaderOptions.vision`).

The batch builder packs a replica's shard first (where each token sits depends only on the
plan's lengths), then asks each held sequence for its M-RoPE slice and the pixels of the
encoder units it holds. A unit that fails to decode masks its sample here, never the group's
shapes: only this replica's pixels depend on it. A wave the replica sits out still carries an
empty payload, so the model's own forward takes it like any text-only micro-batch.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from ..collate import IGNORE_INDEX, MicroBatch, PackedShard
from ..vision.payload import PayloadParts, build_payload
from ..vision.sample import VisionEncoder
from .encode import EncodedSample
from .time_limit import SampleTimeLimit

__all__ = ["idle_payload", "share_payload"]

# (key, index position, planned length, the error) -> (padding, reason), or raises
OnBad = Callable[[str, int, int, Exception], tuple[EncodedSample, str]]


def _build(parts: PayloadParts, vision: VisionEncoder) -> dict[str, Any]:
    spec = vision.spec
    return build_payload(parts, spec, row_width=3 * spec.temporal * spec.patch**2)


def share_payload(
    vision: VisionEncoder,
    encs: list[EncodedSample],
    packed: PackedShard,
    pos: tuple[int, ...],
    keys: tuple[str, ...],
    bad: list[tuple[str, str]],
    *,
    time_limit: SampleTimeLimit,
    on_bad: OnBad,
    pad_id: int,
) -> dict[str, Any]:
    """Pixel payload and M-RoPE slice of this replica's share of one wave.

    A unit that fails to decode raises through `on_bad` (on_error="raise") or masks its
    sample in `packed` (tokens -> pad, out of the loss, no runs) and is listed in `bad`.
    """
    out = PayloadParts()
    lo, hi = packed.local_cu_seqlens_padded, packed.cu_seqlens_padded
    for k, e in enumerate(encs):
        kept = (len(out.pixel_values), len(out.grid_thw), len(out.runs), len(out.scatter))
        if any(k_ == keys[k] for k_, _ in bad):
            continue  # already masked (unreadable): no pixels
        try:
            time_limit(
                f"decoding the pixels of sample {keys[k]!r}",
                partial(
                    vision.payload,
                    out,
                    k,
                    e,
                    held=packed.global_positions[k],
                    offset=int(lo[k]),
                    padded_len=int(hi[k + 1] - hi[k]),
                ),
            )
        except Exception as err:  # undecodable, short or hung: this sample's fault
            _, reason = on_bad(keys[k], pos[k], len(e.tokens), err)
            del out.pixel_values[kept[0] :], out.grid_thw[kept[1] :]
            del out.runs[kept[2] :], out.scatter[kept[3] :]
            a, b = int(lo[k]), int(lo[k + 1])
            packed.tokens[a:b] = pad_id
            packed.labels[a:b] = IGNORE_INDEX
            packed.loss_mask[a:b] = 0.0
            bad.append((keys[k], reason))
    return _build(out, vision)


def idle_payload(vision: VisionEncoder, mb: MicroBatch) -> None:
    """Give placeholder `mb` an empty pixel payload and M-RoPE ids (its positions on all 3
    axes), so the model's forward takes it like any text-only micro-batch."""
    payload = _build(PayloadParts(), vision)
    if payload["mrope_position_ids"] is not None:
        payload["mrope_position_ids"] = mb.position_ids.expand(3, -1).clone()
    for name, value in payload.items():
        setattr(mb, name, value)
