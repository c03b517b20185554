"""Vision work in the cost model and the planner: exact unit counts, presets, plans."""

import argparse
import dataclasses
import io
import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fcp_data.collate.zigzag import padded_seqlen, shard_indices
from fcp_data.errors import ConfigError
from fcp_data.planner import Cluster, CostModel, plan_global_batch, score_plan
from fcp_data.planner.cost.presets import MODELS
from fcp_data.planner.cost.vision import (
    VisionCost,
    VisionLoad,
    group_vision_seconds,
    held_units,
    member_units,
)
from fcp_data.planner.cost.vision_presets import ENCODERS, estimate_vision_cost
from fcp_data.planner.cost.vision_work import VisionWork
from fcp_data.planner.simulate import check_plan
from fcp_data.vision import vision_work_from_index, vision_work_from_media
from fcp_data.vision.decode import groups_for_token_range
from fcp_data.vision.families import get_rule


def brute_held(first: int, stride: int, m: int, units: int, seqlen: int, d: int) -> list[int]:
    """Units whose tokens meet each member's zigzag positions, by enumerating the positions."""
    out = []
    for r in range(d):
        pos = set(shard_indices(padded_seqlen(seqlen, d), d, r).tolist())
        out.append(sum(any(first + k * stride + j in pos for j in range(m)) for k in range(units)))
    return out


