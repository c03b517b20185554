"""`plan_global_batch`: the planner's one entry point.

Strategies:
- "fcp" (default): several candidates, the best predicted one kept — the paper's waves with BFD
  + 2D-DP, mixed-degree lanes (dual approximation), a prologue of the widest sequences followed
  by lanes, moldable list scheduling, the best static-balanced and static plans, the pow2
  strategy's candidates (`_pow2_candidates`) and megatron-dynamic's plans at every knob of its
  grid, so fcp is never worse under its own model than any of those strategies' plans: static,
  static-balanced, pow2, megatron-dynamic and megatron-dynamic-tuned.
- "paper", "lanes", "moldable": one candidate family alone (for study).
- "static": Megatron-LM's static CP; "static-balanced": one fixed degree, sequences dealt by
  predicted time; "pow2": the fcp planner restricted to power-of-two degrees (DeepSpeed-Ulysses /
  FlexSP space); "megatron-hybrid": megatron-core's BalancedCPScheduler (needs megatron-core);
  "megatron-dynamic": Megatron-LM dev's DefaultDynamicCPScheduler (`megatron_dynamic`) with its
  knob max_seqlen_per_dp_cp_rank at the memory capacity; "megatron-dynamic-tuned": the same at
  each knob of `megatron_dynamic.KNOB_GRID` × capacity, the best kept per batch.

Vision work (`vision=`, per-sample encoder units and where their tokens sit) makes every
candidate and baseline count each replica's decode and encoder time for the units it holds,
edge duplicates included (`cost.vision`). Candidates balance the vision replica-seconds with the
rest; scoring is exact. "fcp" and "pow2" also score the vision-blind candidates under the
vision-aware model, so counting vision never yields a worse plan under that model. A batch with
no vision work (text only) plans exactly as without the argument.

Idle replicas and barriers (`Cluster.idle`, `Cluster.sync_waves`) are priced in every candidate's
score, baselines included, so the winner accounts for them. Over the 189 batches of
bench/idle_policy.py (Qwen3-8B on H200) a placeholder costs 0.015% of a step on average and at
most 0.24%; a barrier per wave costs 6.0% on average, up to 53%. Under sync_waves, lane
candidates are also tried with each lane's queue longest first (`fill.align_waves`), and under
idle="fill" the three best candidates are also tried with their idle slots filled
(`fill.fill_idle`: up to 7.0% faster with barriers, < 0.04% without); each only when no slower.
"idle='empty'" plans exactly as the planner did before idle pricing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from ..errors import ArgumentTypeError, ConfigError, PlanningError
from .assemble import to_plan
from .bounds import lower_bound
from .cost.cluster import Cluster
from .cost.model import CostModel
from .cost.problem import Problem
from .cost.vision import VisionLoad
from .cost.vision_work import VisionWork
from .plan import Plan, Wave
from .strategies.families import FAMILIES, LARGE, core_family, moldable_family
from .strategies.fill import align_waves, fill_idle
from .strategies.lanes import static_balanced
from .strategies.schedule import Schedule

__all__ = ["STRATEGIES", "check_strategy", "plan_global_batch"]

STRATEGIES = tuple(FAMILIES)  # the table's names, in its order
ON_TOO_LONG = ("raise", "drop")
# Strategies whose candidates `Cluster(idle="fill")` fills; the baselines (static,
# static-balanced, megatron-hybrid, megatron-dynamic(-tuned)) keep the plans they are defined
# by, priced the same way (inside fcp's family they are filled like every candidate).
FILLED = ("fcp", "paper", "lanes", "moldable", "pow2")


def check_strategy(strategy: object) -> str:
    """`strategy` if it names a planner strategy, else ConfigError listing the allowed ones."""
    if not isinstance(strategy, str) or strategy not in STRATEGIES:
        raise ConfigError(f"strategy={strategy!r} is not one of {STRATEGIES}")
    return strategy


def _vision_load(vision: VisionWork | None, cost: CostModel, lens: np.ndarray) -> VisionLoad | None:
    """The batch's priced vision work, or None when it has none (text-only batches)."""
    if vision is None:
        return None
    if not isinstance(vision, VisionWork):
        raise ArgumentTypeError(f"vision must be a fcp_data.planner.VisionWork, got {type(vision)}")
    if cost.vision is None:
        if np.any(vision.units > 0):
            raise ConfigError(
                f"vision work was given but the cost model {cost.name!r} has no vision terms: "
                "use CostModel.from_model with a vision-language model (e.g. 'qwen3-vl-2b'), "
                "attach a VisionCost (dataclasses.replace(cost, vision=...)) or profile one "
                "(`fcp profile --vision`)"
            )
        return None
    load = VisionLoad.build(vision, cost.vision, lens)
    return load if load.active else None


