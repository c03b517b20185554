"""Encode what you hold: run the vision tower on this replica's tubelets and scatter the result.

A micro-batch's vision payload (docs/vision-payload.md) holds the pixel rows of exactly the
encoder units (Qwen tubelets) whose pad tokens sit in this replica's zigzag chunks, one
`grid_thw` row per run of consecutive units, and `vision_scatter`: merged encoder row i goes to
local token position `vision_scatter[i]`, or is dropped (-1). So a replica of a degree-d group
encodes about 1/d of each video plus at most 2 edge tubelets per sequence, and no collective
moves embeddings: a unit cut by a chunk edge is encoded whole by each owner and each keeps only
its own tokens, so every token is written once and the encoder's weight gradients are exact
after the normal all-replica gradient sum (`fcp_exec.grads`).

Bad input raises `VisionScatterError` naming the sample key: embeddings whose length is not
the micro-batch's, pixel rows that do not match the grid, a scatter map whose length differs
from the encoder output, that holds a value below -1, repeats a position, points past the
tokens, or targets a token that is not a vision pad (the rows of one kind must all land on one
token id, and every token of that id must be filled: a map shifted by one or aimed at text would
otherwise overwrite a text embedding silently), a tower that raises or returns the wrong type,
shape or hidden size. A member that finds it cannot stop alone: its peers would wait in ring
attention, so with `group` given (the CP group `cp_context` bound, d > 1) every one of these
checks, the tower call included, ends in one all-gather of one int64 over that group and all
members raise the same error, naming the failing member's rank and key. A replica with no
vision tokens calls no tower and, at d = 1, no collective at all.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from fcp_data.errors import ExecError

__all__ = ["VisionScatterError", "encode_and_scatter", "merged_rows", "run_keys"]

MERGE_UNIT = 4  # Qwen's 2x2 spatial merge: 4 patch rows per LLM token


class VisionScatterError(ExecError):
    """The payload, the tower output or the embeddings disagree; raised on every group member."""


@dataclass(frozen=True, slots=True)
class _Check:
    ok: bool
    message: str = ""


def merged_rows(grid_thw: torch.Tensor, merge_unit: int = MERGE_UNIT) -> torch.Tensor:
    """Merged encoder rows per run: t * h * w / merge_unit (what the tower returns per item)."""
    g = grid_thw.to(torch.int64)
    return g[:, 0] * g[:, 1] * g[:, 2] // merge_unit


def run_keys(mb: Any) -> list[str]:
    """The sample key of every run of `mb` (for error messages)."""
    runs = mb.vision_runs
    if runs is None or runs.numel() == 0:
        return []
    return [str(mb.keys[int(s)]) if int(s) < len(mb.keys) else f"#{int(s)}" for s in runs[:, 0]]


def _keys_text(keys: list[str]) -> str:
    uniq = list(dict.fromkeys(keys))
    return ", ".join(uniq[:4]) + (", ..." if len(uniq) > 4 else "") if uniq else "-"


def _safe_keys(mb: Any) -> str:
    """The run keys for an error message, even from a payload too malformed to index."""
    try:
        return _keys_text(run_keys(mb))
    except (RuntimeError, IndexError, TypeError, ValueError, AttributeError):
        return _keys_text([str(k) for k in getattr(mb, "keys", ())])


def _check_payload(mb: Any, merge_unit: int, pad_ids: frozenset[int] | None = None) -> _Check:
    px, grid, scatter = mb.pixel_values, mb.grid_thw, mb.vision_scatter
    if grid is None or px is None or scatter is None:
        return _Check(False, "the micro-batch has no vision payload (LoaderOptions(vision=...))")
    keys = run_keys(mb)
    patches = grid.to(torch.int64).prod(dim=1)
    want_rows = int(patches.sum())
    if px.shape[0] != want_rows:
        # name the run where the cumulative rows first exceed what pixel_values holds
        cum = patches.cumsum(0)
        bad = int((cum > px.shape[0]).nonzero()[0]) if (cum > px.shape[0]).any() else -1
        key = keys[bad] if 0 <= bad < len(keys) else _keys_text(keys)
        return _Check(
            False,
            f"sample {key}: pixel_values has {px.shape[0]} rows but grid_thw "
            f"{grid.tolist()} needs sum(t*h*w) = {want_rows}; the payload was built for another "
            "grid (rebuild the micro-batch with the loader's vision path)",
        )
    merged = merged_rows(grid, merge_unit)
    if scatter.numel() != int(merged.sum()):
        return _Check(
            False,
            f"sample {_keys_text(keys)}: vision_scatter has {scatter.numel()} entries but grid_thw "
            f"gives sum(t*h*w/{merge_unit}) = {int(merged.sum())} merged rows; the scatter map "
            "and the grid must come from the same payload",
        )
    if scatter.numel() and int(scatter.min()) < -1:
        at = int((scatter < -1).nonzero()[0])
        return _Check(
            False,
            f"sample {_run_key(keys, merged, at)}: vision_scatter[{at}] = {int(scatter[at])}; "
            "entries are a local token position or -1 (dropped)",
        )
    kept = scatter[scatter >= 0]
    if kept.numel() and (int(kept.max()) >= mb.tokens.numel()):
        return _Check(
            False,
            f"sample {_keys_text(keys)}: vision_scatter points at local position "
            f"{int(kept.max())} but this replica holds {mb.tokens.numel()} tokens",
        )
    uniq, counts = torch.unique(kept, return_counts=True)
    if bool((counts > 1).any()):
        pos = int(uniq[counts > 1][0])
        at = int((scatter == pos).nonzero()[1])
        return _Check(
            False,
            f"sample {_run_key(keys, merged, at)}: vision_scatter writes local position {pos} "
            f"{int(counts[counts > 1][0])} times; each vision token takes one encoder row",
        )
    if pad_ids is not None and kept.numel():
        tokens = mb.tokens.reshape(-1)
        wrong = ~torch.isin(tokens[kept], torch.tensor(sorted(pad_ids), dtype=tokens.dtype))
        if bool(wrong.any()):
            pos = int(kept[wrong][0])
            at = int((scatter == pos).nonzero()[0])
            return _Check(
                False,
                f"sample {_run_key(keys, merged, at)}: vision_scatter sends encoder row {at} to "
                f"local position {pos}, token id {int(tokens[pos])}, which is not one of the "
                f"model's vision pad ids {sorted(pad_ids)}: it would overwrite a text embedding",
            )
    return _check_targets(mb, scatter, merged, keys)


def _run_key(keys: list[str], merged: torch.Tensor, row: int) -> str:
    """The key of the run that merged encoder row `row` belongs to."""
    k = int(torch.searchsorted(merged.cumsum(0), torch.tensor(row), right=True))
    return keys[k] if k < len(keys) else _keys_text(keys)


def _check_targets(mb: Any, scatter: torch.Tensor, merged: torch.Tensor, keys: list[str]) -> _Check:
    """Rows of one run kind land on one token id (its pad), and every token of it is filled.

    The payload puts exactly the pad tokens (`<|video_pad|>`, `<|image_pad|>`, `<IMG_CONTEXT>`)
    under the map; a map aimed at text, at a neighbour (shifted by one) or missing a pad is
    otherwise accepted by index_copy and trains on a wrong embedding.
    """
    runs = mb.vision_runs
    if runs is None or runs.shape[0] != merged.numel():
        return _Check(True)  # no per-run kinds to check against (hand-built micro-batch)
    tokens = mb.tokens.reshape(-1)
    kind_of_row = torch.repeat_interleave(runs[:, 1].to(torch.int64), merged)
    pad_ids: dict[int, int] = {}
    for kind in sorted(set(int(k) for k in runs[:, 1].tolist())):
        rows = (kind_of_row == kind) & (scatter >= 0)
        if not bool(rows.any()):
            continue
        ids, n = torch.unique(tokens[scatter[rows]], return_counts=True)
        if ids.numel() > 1:  # the pad is the id most present among the tokens (ties: targets)
            score = [(int((tokens == i).sum()), int(c)) for i, c in zip(ids, n)]
            pad = int(ids[max(range(len(score)), key=score.__getitem__)])
            stray = int(scatter[rows][tokens[scatter[rows]] != pad][0])
            row = int((scatter == stray).nonzero()[0])
            return _Check(
                False,
                f"sample {_run_key(keys, merged, row)}: vision_scatter sends encoder row {row} "
                f"to local position {stray}, token id {int(tokens[stray])}, but the other rows "
                f"of its kind fill token id {pad}: it would overwrite a non-vision embedding",
            )
        pad_ids[int(ids[0])] = pad_ids.get(int(ids[0]), 0) + int(rows.sum())
    for pad, filled in pad_ids.items():
        present = int((tokens == pad).sum())
        if present != filled:
            return _Check(
                False,
                f"sample {_keys_text(keys)}: this replica holds {present} tokens of vision id "
                f"{pad} but vision_scatter fills {filled}: the map and the tokens come from "
                "different payloads",
            )
    return _Check(True)


def _check_output(mb: Any, out: torch.Tensor, hidden: int, merge_unit: int) -> _Check:
    keys = run_keys(mb)
    m = mb.vision_scatter.numel()
    if out.dim() != 2 or out.shape[0] != m:
        return _Check(
            False,
            f"sample {_keys_text(keys)}: the vision tower returned shape {tuple(out.shape)} "
            f"for grid_thw {mb.grid_thw.tolist()}; the scatter map needs [{m}, {hidden}] "
            f"(sum(t*h*w/{merge_unit}) merged rows). Pass a tower that returns the merged "
            "embeddings (e.g. Qwen2.5-VL's model.visual)",
        )
    if out.shape[1] != hidden:
        return _Check(
            False,
            f"sample {_keys_text(keys)}: the vision tower returned hidden size {out.shape[1]} "
            f"but the decoder's embeddings have {hidden}; the merger's out_hidden_size must "
            "equal the language model's hidden_size",
        )
    return _Check(True)


def _agree(
    check: _Check, group: dist.ProcessGroup | None, cause: BaseException | None = None
) -> None:
    """Raise on every member of `group` if any member's check failed (one int64 all-gather);
    `cause` (this member's own exception, e.g. from the tower) is chained on this member."""
    if group is None or not dist.is_initialized() or dist.get_world_size(group) <= 1:
        if not check.ok:
            raise VisionScatterError(check.message) from cause
        return
    from fcp_exec.verify import _device  # the backend's tensor device (gloo: CPU)

    size = dist.get_world_size(group)
    flag = torch.tensor([0 if check.ok else 1], dtype=torch.int64, device=_device(group))
    flags = [torch.empty_like(flag) for _ in range(size)]
    dist.all_gather(flags, flag, group=group)
    failed = [i for i, f in enumerate(flags) if int(f)]
    if not failed:
        return
    # every member now knows someone failed: gather the messages (an object all-gather, rare)
    messages: list[Any] = [None] * size
    dist.all_gather_object(messages, check.message, group=group)
    ranks = dist.get_process_group_ranks(group)
    detail = "; ".join(f"rank {ranks[i]}: {messages[i]}" for i in failed)
    raise VisionScatterError(
        f"vision payload check failed on the CP group {ranks}: {detail}"
    ) from cause


def _pooled(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    pooled = getattr(out, "pooler_output", None)  # transformers 5.x Qwen2.5-VL visual
    if isinstance(pooled, torch.Tensor):
        return pooled
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    raise ExecError(
        f"the vision tower returned {type(out).__name__}; it must return the merged embeddings "
        "as a tensor [M, hidden] or an output with `pooler_output`"
    )


def encode_and_scatter(
    tower: Callable[..., Any],
    mb: Any,
    embeds: torch.Tensor,
    *,
    group: dist.ProcessGroup | None = None,
    merge_unit: int = MERGE_UNIT,
    pad_ids: Collection[int] | None = None,
) -> torch.Tensor:
    """`embeds` with this replica's vision tokens replaced by the tower's output for them.

    tower: called as `tower(pixel_values, grid_thw=grid_thw)`, returning merged embeddings
    [M, hidden] (a tensor or an output with `pooler_output`); mb: the MicroBatch (pixel_values,
    grid_thw, vision_scatter, keys); embeds: [T, hidden] or [1, T, hidden] text embeddings of
    mb.tokens; group: the CP group (cp_context's binding.group) so a bad payload raises on
    every member instead of hanging its peers; None at d = 1 or to skip the check; pad_ids:
    the model's vision pad token ids (Qwen: `config.image_token_id`, `config.video_token_id`;
    InternVL: the `<IMG_CONTEXT>` id). With them every kept encoder row must land on one of
    them; without them the pad is inferred from the map itself (the id most of a kind's rows
    land on), which cannot tell a kind whose only row lands on a text token of a unique id.
    Returns a new tensor (autograd flows to both embeds and the tower); not in place.
    """
    flat = embeds[0] if embeds.dim() == 3 else embeds
    # every check below can fail on one member only: each ends in the group's agreement
    check = _Check(True)
    if flat.dim() != 2 or flat.shape[0] != mb.tokens.numel():
        check = _Check(
            False,
            f"sample {_keys_text(run_keys(mb))}: embeds has shape {tuple(embeds.shape)} but the "
            f"micro-batch holds {mb.tokens.numel()} tokens; pass [T, hidden] or [1, T, hidden]",
        )
    cause: BaseException | None = None
    if check.ok:
        try:
            check = _check_payload(
                mb, merge_unit, None if pad_ids is None else frozenset(int(i) for i in pad_ids)
            )
        except (RuntimeError, IndexError, TypeError, ValueError, AttributeError) as exc:
            check = _Check(False, f"sample {_safe_keys(mb)}: malformed vision payload ({exc!r})")
            cause = exc
    has_vision = check.ok and mb.vision_scatter.numel() > 0
    out: torch.Tensor | None = None
    if has_vision:
        try:
            px = mb.pixel_values.to(device=flat.device)
            out = _pooled(tower(px, grid_thw=mb.grid_thw.to(flat.device)))
        except Exception as exc:  # any tower failure (OOM too) must reach the agreement
            check, cause, out = (
                _Check(
                    False,
                    f"sample {_keys_text(run_keys(mb))}: the vision tower raised "
                    f"{type(exc).__name__}: {exc}",
                ),
                exc,
                None,
            )
        else:
            check = _check_output(mb, out, flat.shape[1], merge_unit)
    _agree(check, group, cause)
    if out is None:
        return embeds
    scatter = mb.vision_scatter.to(flat.device)
    keep = scatter >= 0
    merged = flat.index_copy(0, scatter[keep], out[keep].to(flat.dtype))
    return merged[None] if embeds.dim() == 3 else merged
