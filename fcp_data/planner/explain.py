"""What a plan's degrees say, in words: one notation for degree mixes, and why a plan is one degree.

`format_degrees` is the one way the command line, `fcp demo` and the examples write a plan's
CP groups per degree: "⟨2⟩×3, ⟨1⟩×10" (three degree-2 groups, ten at degree 1), widest first.
The terminal table of `fcp view` / `fcp simulate` writes the same.

`why_one_degree` answers the question a user asks when fcp plans like static CP: a plan whose
groups all share one degree is the cost model's answer, not a failure, and the sentence says
which answer, with the model's own numbers. On the shipped cpu-small profile and 8 replicas of
4,096 tokens, a batch of stdlib files that all fit one replica is planned at d = 1 because a
degree-2 ring costs its longest sequence more than it saves; a batch of 64 H200 replicas with a
128K-token sequence would need d >= 8 for it alone.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import numpy as np

from .cost.cluster import Cluster
from .cost.model import CostModel
from .plan import Plan

__all__ = ["format_degrees", "why_one_degree"]


def format_degrees(degrees: Iterable[int]) -> str:
    """CP groups per degree, widest first: [2, 2, 1, 1, 1] -> "⟨2⟩×2, ⟨1⟩×3" ("none": no group)."""
    counts = Counter(int(d) for d in degrees)
    if not counts:
        return "none"
    return ", ".join(f"⟨{d}⟩×{n}" for d, n in sorted(counts.items(), reverse=True))


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f} ms"


def why_one_degree(plan: Plan, cluster: Cluster, cost: CostModel) -> str | None:
    """One sentence on why every CP group of `plan` has the same degree; None when they mix.

    The reasons are the cost model's, checked in this order:
    - d = 1 and a degree-2 ring makes the batch's longest sequence slower (the ring's exposed
      communication and per-step latency exceed the attention it halves): "every sequence
      fits one replica and the ring costs more than it saves";
    - d = 1 and the ring would speed the longest one up, but it already takes no longer than a
      replica's share of the batch: nothing to balance, so a ring only adds communication;
    - d > 1 and the longest sequence needs at least that degree to fit, or the ring's
      communication hides behind attention at that degree for the whole batch (a ring is free,
      so one wide degree balances best: what happens on an idle link or a small cluster);
    - otherwise the generic answer: no mix of degrees is predicted faster on this batch.
    """
    groups = plan.groups
    degrees = {g.degree for g in groups}
    if len(degrees) != 1:
        return None
    (d,) = degrees
    lens = np.array([s for g in groups for s in g.seqlens], dtype=np.int64)
    causal = np.array([c for g in groups for c in g.causal], dtype=bool)
    longest = int(np.argmax(lens))
    top, top_causal = lens[[longest]], causal[[longest]]
    cap = cost.capacity_tokens(cluster)
    where = f"longest {int(top[0]):,} of {cap:,} tokens a replica holds"
    every = (
        "every sequence"
        if not plan.dropped
        else f"every placed sequence ({len(plan.dropped)} too long, dropped)"
    )
    t1 = cost.group_time(top, 1, causal=top_causal)
    if d == 1:
        if cluster.num_replicas < 2:
            return "one replica: there is no ring to form"
        t2 = cost.group_time(top, 2, causal=top_causal)
        if t2 >= t1:
            return (
                f"{every} fits one replica ({where}) and the ring costs more than it "
                f"saves: under {cost.name} the longest takes {_ms(t2)} at d = 2 against "
                f"{_ms(t1)} at d = 1"
            )
        each = [cost.group_time(lens[[i]], 1, causal=causal[[i]]) for i in range(lens.size)]
        share = sum(each) / cluster.num_replicas
        if t1 <= share:
            return (
                f"{every} fits one replica ({where}) and the batch is balanced without "
                f"rings: the longest takes {_ms(t1)} at d = 1, within a replica's share of the "
                f"batch ({_ms(share)}), so a ring would only add its communication"
            )
        return (
            f"{every} fits one replica ({where}); under {cost.name} no mix of degrees "
            "is predicted faster on this batch"
        )
    reasons = []
    need = cost.min_degree(top, cluster)
    if need >= d:
        reasons.append(f"the longest sequence needs d >= {need} to fit ({where})")
    att, _lin, comm = cost.aggregates(lens, causal)
    ring = (d - 1) / d * comm / cost.intra_node_bandwidth + cost.beta2 * (d - 1)
    if ring <= att / d:
        reasons.append(
            f"at d = {d} the ring's communication ({_ms(ring)} for the batch) hides behind "
            f"its attention ({_ms(att / d)}), so a ring costs the short sequences nothing and "
            "one wide degree balances best"
        )
    if not reasons:
        reasons.append(f"under {cost.name} no mix of degrees is predicted faster on this batch")
    return "; ".join(reasons)
