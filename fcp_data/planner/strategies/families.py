"""The table of strategy families: each strategy's name and the candidates it plans.

`fcp` runs its core family (the paper's waves, lanes, a prologue, moldable list scheduling,
the static plans) and then megatron-dynamic's grid; `plan_global_batch` adds pow2's and the
ring-only planner's candidates to it. `pow2` is the core family on a Problem restricted to
power-of-two degrees. The planner's `STRATEGIES` is this table's keys, so a strategy exists
exactly when it has a row.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

import numpy as np

from ..cost.problem import Problem
from .baselines import megatron_hybrid, static_megatron
from .lanes import lane_candidates, static_balanced
from .megatron_dynamic import megatron_dynamic, megatron_dynamic_tuned
from .moldable import moldable_schedule
from .paper import paper_schedule
from .schedule import Schedule

__all__ = ["FAMILIES", "LARGE", "Family", "core_family", "moldable_family", "prologue_lanes"]


def prologue_lanes(prob: Problem, lower: float, units: np.ndarray) -> list[Schedule]:
    """Sequences that need more than N/2 (or N/4, or a node of) replicas first, when everyone is
    free, placed by moldable list scheduling; the rest in lanes that start as replicas leave
    the prologue.

    A group that spans most of the cluster cannot share it with lanes; run later it would wait
    for the slowest lane. Running such groups first costs no waiting at all. The prologue is
    tried at the wide sequences' minimum degrees (leaving the most replicas to the lanes) and
    with up to 8 more replicas each (finishing the prologue sooner).
    """
    out: list[Schedule] = []
    seen: set[int] = set()
    for label, width in (
        ("N/2", prob.num_replicas // 2),
        ("N/4", prob.num_replicas // 4),
        ("node", prob.replicas_per_node),
    ):
        wide = prob.dmin[units] > width
        count = int(wide.sum())
        if count == 0 or count == units.size or count in seen:
            continue
        seen.add(count)
        for extra in (0, 8):
            pro = moldable_schedule(prob, units[wide], extra=extra)
            if pro is not None:
                pro.name = f"prologue(d>{label},+{extra})"
                out += lane_candidates(
                    prob, lower, units[~wide], prologue=pro, credits=(0.8,), keep=1
                )
    return out


def _named(sch: Schedule | None, name: str) -> Schedule | None:
    if sch is not None:
        sch.name = name
    return sch


LARGE = 2_000_000  # sequences × replicas above which the costlier candidates are trimmed


def fcp_family(prob: Problem, lower: float, units: np.ndarray) -> list[Schedule | None]:
    """fcp's own candidates, then megatron-dynamic's plans at every knob of its grid, each
    scored only when a lower bound on it is below the best so far (they never won a cell of
    the quality grid; they make fcp never worse than megatron-dynamic(-tuned))."""
    own = [s for s in core_family(prob, lower, units) if s is not None]
    best = min((s.makespan for s in own), default=np.inf)
    return [*own, *megatron_dynamic_tuned(prob, units, prune_above=best)]


def moldable_family(prob: Problem, units: np.ndarray) -> list[Schedule | None]:
    """Moldable list scheduling longest first (+4 replicas) and widest first (+0, +1)."""
    # widest first, then longest: the sequences that need most of the cluster start together
    # at t = 0 and the rest fill in around them (at their minimum degree, or one more)
    by_width = units[np.lexsort((-prob.work[units], -prob.dmin[units]))]
    return [
        moldable_schedule(prob, units),
        _named(moldable_schedule(prob, by_width, extra=0), "widest-first+0"),
        _named(moldable_schedule(prob, by_width, extra=1), "widest-first+1"),
    ]


def core_family(prob: Problem, lower: float, units: np.ndarray) -> list[Schedule | None]:
    """fcp's own candidates, also the pow2 strategy's (on a power-of-two Problem).

    On large problems (8192 sequences on 1024 replicas is 8.4M) the paper's candidate tries
    one wave count instead of three and moldable list scheduling, whose cost grows as
    sequences × replicas × degrees and which never wins there, is left out: this keeps such a
    plan near 0.2 s instead of 0.6 s."""
    large = units.size * prob.num_replicas > LARGE
    return [
        paper_schedule(prob, units, tries=1 if large else 3),
        *lane_candidates(prob, lower, units),
        *prologue_lanes(prob, lower, units),
        *([] if large else moldable_family(prob, units)),
        static_balanced(prob, units),
        static_megatron(prob, units),
    ]


Family = Callable[[Problem, float, np.ndarray], list[Schedule | None]]

# The strategies, in the order `STRATEGIES` lists them (errors and the CLI show this order):
# each name's candidate family, called with the Problem, its lower bound and the sequences to
# plan longest first. A new strategy is one entry here (docs/design.md, "Adding a strategy").
FAMILIES: Mapping[str, Family] = MappingProxyType(
    {
        "fcp": fcp_family,
        "paper": lambda p, lb, u: [paper_schedule(p, u)],
        "lanes": lambda p, lb, u: list(lane_candidates(p, lb, u)),
        "moldable": lambda p, lb, u: [moldable_schedule(p, u)],
        "static": lambda p, lb, u: [static_megatron(p, u)],
        "static-balanced": lambda p, lb, u: [static_balanced(p, u)],
        "pow2": core_family,
        "megatron-hybrid": lambda p, lb, u: [megatron_hybrid(p, u)],
        "megatron-dynamic": lambda p, lb, u: [megatron_dynamic(p, u)],
        "megatron-dynamic-tuned": lambda p, lb, u: list(megatron_dynamic_tuned(p, u)),
    }
)
