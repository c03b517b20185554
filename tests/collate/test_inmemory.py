"""In-memory batches (fcp_data.inmemory): shard then unshard is the identity; the loader's layout.

The property: for random lengths, plans of random degrees and ring orders over random replica
counts, pad units and idle policies, every field sharded into every replica's micro-batches and
put back with `unshard_replicas` / `unshard_group` equals the input (label-aligned fields on
positions 1..L-1, their value 0 being the fill), and so do tokens, labels, loss mask and
positions. Then the real planner, the loader's contract (placeholders, loss-token count) and
each bad input's error.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fcp_data.collate import IGNORE_INDEX, MicroBatch, pack_shard
from fcp_data.collate.unshard import unshard_group, unshard_replicas
from fcp_data.errors import FCPError
from fcp_data.inmemory import BatchInputError, InMemoryBatch, InMemoryMicroBatch, shard_batch
from fcp_data.planner import Cluster, CostModel, CPGroup, Plan, Wave
from fcp_data.profiles import shipped_profile

COST = CostModel.from_model("qwen3-1.7b", "cpu")


def fixed_planner(plan: Plan):
    def planner(seqlens, cluster, cost, **_):
        return plan

    return planner


@st.composite
def batches_and_plans(draw: st.DrawFn) -> tuple[list[int], int, int, str, Plan]:
    """Lengths, replicas, pad unit, idle policy and a random plan: every sequence in one group
    of one wave, groups of random degrees and ring orders, some replicas idle in some waves."""
    n_rep = draw(st.integers(1, 5))
    lens = draw(st.lists(st.integers(1, 90), min_size=1, max_size=7))
    unit = draw(st.sampled_from([1, 1, 2, 4]))
    idle = draw(st.sampled_from(["placeholder", "empty"]))
    n_waves = draw(st.integers(1, 3))
    blocks: list[list[tuple[int, ...]]] = []
    for _ in range(n_waves):  # a permutation of the replicas cut into groups
        perm = draw(st.permutations(range(n_rep)))
        cuts = (
            sorted(draw(st.sets(st.integers(1, n_rep - 1), max_size=n_rep - 1)))
            if n_rep > 1
            else []
        )
        bounds = [0, *cuts, n_rep]
        blocks.append([tuple(perm[a:b]) for a, b in itertools.pairwise(bounds)])
    members: dict[tuple[int, int], list[int]] = {}
    for s in range(len(lens)):
        w = draw(st.integers(0, n_waves - 1))
        g = draw(st.integers(0, len(blocks[w]) - 1))
        members.setdefault((w, g), []).append(s)
    waves = []
    for w in range(n_waves):
        groups = [
            CPGroup(
                replicas=blocks[w][g],
                degree=len(blocks[w][g]),
                sequence_ids=tuple(ids),
                seqlens=tuple(lens[s] for s in ids),
                causal=(True,) * len(ids),
                predicted_time=1.0,
            )
            for g in range(len(blocks[w]))
            if (ids := members.get((w, g)))
        ]
        if groups:
            waves.append(Wave(groups=tuple(groups)))
    plan = Plan(
        num_replicas=n_rep,
        waves=tuple(waves),
        predicted_time=1.0,
        lower_bound=0.0,
        strategy="explicit",
        winner="explicit",
    ).with_digest()
    return lens, n_rep, unit, idle, plan


def _batch(lens: list[int], seed: int) -> tuple[InMemoryBatch, dict]:
    rng = np.random.default_rng(seed)
    raw = {
        "tokens": [rng.integers(1, 1000, size=L) for L in lens],
        "mask": [rng.random(L) < 0.7 for L in lens],
        "adv": [torch.from_numpy(rng.normal(size=L)) for L in lens],
        "topk": [torch.from_numpy(rng.integers(0, 9, size=(L, 3))) for L in lens],
        "types": [list(rng.integers(0, 3, size=L)) for L in lens],
        "reward": rng.normal(size=len(lens)).astype(np.float32),
    }
    batch = InMemoryBatch(
        raw["tokens"],
        loss_mask=raw["mask"],
        fields={"adv": raw["adv"], "topk": raw["topk"], "types": raw["types"]},
        token_aligned=("types",),
        sequence_fields={"reward": raw["reward"]},
    )
    return batch, raw


@settings(max_examples=120, deadline=None)
@given(case=batches_and_plans(), seed=st.integers(0, 2**31 - 1))
def test_shard_then_unshard_is_the_identity(case, seed: int) -> None:
    lens, n_rep, unit, idle, plan = case
    batch, raw = _batch(lens, seed)
    cluster = Cluster(
        n_rep, tokens_per_replica=4096, tensor_parallel=unit, sequence_parallel=unit > 1,
        idle=idle, replicas_per_node=n_rep,
    )  # fmt: skip
    shards = [
        shard_batch(batch, cluster, COST, replica=r, planner=fixed_planner(plan))
        for r in range(n_rep)
    ]
    assert {s.digest for s in shards} == {plan.digest}
    for s in shards:
        assert len(s.micro_batches) == plan.num_waves
        for mb in s.micro_batches:
            assert isinstance(mb, InMemoryMicroBatch)
            assert mb.num_tokens % unit == 0
            for name in ("adv", "topk", "types"):
                assert mb.fields[name].shape[0] == mb.num_tokens
            if mb.rank_plan.is_empty:
                assert mb.num_tokens == (0 if idle == "empty" else 2 * unit)
                assert mb.num_loss_tokens == 0

    def gather(name: str, align: str) -> list:
        def part(r: int, w: int) -> torch.Tensor:
            mb = shards[r].micro_batches[w]
            return mb.fields[name] if name in mb.fields else getattr(mb, name)

        return unshard_replicas(plan, part, num_sequences=len(lens), unit=unit, align=align)

    adv, topk = gather("adv", "label"), gather("topk", "label")
    types, toks = gather("types", "token"), gather("tokens", "token")
    labels, mask = gather("labels", "token"), gather("loss_mask", "label")
    positions = gather("position_ids", "token")
    for k, L in enumerate(lens):
        assert torch.equal(toks[k], torch.from_numpy(raw["tokens"][k]))
        assert torch.equal(adv[k][1:], raw["adv"][k][1:]) and adv[k][0] == 0
        assert torch.equal(topk[k][1:], raw["topk"][k][1:]) and not topk[k][0].any()
        assert torch.equal(types[k], torch.tensor(raw["types"][k]))
        assert torch.equal(positions[k], torch.arange(L))
        want_labels = np.full(L, IGNORE_INDEX)
        want_labels[:-1] = np.where(raw["mask"][k][1:], raw["tokens"][k][1:], IGNORE_INDEX)
        assert labels[k].tolist() == want_labels.tolist()
        assert mask[k][1:].tolist() == raw["mask"][k][1:].astype(np.float32).tolist()
    want_loss = sum(int(m[1:].sum()) for m in raw["mask"])
    assert {s.global_num_loss_tokens for s in shards} == {want_loss}
    assert sum(mb.num_loss_tokens for s in shards for mb in s.micro_batches) == want_loss
    for s in shards:  # per-sequence fields: rows of the micro-batch's sequences
        for mb in s.micro_batches:
            ids = list(mb.rank_plan.sequence_ids)
            assert mb.sequence_fields["reward"].tolist() == raw["reward"][ids].tolist()
            spread = mb.per_token("reward")
            assert spread.shape[0] == mb.num_tokens


@settings(max_examples=80, deadline=None)
@given(
    lens=st.lists(st.integers(1, 200), min_size=1, max_size=6),
    d=st.integers(1, 7),
    unit=st.sampled_from([1, 2, 8]),
    align=st.sampled_from(["label", "token"]),
    seed=st.integers(0, 2**31 - 1),
)
def test_unshard_group_inverts_pack_shard(lens, d, unit, align, seed) -> None:
    """The group-level inverse against the collator itself: slot t carries position t (token)
    or t+1 (label) of its sequence."""
    rng = np.random.default_rng(seed)
    seqs = [rng.integers(1, 50_000, size=L) for L in lens]
    shards = [pack_shard(seqs, degree=d, index=i, unit=unit) for i in range(d)]
    bufs = [torch.from_numpy(s.position_ids.astype(np.float64)) for s in shards]
    out = unshard_group(bufs, lens, degree=d, unit=unit, align=align, fill=-1.0)
    for L, got in zip(lens, out):
        want = np.arange(L, dtype=np.float64) if align == "token" else np.r_[-1.0, np.arange(L - 1)]
        assert got.tolist() == want.tolist()
    toks = unshard_group(
        [torch.from_numpy(s.tokens) for s in shards], lens, degree=d, unit=unit, align="token"
    )
    assert all(torch.equal(t, torch.from_numpy(s)) for t, s in zip(toks, seqs))


def test_real_planner_same_plan_on_every_replica_and_the_loader_layout() -> None:
    """plan_global_batch on a long-tailed batch: a degree >= 2 group, a placeholder, equal
    digests; each micro-batch is exactly what the loader's collator packs for it."""
    lens = [15, 53, 162, 21, 90, 25, 44, 250]  # examples/grpo_logprobs.py's batch
    rng = np.random.default_rng(0)
    seqs = [rng.integers(1, 500, size=L) for L in lens]
    batch = InMemoryBatch(seqs)
    cluster = Cluster(4, tokens_per_replica=200)
    cost = CostModel.load(shipped_profile("cpu-small"))  # prices the ring: mixed degrees
    shards = [shard_batch(batch, cluster, cost, replica=r) for r in range(4)]
    assert len({s.digest for s in shards}) == 1
    plan = shards[0].plan
    assert max(plan.degrees) >= 2
    placeholders = [mb for s in shards for mb in s.micro_batches if mb.is_placeholder]
    assert placeholders
    assert shards[0].global_num_loss_tokens == sum(L - 1 for L in lens)
    for s in shards:
        for mb in s.micro_batches:
            rp = mb.rank_plan
            if rp.is_empty:
                ref = MicroBatch.placeholder(rp, global_num_loss_tokens=mb.global_num_loss_tokens)
            else:
                packed = pack_shard(
                    [seqs[i] for i in rp.sequence_ids], degree=rp.degree, index=rp.index_in_group
                )
                ref = MicroBatch.from_packed(
                    packed,
                    rank_plan=rp,
                    sample_ids=rp.sequence_ids,
                    keys=tuple(str(i) for i in rp.sequence_ids),
                    global_num_loss_tokens=mb.global_num_loss_tokens,
                )
            for name in (
                "tokens",
                "labels",
                "loss_mask",
                "position_ids",
                "cu_seqlens",
                "cu_seqlens_padded",
                "local_cu_seqlens",
                "local_cu_seqlens_padded",
            ):
                assert torch.equal(getattr(mb, name), getattr(ref, name)), name
            assert mb.wave_groups == tuple(g.replicas for g in plan.waves[rp.wave].groups)
    moved = shards[0].micro_batches[0].to("cpu")
    assert isinstance(moved, InMemoryMicroBatch)