def _blind_candidates(
    blind: Problem, prob: Problem, keep: np.ndarray, strategy: str
) -> list[Schedule]:
    """The candidates planned without vision work, scored with it (named "vision-blind:...")."""
    units = blind.order[keep[blind.order]]
    lower = lower_bound(blind, np.flatnonzero(keep))
    family = core_family if strategy in ("fcp", "pow2") else FAMILIES[strategy]
    out = []
    for sch in family(blind, lower, units):
        if sch is not None:
            sch.name = f"vision-blind:{sch.name}"
            out.append(sch.score(prob))
    return out


def _with_aligned(prob: Problem, found: list[Schedule]) -> list[Schedule]:
    """Under sync_waves, each lane candidate preceded by its lanes' queues sorted longest first
    (`fill.align_waves`), when that is predicted no slower."""
    out: list[Schedule] = []
    for sch in found:
        aligned = align_waves(prob, sch)
        if aligned is not None and aligned.makespan <= sch.makespan:
            out.append(aligned)
        out.append(sch)
    return out


FILL_BEST = 3  # candidates filled under idle="fill": the best ones by predicted time


def _with_filled(prob: Problem, found: list[Schedule]) -> list[Schedule]:
    """The `FILL_BEST` best candidates each preceded by its filled version (`fill.fill_idle`)
    when that is predicted no slower, so a tie goes to the plan with fewer idle replicas.

    Filling costs about 1 ms per candidate at 512 sequences on 64 replicas. Filling every
    candidate instead found a faster plan in 5 of the 378 batches of bench/idle_policy.py (with
    and without barriers), by at most 2.4%, for 1.6x the planning time.
    """
    best = set(sorted(range(len(found)), key=lambda i: found[i].makespan)[:FILL_BEST])
    out: list[Schedule] = []
    for i, sch in enumerate(found):
        filled = fill_idle(prob, sch) if i in best else None
        if filled is not None and filled.makespan <= sch.makespan:
            out.append(filled)
        out.append(sch)
    return out


def _candidates(
    strategy: str, prob: Problem, blind: Problem | None, keep: np.ndarray, seed: int
) -> tuple[list[Schedule], float]:
    """Every scored candidate of `strategy` for the sequences `keep`, and the lower bound.

    `blind`: the same problem without vision work (its candidates are scored with it).
    """
    units = prob.order[keep[prob.order]]
    lower = lower_bound(prob, np.flatnonzero(keep))
    found = [s for s in FAMILIES[strategy](prob, lower, units) if s is not None]
    if blind is not None and strategy in ("fcp", "pow2"):
        found += _blind_candidates(blind, prob, keep, strategy)
    if strategy == "fcp":
        found += _pow2_candidates(prob, blind, keep, seed)
        found += _ring_candidates(prob, blind, keep, seed)
    if prob.sync and strategy in FILLED:
        found = _with_aligned(prob, found)
    if prob.cluster.idle == "fill" and strategy in FILLED:
        found = _with_filled(prob, found)
    if strategy == "fcp":  # pow2's aligned / filled candidates may be derived again here
        found = _distinct(found)
    return found, lower