def test_held_units_equal_enumerated_zigzag_positions():
    cases = 0
    for units, m, gap, first, tail, d in itertools.product(
        range(0, 5), (1, 3, 7), (0, 2), (0, 1, 5), (0, 4), range(1, 6)
    ):
        seqlen = first + max(0, units * (m + gap) - gap) + tail
        if seqlen < 1:
            continue
        got = held_units(first, m + gap, m, units, seqlen, np.full(d, d), np.arange(d))
        want = brute_held(first, m + gap, m, units, seqlen, d)
        assert got.tolist() == want, (units, m, gap, first, tail, d)
        if units:
            # every unit is encoded at least once; each of the 2d-1 inner chunk edges
            # duplicates at most one unit; the busiest member holds at least its share
            assert units <= sum(want) <= units + 2 * d - 1
            assert max(want) >= -(-units // d)
        cases += 1
    assert cases > 500


def test_worked_example_of_the_docstring():
    held = held_units(2, 720, 720, 60, 43_202, np.full(4, 4), np.arange(4))
    assert held.tolist() == [16, 16, 17, 16]
    assert held.tolist() == brute_held(2, 720, 720, 60, 43_202, 4)


def test_group_time_is_the_busiest_members_sum_over_sequences():
    work = VisionWork.build(
        units=[3, 0, 5, 2], unit_tokens=[4, 0, 3, 6], first=[1, 0, 0, 2], patches=[16, 0, 8, 30]
    )
    cost = VisionCost(seconds_per_patch=1e-3, seconds_per_full_pair=1e-5)
    lens = np.array([20, 9, 17, 15])
    load = VisionLoad.build(work, cost, lens)
    units = np.array([0, 1, 2, 3])
    unit_group = np.array([0, 0, 1, 0])
    degs = np.array([3, 2])
    got = group_vision_seconds(load, lens, units, unit_group, degs)
    for g, d in enumerate(degs):
        per_member = np.zeros(d)
        for s in units[unit_group == g]:
            held = brute_held(int(work.first[s]), int(work.stride[s]), int(work.unit_tokens[s]),
                              int(work.units[s]), int(lens[s]), int(d))  # fmt: skip
            per_member += np.array(held) * cost.encode_seconds(work.patches[s])
        assert got[g] == pytest.approx(per_member.max(), rel=1e-12)
    # more patches per unit, more time; no units, no time
    bigger = VisionLoad.build(dataclasses.replace(work, patches=work.patches * 2), cost, lens)
    assert np.all(group_vision_seconds(bigger, lens, units, unit_group, degs) > got)
    assert load.unit_s[1] == 0.0


def test_work_from_media_matches_the_rules_and_the_readers_token_ranges():
    """Legacy layout (template tokens first): units against the readers' own token ranges."""
    for rule_name in ("qwen3-vl", "qwen2.5-vl", "internvl"):
        rule = get_rule(rule_name)
        frames, fps, w, h = np.array([300, 61]), np.array([30.0, 24.0]), [1280, 640], [720, 360]
        work = vision_work_from_media(
            modality=np.array([1, 1, 0]),
            num_frames=np.append(frames, 0),
            fps=np.append(fps, 0.0),
            width=np.array([*w, 0]),
            height=np.array([*h, 0]),
            rule=rule,
            layout="specials-first",
        )
        assert work.units[2] == 0
        for i in range(2):
            vt = rule.video(num_frames=int(frames[i]), fps=float(fps[i]), height=h[i], width=w[i])
            assert work.units[i] * work.unit_tokens[i] == vt.vision
            assert work.first[i] == vt.special  # the loader's layout: template, then units
            seqlen = vt.total + 37  # a caption after the units
            for d in (1, 2, 3, 5):
                held = member_units(work, i, seqlen, d)
                for r in range(d):
                    pos = shard_indices(padded_seqlen(seqlen, d), d, r) - vt.special
                    chunks = np.split(pos, 2)
                    want = set()
                    for c in chunks:
                        want |= set(groups_for_token_range(vt, int(c[0]), int(c[-1]) + 1))
                    assert held[r] == len(want)


def test_template_layout_units_are_where_the_payload_renders_them():
    """Template layout (Qwen3-VL timestamps, InternVL frame labels between units): unit starts
    equal `fcp_data.vision.template.render`'s, and counts equal enumerating the positions, in
    the compiled kernel and in the simulator's path."""
    from fcp_data.vision.template import render
    from fcp_data.vision.tokens import family_of

    for rule_name in ("qwen3-vl", "qwen2.5-vl", "internvl"):
        rule = get_rule(rule_name)
        frames, fps = np.array([150, 2400, 45]), np.array([30.0, 30.0, 25.0])
        work = vision_work_from_media(
            modality=np.ones(3, np.int8), num_frames=frames, fps=fps,
            width=np.array([1280, 640, 320]), height=np.array([720, 360, 240]), rule=rule,
        )  # fmt: skip
        lens = np.zeros(3, np.int64)
        for i in range(3):
            vt = rule.video(num_frames=int(frames[i]), fps=float(fps[i]),
                            height=[720, 360, 240][i], width=[1280, 640, 320][i])  # fmt: skip
            count = rule.text_counter
            _, layout = render(vt, kind=2, family=family_of(rule_name), token_ids=None,
                               text_ids=lambda t, c=count: [0] * c(t))  # fmt: skip
            assert work.unit_starts(i).tolist() == layout.unit_starts.tolist()
            assert work.unit_tokens[i] == layout.unit_tokens
            lens[i] = vt.total + 11
        load = VisionLoad.build(work, VisionCost(seconds_per_patch=1.0), lens)
        for i, d in itertools.product(range(3), (1, 2, 3, 7)):
            pos_units = [set() for _ in range(d)]
            for r in range(d):
                pos = shard_indices(padded_seqlen(int(lens[i]), d), d, r)
                for u, s0 in enumerate(work.unit_starts(i)):
                    if np.any((pos >= s0) & (pos < s0 + work.unit_tokens[i])):
                        pos_units[r].add(u)
            want = [len(x) for x in pos_units]
            assert member_units(work, i, int(lens[i]), d).tolist() == want
            got = group_vision_seconds(load, lens, np.array([i]), np.zeros(1, np.int64),
                                       np.array([d]))  # fmt: skip
            assert got[0] == pytest.approx(max(want) * load.unit_s[i], rel=1e-12)


def test_encoder_presets_are_the_published_sizes():
    params = {k: e.params / 1e6 for k, e in ENCODERS.items()}
    assert 600 < params["qwen2.5-vl-vit"] < 680  # 675M with merger and patch embedding
    assert 295 < params["qwen3-vl-vit"] < 310 and 295 < params["internvit-300m"] < 310
    assert 390 < params["qwen3-vl-vit-8b"] < 420
    assert 5400 < params["internvit-6b"] < 5900
    for name, m in MODELS.items():
        cost = CostModel.from_model(name, "h200")
        assert (cost.vision is None) == (m.vision is None), name
    small = estimate_vision_cost("qwen3-vl-vit", "h200", peak_flops=989e12, llm_hidden=2048)
    big = estimate_vision_cost("qwen3-vl-vit-8b", "h200", peak_flops=989e12, llm_hidden=4096)
    frozen = estimate_vision_cost(
        "qwen3-vl-vit", "h200", peak_flops=989e12, llm_hidden=2048, frozen=True
    )
    assert big.encode_seconds(2880) > small.encode_seconds(2880) > 0
    assert frozen.encode_seconds(2880) == pytest.approx(small.encode_seconds(2880) / 3)
    # one 720p tubelet (40 x 72 patches) on an H200: milliseconds, not micro- or whole seconds
    assert 2e-3 < small.encode_seconds(2880) < 0.1
    # windows make Qwen2.5-VL's cost grow slower than quadratically in the patches
    qwen25 = estimate_vision_cost("qwen2.5-vl-vit", "h200", peak_flops=989e12, llm_hidden=3584)
    grow = qwen25.encode_seconds(4 * 2880) / qwen25.encode_seconds(2880)
    assert grow < small.encode_seconds(4 * 2880) / small.encode_seconds(2880)
    slow_host = estimate_vision_cost(
        "qwen3-vl-vit", "ascend-910c", peak_flops=752e12, llm_hidden=2048
    )
    assert slow_host.decode_seconds_per_mpix > small.decode_seconds_per_mpix


def test_cost_model_with_vision_round_trips(tmp_path):
    cost = CostModel.from_model("internvl3-2b", "ascend-910c")
    cost.save(tmp_path / "c.json")
    assert CostModel.load(tmp_path / "c.json") == cost


def _batch(rng: np.random.Generator, k: int, cap: int, n: int) -> tuple[np.ndarray, VisionWork]:
    units = np.where(rng.random(k) < 0.7, rng.integers(1, 12, k), 0)
    m = rng.integers(8, max(9, cap // 4), k)
    gap = rng.integers(0, 3, k)
    first = rng.integers(0, 9, k)
    last = first + np.maximum(units * (m + gap) - gap, 0)
    lens = np.minimum(last + rng.integers(1, 200, k), cap * n)
    units = np.where(last < lens, units, 0)
    if rng.random() < 0.5:  # regular layout
        work = VisionWork.build(units=units, unit_tokens=m, first=first, stride=m + gap,
                                patches=4 * m, decode_mpix=rng.random(k))  # fmt: skip
        return lens, work
    starts = []  # explicit layout: gaps of 0..gap tokens between units
    for i in range(k):
        steps = m[i] + rng.integers(0, gap[i] + 1, max(units[i] - 1, 0))
        starts.append((first[i] + np.concatenate([[0], np.cumsum(steps)]))[: units[i]])
    work = VisionWork.build(unit_starts=starts, unit_tokens=m, patches=4 * m,
                            decode_mpix=rng.random(k))  # fmt: skip
    return lens, work


@st.composite
def vision_problems(draw):
    n = draw(st.integers(1, 12))
    cluster = Cluster(
        n,
        replicas_per_node=draw(st.integers(1, n)),
        tokens_per_replica=(cap := draw(st.sampled_from([1024, 4096]))),
    )
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    lens, work = _batch(rng, draw(st.integers(1, 30)), cap, n)
    model = draw(st.sampled_from(["qwen3-vl-2b", "internvl3-8b"]))
    return lens, work, cluster, CostModel.from_model(model, draw(st.sampled_from(["h200", "cpu"])))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(vision_problems(), st.sampled_from(["fcp", "pow2", "static-balanced", "lanes"]))
def test_vision_aware_plans_are_never_worse_than_blind_ones(prob, strategy):
    lens, work, cluster, cost = prob
    try:
        blind = plan_global_batch(lens, cluster, cost, strategy=strategy)
        aware = plan_global_batch(lens, cluster, cost, strategy=strategy, vision=work)
    except ValueError:
        assert strategy == "pow2"  # no power-of-two degree may hold the longest sequence
        return
    check_plan(aware, lens, cluster, cost)
    sim = score_plan(aware, lens, cluster, cost, vision=work)
    assert sim.makespan == pytest.approx(aware.predicted_time, rel=1e-9)
    assert aware.predicted_time >= sim.lower_bound * (1 - 1e-9)
    blind_scored = score_plan(blind, lens, cluster, cost, vision=work).makespan
    assert blind_scored >= score_plan(blind, lens, cluster, cost).makespan
    if strategy in ("fcp", "pow2"):
        assert aware.predicted_time <= blind_scored * (1 + 1e-9)


@pytest.mark.parametrize("strategy", ["fcp", "static", "megatron-hybrid", "paper", "moldable"])
def test_text_only_batches_plan_bit_identically(strategy):
    rng = np.random.default_rng(3)
    lens = rng.integers(100, 30_000, 200)
    cluster = Cluster(32, replicas_per_node=8, tokens_per_replica=16384)
    cost = CostModel.from_model("qwen3-vl-2b", "h200")
    text = dataclasses.replace(cost, vision=None)
    none = VisionWork.build(units=np.zeros(200), unit_tokens=0, first=0, patches=0)
    plans = [
        plan_global_batch(lens, cluster, text, strategy=strategy),
        plan_global_batch(lens, cluster, cost, strategy=strategy),
        plan_global_batch(lens, cluster, cost, strategy=strategy, vision=none),
        plan_global_batch(lens, cluster, text, strategy=strategy, vision=none),
    ]
    assert all(p == plans[0] and p.digest == plans[0].digest for p in plans)


def test_vision_changes_the_plan_and_every_baseline_counts_it():
    rng = np.random.default_rng(0)
    cluster = Cluster(16, replicas_per_node=8, tokens_per_replica=8192)
    lens, work = _batch(rng, 120, 8192, 16)
    cost = CostModel.from_model("qwen3-vl-2b", "ascend-910c")
    for strategy in ("fcp", "static", "static-balanced", "megatron-hybrid", "paper"):
        blind = plan_global_batch(lens, cluster, cost, strategy=strategy)
        aware = plan_global_batch(lens, cluster, cost, strategy=strategy, vision=work)
        sim = score_plan(aware, lens, cluster, cost, vision=work).makespan
        assert aware.predicted_time == pytest.approx(sim, rel=1e-9)
        assert aware.predicted_time > blind.predicted_time  # vision time is counted
    names = plan_global_batch(lens, cluster, cost, vision=work).candidates
    assert any(k.startswith("vision-blind:") for k in names)


def test_bad_vision_work_is_a_clear_error():
    lens = np.array([100, 200])
    cluster = Cluster(4, tokens_per_replica=1024)
    work = VisionWork.build(units=[2, 0], unit_tokens=30, first=5, patches=120)
    with pytest.raises(ConfigError, match="no vision terms"):
        plan_global_batch(lens, cluster, CostModel.from_model("qwen3-8b", "h200"), vision=work)
    vl = CostModel.from_model("qwen3-vl-2b", "h200")
    with pytest.raises(ConfigError, match="describes 2 samples but the batch has 3"):
        plan_global_batch(np.array([100, 200, 300]), cluster, vl, vision=work)
    with pytest.raises(ConfigError, match="vision tokens end at 65 but the sequence has 50"):
        plan_global_batch(np.array([50, 200]), cluster, vl, vision=work)
    with pytest.raises(ConfigError, match="stride >= unit_tokens"):
        VisionWork.build(units=[2], unit_tokens=30, first=0, patches=120, stride=10)
    with pytest.raises(ConfigError, match="decode_workers"):
        VisionCost(seconds_per_patch=1.0, decode_workers=0)


def test_generated_video_decodes_to_its_frames():
    import av

    from fcp.profiling.vision import make_test_video

    data = make_test_video(96, 64, 7)
    with av.open(io.BytesIO(data)) as c:
        frames = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
    assert len(frames) == 7 and frames[0].shape == (64, 96, 3)
    assert not np.array_equal(frames[0], frames[-1])  # the content moves: real decode work


def test_vision_profile_recovers_known_coefficients_and_lands_in_the_saved_model(
    monkeypatch, tmp_path
):
    from rich.console import Console

    from fcp.commands._profile_vision import attach_vision
    from fcp.profiling import vision as vp
    from fcp.profiling.fit import Fit, FitRow
    from fcp.profiling.measure import Profile

    truth = VisionCost(seconds_per_unit=2e-3, seconds_per_patch=3e-5, seconds_per_full_pair=4e-8)
    monkeypatch.setattr(vp, "time_encoder", lambda c, p: float(truth.encode_seconds(p)))
    monkeypatch.setattr(vp, "time_decode", lambda w, h, f, r: 6e-3 * w * h / 1e6)
    one = Fit(coef={}, rows=(FitRow(x=1.0, measured=1.0, predicted=1.0),))
    profile = Profile(cost=CostModel(alpha1=1e-9, alpha2=1e-6), compute=one, points=())
    args = argparse.Namespace(vision=True, device="cpu")
    attach_vision(profile, args, Console(file=io.StringIO()))
    got = profile.cost.vision
    assert got.seconds_per_unit == pytest.approx(2e-3, rel=1e-6)
    assert got.seconds_per_patch == pytest.approx(3e-5, rel=1e-6)
    assert got.seconds_per_full_pair == pytest.approx(4e-8, rel=1e-6)
    assert got.decode_seconds_per_mpix == pytest.approx(6e-3, rel=1e-9)
    assert profile.meta["vision"]["encoder_fit"]["max_abs_error"] < 1e-6
    profile.save(tmp_path / "p.json")
    assert CostModel.load(tmp_path / "p.json").vision == got


def test_tiny_encoder_really_runs_and_grows_with_patches(monkeypatch):
    """Counted work, not wall time (a timing ratio failed from warm-up): every run that
    time_encoder times is the whole stack forward on the unit's P patches (every linear layer
    on P rows, the merger on P/4, attention over all P) and backward through every layer."""
    import torch

    from fcp.profiling.vision import VisionProfileConfig, time_encoder

    c = VisionProfileConfig(layers=1, hidden=32, heads=2, ffn=64, repeats=1)
    rows: list[tuple[int, int, int]] = []  # (in, out, rows) of each linear's forward
    grads: list[tuple[int, int, int]] = []  # the same, when the gradient reaches its output
    attention: list[tuple[int, ...]] = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, *args, **kwargs):
        attention.append(tuple(q.shape))
        return sdpa(q, k, v, *args, **kwargs)

    def linear(module, args, out):
        if isinstance(module, torch.nn.Linear):
            key = (module.in_features, module.out_features, args[0].shape[0])
            rows.append(key)
            out.register_hook(lambda grad: grads.append(key))

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    hook = torch.nn.modules.module.register_module_forward_hook(linear)
    h, f = c.hidden, c.ffn
    try:
        for p in (16, 64):  # exact counts: the growth shows at any two sizes
            rows.clear(), grads.clear(), attention.clear()
            t = time_encoder(c, p)
            assert np.isfinite(t) and t > 0
            runs, rest = divmod(len(attention), c.layers)
            assert rest == 0 and runs >= c.repeats  # each timed run (and the warm-up) ran
            assert set(attention) == {(c.heads, p, h // c.heads)}  # over all p patches
            stack = [(3 * c.temporal_patch * c.patch**2, h, p)]  # the patch embedding
            stack += [(h, 3 * h, p), (h, h, p), (h, f, p), (f, h, p)] * c.layers
            stack += [(4 * h, 4 * h, p // 4), (4 * h, h, p // 4)]  # the 2x2 merger
            assert sorted(rows) == sorted(stack * runs)
            assert sorted(grads) == sorted(rows)  # backward through every layer of every run
    finally:
        hook.remove()


def byte_ids(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def test_index_vision_work_counts_the_units_the_loader_decodes(tmp_path):
    """Oracle: the loader's own encoder decides which units (frame groups) each zigzag member
    decodes; the planner's count must be exactly that, for every member of every degree."""
    from fcp_data.loader.encode import SampleEncoder
    from fcp_data.readers import ScanConfig, build_index, make_shards

    shards = make_shards(tmp_path / "shards", text=1, video=2, seed=4, samples_per_shard=8)
    config = ScanConfig(vision_rule="qwen3-vl")
    index = build_index([str(p) for p in shards], tmp_path / "idx", config=config,
                        counter=byte_ids)  # fmt: skip
    work = vision_work_from_index(index, layout="specials-first")  # SampleEncoder's layout
    video = np.flatnonzero(np.asarray(index.modality) == 1)
    assert video.size == 2 and np.all(work.units[video] > 0)
    assert np.all(work.units[np.asarray(index.modality) == 0] == 0)
    encoder = SampleEncoder(tokenizer=byte_ids, rule=get_rule("qwen3-vl"))
    for i in video:
        enc = encoder(index, int(i))
        seqlen = len(enc.tokens)
        assert seqlen == index.seqlens[i]
        for d in (1, 3):
            held = member_units(work, int(i), seqlen, d)
            for r in range(d):
                pos = shard_indices(padded_seqlen(seqlen, d), d, r)
                vi = encoder.vision_input(enc, sample_id=int(i), key="k",
                                          held=pos[pos < seqlen], offset=0)  # fmt: skip
                assert held[r] == (0 if vi is None else len(vi.groups)), (i, d, r)
    cluster = Cluster(4, tokens_per_replica=int(index.seqlens.max()))
    plan = plan_global_batch(index.seqlens, cluster, CostModel.from_model("qwen3-vl-2b", "cpu"),
                             vision=work)  # fmt: skip
    check_plan(plan, index.seqlens, cluster, CostModel.from_model("qwen3-vl-2b", "cpu"))