def test_with_fields_keeps_the_plan_and_shards_new_fields() -> None:
    lens = [40, 7, 19]
    batch = InMemoryBatch([np.arange(1, L + 1) for L in lens])
    cluster = Cluster(2, tokens_per_replica=24)
    shards = [shard_batch(batch, cluster, COST, replica=r) for r in range(2)]
    old = [torch.arange(L, dtype=torch.float32) for L in lens]
    more = [s.with_fields({"old": old}) for s in shards]
    assert [m.digest for m in more] == [s.digest for s in shards]
    back = unshard_replicas(
        more[0].plan, lambda r, w: more[r].micro_batches[w].fields["old"], num_sequences=3
    )
    assert all(torch.equal(b[1:], o[1:]) for b, o in zip(back, old))
    with pytest.raises(BatchInputError, match=r"field 'old': sequence 1 has 6 values for 7"):
        shards[0].with_fields({"old": [old[0], old[1][:6], old[2]]})


def test_too_long_raises_the_planners_error_or_is_dropped_and_reported() -> None:
    batch = InMemoryBatch(
        [[1] * 300, [2] * 10, [3] * 5], loss_mask=[[1] * 300, [0, 1] * 5, [1] * 5]
    )
    cluster = Cluster(2, tokens_per_replica=64)
    with pytest.raises(ValueError, match=r"cannot fit even on all 2 replicas.*ids \[0\]"):
        shard_batch(batch, cluster, COST, replica=0)
    shards = [shard_batch(batch, cluster, COST, replica=r, on_too_long="drop") for r in range(2)]
    assert shards[0].dropped == (0,)
    assert shards[0].global_num_loss_tokens == 5 + 4  # sequence 0's 299 are not counted
    assert 0 not in [i for s in shards for i in s.sequence_ids()]
    back = unshard_replicas(
        shards[0].plan,
        lambda r, w: shards[r].micro_batches[w].tokens,
        num_sequences=3,
        align="token",
    )
    assert back[0] is None and back[1].tolist() == [2] * 10


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"sequences": []}, r"at least one sequence, got 0"),
        ({"sequences": [[1, 2], []]}, r"sequence 1 is empty"),
        ({"sequences": [[1, 2], [0.5, 2.0]]}, r"sequence 1 has dtype float64"),
        ({"sequences": [torch.tensor([True, False])]}, r"sequence 0 has dtype torch.bool"),
        ({"sequences": [[1, -3, 2]]}, r"negative token id -3 at position 1"),
        ({"sequences": [np.ones((2, 3), dtype=np.int64)]}, r"sequence 0 has shape \(2, 3\)"),
        ({"sequences": torch.ones(2, 3, dtype=torch.int64)}, r"one 1-D sequence of token ids"),
        (
            {"sequences": [[1, 2, 3], [4, 5]], "fields": {"adv": [[0.1, 0.2, 0.3], [0.1]]}},
            r"field 'adv': sequence 1 has 1 values for 2 tokens",
        ),
        (
            {"sequences": [[1, 2, 3], [4, 5]], "fields": {"adv": [[0.1, 0.2, 0.3]]}},
            r"'adv' has 1 entries for a batch of 2 sequences",
        ),
        ({"sequences": [[1, 2]], "fields": {"adv": [torch.tensor(1.0)]}}, r"is a scalar"),
        (
            {
                "sequences": [[1, 2], [3, 4]],
                "fields": {"lp": [torch.zeros(2), torch.zeros(2, dtype=torch.float64)]},
            },
            r"field 'lp': sequence 1 has dtype torch.float64",
        ),
        (
            {"sequences": [[1, 2, 3]], "loss_mask": [[1, 0]]},
            r"field 'loss_mask': sequence 0 has 2 values for 3 tokens",
        ),
        (
            {"sequences": [[1, 2, 3]], "loss_mask": [[1, 0, 2]]},
            r"loss_mask: sequence 0 has values \[2\]",
        ),
        (
            {"sequences": [[1, 2]], "fields": {"a": [[1, 2]]}, "token_aligned": ("b",)},
            r"token_aligned names \['b'\]",
        ),
        (
            {"sequences": [[1, 2], [3]], "sequence_fields": {"reward": [1.0]}},
            r"'reward' has 1 entries for a batch of 2",
        ),
        ({"sequences": [[1, 2], [3]], "causal": [True]}, r"causal has 1 flags for 2"),
    ],
)
def test_bad_input_is_a_named_error(kwargs: dict, pattern: str) -> None:
    seqs = kwargs.pop("sequences")
    with pytest.raises(BatchInputError, match=pattern) as info:
        InMemoryBatch(seqs, **kwargs)
    assert isinstance(info.value, FCPError) and isinstance(info.value, ValueError)


def test_error_names_field_and_sequence_and_survives_pickling() -> None:
    import pickle

    with pytest.raises(BatchInputError) as info:
        InMemoryBatch([[1, 2], [3, 4, 5]], fields={"old_logprobs": [[0.0, 0.0], [0.0]]})
    err = pickle.loads(pickle.dumps(info.value))
    assert (err.field, err.sequence) == ("old_logprobs", 1)
    assert "old_logprobs" in str(err) and "1 values for 3 tokens" in str(err)