def _distinct(found: list[Schedule]) -> list[Schedule]:
    """One candidate per name, the fastest, in order of first appearance."""
    by_name: dict[str, Schedule] = {}
    for sch in found:
        kept = by_name.get(sch.name)
        if kept is None or sch.makespan < kept.makespan:
            by_name[sch.name] = sch
    return list(by_name.values())


POW2_FULL = 4096  # sequences × replicas up to which fcp runs every pow2 candidate


def _pow2_candidates(
    prob: Problem, blind: Problem | None, keep: np.ndarray, seed: int
) -> list[Schedule]:
    """The "pow2" strategy's candidates, planned on a power-of-two Problem and re-scored on
    `prob` (named "pow2:..."). A Schedule depends only on the lengths, cluster and cost model,
    which both Problems share, so its score is the same on either. None when pow2 would drop
    other sequences than fcp (N not a power of two: a sequence only the full group holds).

    Up to `POW2_FULL` sequences × replicas (e.g. 64 sequences on 64 replicas), every candidate
    pow2 scores, its aligned and filled ones included: fcp is then never worse than pow2.
    Above, only the ones that ever beat fcp's own on bench/planner_quality.py's 384 cells:
    moldable list scheduling (longest first +4, widest first +0 / +1; 118 cells, up to 3.1%)
    and static-balanced (1 cell, 0.45%); with them fcp is no slower than pow2 in every cell.
    The full family would double fcp's planning time (+4-6 ms at 512 sequences on 64 replicas);
    these cost about 1 ms there, and nothing above `LARGE`, where fcp drops its own moldable
    candidates too.
    """
    p2 = Problem.build(
        prob.lens,
        prob.cluster,
        prob.cost,
        causal=prob.causal,
        pow2=True,
        seed=seed,
        vision=prob.vision,
    )
    if not np.array_equal(p2.dmin > 0, keep):
        return []
    units = p2.order[keep[p2.order]]
    size = units.size * prob.num_replicas
    if size <= POW2_FULL:
        b2 = None
        if blind is not None:
            b2 = Problem.build(
                blind.lens, blind.cluster, blind.cost, causal=blind.causal, pow2=True, seed=seed
            )
        found = _candidates("pow2", p2, b2, keep, seed)[0]
    elif size <= LARGE:
        found = [
            s for s in (*moldable_family(p2, units), static_balanced(p2, units)) if s is not None
        ]
    else:
        return []
    out = []
    for sch in found:
        sch.name = f"pow2:{sch.name}"
        out.append(sch.score(prob))
    return out


def _ring_only(cost: CostModel) -> CostModel:
    return replace(cost, head_parallel=(), a2a_bytes=(), ring_shares=())


def _ring_candidates(
    prob: Problem, blind: Problem | None, keep: np.ndarray, seed: int
) -> list[Schedule]:
    """With head-parallel transports priced, every candidate of the ring-only planner too,
    re-scored with them (named "ring:..."): a group's time under transports is never above its
    ring time and the critical path is monotone in group times, so fcp with transports is never
    slower than fcp without. It doubles planning time, for cost models that opted in
    (`CostModel.head_parallel`); none otherwise."""
    if not prob.cost.has_transports:
        return []
    ring_cost = _ring_only(prob.cost)
    rp = Problem.build(
        prob.lens, prob.cluster, ring_cost, causal=prob.causal, seed=seed, vision=prob.vision
    )
    rb = None
    if blind is not None:
        rb = Problem.build(blind.lens, blind.cluster, ring_cost, causal=blind.causal, seed=seed)
    out = []
    for sch in _candidates("fcp", rp, rb, keep, seed)[0]:
        sch.name = f"ring:{sch.name}"
        out.append(sch.score(prob))
    return out


def plan_global_batch(
    seqlens: Sequence[int] | np.ndarray,
    cluster: Cluster,
    cost: CostModel,
    *,
    causal: bool | Sequence[bool] | np.ndarray = True,
    strategy: str = "fcp",
    seed: int = 0,
    on_too_long: str = "raise",
    vision: VisionWork | None = None,
) -> Plan:
    """Plan one global batch: which CP groups, at which degrees, run which sequences, when.

    Pure and deterministic: the same lengths, cluster, cost model, strategy and seed give the
    same plan (same digest) in every process. `seed` only orders sequences of equal cost.
    A sequence that cannot fit even on all N replicas raises (`on_too_long="raise"`) or is left
    out and listed in `Plan.dropped` (`"drop"`); when every sequence is dropped the plan is one
    empty wave (every replica sits it out). An unknown strategy raises ConfigError. `vision`:
    the batch's vision work (`fcp_data.vision.vision_work_from_index` / `_from_media` build it
    from the length index columns and rule),
    priced by `cost.vision`. What an idle (replica, wave) slot costs and whether waves end with
    a barrier come from the cluster (`Cluster.idle`, `Cluster.sync_waves`), so the loader, which
    passes its Cluster, and `score_plan` price a plan the same way.
    """
    check_strategy(strategy)
    if on_too_long not in ON_TOO_LONG:
        raise ConfigError(f"on_too_long={on_too_long!r} is not one of {ON_TOO_LONG}")
    pow2 = strategy == "pow2"
    prob = Problem.build(seqlens, cluster, cost, causal=causal, pow2=pow2, seed=seed)
    blind = None
    load = _vision_load(vision, cost, prob.lens)
    if load is not None:
        blind = prob
        prob = Problem.build(
            seqlens, cluster, cost, causal=causal, pow2=pow2, seed=seed, vision=load
        )
    too_long = np.flatnonzero(prob.dmin == 0)
    if too_long.size and on_too_long == "raise":
        shown = too_long[:5].tolist()
        pow2_note = " at power-of-two degrees" if strategy == "pow2" else ""
        raise ConfigError(
            f"{too_long.size} sequence(s) cannot fit even on all {prob.num_replicas} replicas "
            f"of {prob.cap} tokens each (ids {shown}, lengths {prob.lens[shown].tolist()}; the "
            f"cluster holds at most {prob.num_replicas * prob.cap} tokens per sequence"
            f"{pow2_note}): "
            "raise tokens_per_replica / memory_bytes, add replicas, truncate such samples, or "
            "pass on_too_long='drop' to leave them out and count them in Plan.dropped"
        )
    keep = prob.dmin > 0
    units = prob.order[keep[prob.order]]
    dropped = tuple(int(i) for i in too_long)
    if units.size == 0:  # on_too_long="drop" left nothing: one empty wave, all counted
        assert prob.idle_s is not None  # every replica sits it out: a placeholder each, or none
        return Plan(
            num_replicas=prob.num_replicas,
            waves=(Wave(groups=(), barrier=prob.sync),),
            predicted_time=float(prob.idle_s.max()),
            lower_bound=0.0,
            strategy=strategy,
            winner="none",
            dropped=dropped,
        ).with_digest()
    found, lower = _candidates(strategy, prob, blind, keep, seed)
    if not found:
        raise PlanningError(
            f"strategy={strategy!r} found no feasible plan for {units.size} sequences on "
            f"{prob.num_replicas} replicas (e.g. 'static' needs a degree dividing N that holds the "
            "longest sequence); try strategy='fcp'"
        )
    best = min(found, key=lambda s: s.makespan)  # first of equals: candidate order breaks ties
    candidates = {s.name: s.makespan for s in found}
    if len(candidates) != len(found):
        raise RuntimeError(f"candidate names collide: {[s.name for s in found]}")
    return to_plan(
        best, prob, strategy=strategy, candidates=candidates, lower=lower, dropped=dropped
    )
