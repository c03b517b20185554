"""The VLM parity job: a tiny Qwen2.5-VL, real shards, fcp on gloo vs the single-process model.

Shared by test_vlm_parity (spawned children import it). The data: two videos, two images and
three texts in a real WebDataset tar, indexed with a real byte-level BPE tokenizer. The fcp
plan is explicit so that the mixes the test needs are certain: wave 0 a degree-3 group and a
degree-1 replica, wave 1 two degree-2 groups.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

VISION_TESTS = Path(__file__).resolve().parents[1] / "vision"

# (key, kind, args): lengths must be distinct (the explicit planner finds samples by length)
SAMPLES = (
    ("v0", "video", (16, 84, 56, 4, 0)),
    ("v1", "video", (12, 56, 56, 4, 1)),
    ("v2", "video", (8, 56, 84, 4, 2)),
    ("i0", "image", (60, 90, 1, b"a cat on a mat")),
    ("i1", "image", (120, 150, 2, b"two dogs")),
    ("t0", "text", b"the cat sits on the mat and looks at the camera"),
    ("t1", "text", b"captions describe what happens in each clip of the video " * 3),
)
# by length rank (0 = longest): wave 0 (0,1,2)<-[0, 6]  (3,)<-[3, 4]; wave 1 (0,1)<-[1, 5]
# (2,3)<-[2]. Ranks: the three videos, then the images and texts.
WAVES = (
    (((0, 1, 2), (0, 6)), ((3,), (3, 4))),
    (((0, 1), (1, 5)), ((2, 3), (2,))),
)


def tokenizer_path(tmp: Path) -> Path:
    sys.path.insert(0, str(VISION_TESTS))
    from vision_helpers import make_tokenizer

    path = tmp / "tok.json"
    make_tokenizer().save(str(path))
    return path


def load_tokenizer(path: Path) -> Any:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path))


def build_data(tmp: Path) -> tuple[Path, Path]:
    """Shards + index under tmp; returns (index dir, tokenizer json)."""
    sys.path.insert(0, str(VISION_TESTS))
    from vision_helpers import png, video_sample, write_shards

    from fcp_data.readers import build_index
    from fcp_data.readers.scan import ScanConfig

    tok_path = tokenizer_path(tmp)
    tok = load_tokenizer(tok_path)
    samples = []
    for key, kind, a in SAMPLES:
        if kind == "video":
            samples.append(video_sample(key, *a[:4], seed=a[4]))
        elif kind == "image":
            samples.append({"__key__": key, "png": png(a[0], a[1], a[2]), "txt": a[3]})
        else:
            samples.append({"__key__": key, "txt": a})
    url = write_shards(tmp / "vlm.tar", samples)
    cfg = ScanConfig(vision_rule="qwen2.5-vl", on_error="raise")
    build_index(url, tmp / "index", config=cfg, counter=tok)
    return tmp / "index", tok_path


def plan_of_waves(
    waves: Any,
    expected: int,
    seqlens: Any,
    cluster: Any,
    cost: Any,
    *,
    causal: Any = True,
    **_: Any,
) -> Any:
    """A planner that returns the fixed plan `waves` (per wave: (replicas, length ranks)
    groups; sequences found by length rank, so `expected` distinct lengths)."""
    from fcp_data.planner import CPGroup, Plan, Wave

    lens = np.asarray(seqlens, np.int64)
    assert len(set(lens.tolist())) == len(lens) == expected, lens
    order = [int(i) for i in np.argsort(-lens, kind="stable")]
    flags = np.broadcast_to(np.asarray(causal, bool), lens.shape)
    out = []
    for wave in waves:
        groups = []
        for replicas, ranks in wave:
            ids = [order[r] for r in ranks]
            groups.append(
                CPGroup(
                    replicas=replicas,
                    degree=len(replicas),
                    sequence_ids=tuple(ids),
                    seqlens=tuple(int(lens[i]) for i in ids),
                    causal=tuple(bool(flags[i]) for i in ids),
                    predicted_time=1.0,
                )
            )
        out.append(Wave(groups=tuple(groups)))
    return Plan(
        num_replicas=cluster.num_replicas,
        waves=tuple(out),
        predicted_time=2.0,
        lower_bound=0.0,
        strategy="explicit",
        winner="explicit",
    ).with_digest()


def explicit_planner(seqlens: Any, cluster: Any, cost: Any, *, causal: Any = True, **_: Any) -> Any:
    """The fixed mixed-degree plan of WAVES (sequences found by length rank)."""
    return plan_of_waves(WAVES, len(SAMPLES), seqlens, cluster, cost, causal=causal)


def make_loader(index: Path, tok_path: Path, replicas: int, replica: int) -> Any:
    from fcp_data.loader import FCPDataLoader, LoaderOptions
    from fcp_data.planner import Cluster, CostModel
    from fcp_data.readers import LengthIndex
    from fcp_data.vision import VisionOptions

    # "constant" + "spatial": the conventions transformers' own get_rope_index reproduces
    opts = VisionOptions(second_per_grid="constant", next_text="spatial", tokens_per_second=2)
    return FCPDataLoader(
        LengthIndex.open(index),
        cluster=Cluster(replicas, tokens_per_replica=4096),
        cost=CostModel.from_model("qwen3-1.7b", "cpu"),
        replica=replica,
        global_batch_size=len(SAMPLES),
        num_workers=0,
        tokenizer=load_tokenizer(tok_path),
        options=LoaderOptions(vision=opts, planner=explicit_planner if replicas > 1 else None),
    )


def tiny_config(tok_path: Path) -> Any:
    """A Qwen2.5-VL config: 2 decoder layers, a 2-block ViT (window block + full block), fp32."""
    from transformers import Qwen2_5_VLConfig

    tok = load_tokenizer(tok_path)
    ids = {n: tok.token_to_id(n) for n in ("<|vision_start|>", "<|video_pad|>", "<|image_pad|>")}
    return Qwen2_5_VLConfig(
        text_config=dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=512,
            max_position_embeddings=4096,
            rope_scaling={"type": "mrope", "mrope_section": [2, 1, 1]},
            attention_dropout=0.0,
            bos_token_id=0,
            eos_token_id=0,
        ),
        vision_config=dict(
            depth=2,
            hidden_size=16,
            intermediate_size=32,
            num_heads=2,
            out_hidden_size=32,
            tokens_per_second=2,
            window_size=56,  # 2x2 merged tokens per window: the window blocks really cut
            fullatt_block_indexes=[1],
        ),
        vision_start_token_id=ids["<|vision_start|>"],
        video_token_id=ids["<|video_pad|>"],
        image_token_id=ids["<|image_pad|>"],
        bos_token_id=0,
        eos_token_id=0,
        attn_implementation="sdpa",
    )


def make_model(tok_path: Path, state: Path | None = None, seed: int = 0) -> Any:
    from transformers import Qwen2_5_VLForConditionalGeneration

    torch.manual_seed(seed)
    model = Qwen2_5_VLForConditionalGeneration(tiny_config(tok_path)).float()
    if state is not None:
        model.load_state_dict(torch.load(state, weights_only=True))
    return model


def token_loss(logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum of per-token cross-entropy over the loss mask (ignored labels clamped to 0)."""
    ce = torch.nn.functional.cross_entropy(logits, labels.clamp(min=0), reduction="none")
    return (ce * mask).sum()


def reference(index: Path, tok_path: Path, state: Path) -> tuple[float, dict[str, torch.Tensor]]:
    """One process, every sample unsharded: HF's own forward (vision tower over all frames,
    get_rope_index, masked scatter), one sample at a time (per-sample attention)."""
    model = make_model(tok_path, state)
    (mb,) = list(make_loader(index, tok_path, 1, 0))  # degree 1: whole samples, whole media
    total = torch.zeros(())
    cu_p, cu = mb.cu_seqlens_padded.tolist(), mb.cu_seqlens.tolist()
    runs = mb.vision_runs.tolist()
    rows = torch.cat([torch.zeros(1, dtype=torch.int64), mb.grid_thw.prod(1).cumsum(0)])
    cfg = model.config
    for j in range(len(mb.keys)):
        a, n = cu_p[j], cu[j + 1] - cu[j]
        ids = mb.tokens[a : a + n]
        types = torch.zeros_like(ids)
        types[ids == cfg.image_token_id] = 1
        types[ids == cfg.video_token_id] = 2
        kw: dict[str, Any] = {}
        for r, (seq, kind, _first, _count) in enumerate(runs):
            if seq != j:
                continue
            px, grid = mb.pixel_values[rows[r] : rows[r + 1]], mb.grid_thw[r : r + 1]
            if kind == 2:
                kw.update(pixel_values_videos=px, video_grid_thw=grid,
                          second_per_grid_ts=torch.tensor([1.0]))  # fmt: skip
            else:
                kw.update(pixel_values=px, image_grid_thw=grid)
        logits = model(input_ids=ids[None], mm_token_type_ids=types[None], **kw).logits[0]
        total = total + token_loss(logits, mb.labels[a : a + n], mb.loss_mask[a : a + n])
    loss = total / mb.global_num_loss_tokens
    loss.backward()
    return float(loss.detach()), {n: p.grad.clone() for n, p in model.named_parameters()}


def run_micro_batch(model: Any, mb: Any, cp: Any, tower: Any = None) -> torch.Tensor:
    """fcp forward of one micro-batch: embeddings, encode-what-you-hold, HF decoder, loss."""
    from fcp_exec.hf import hf_attention_kwargs, hf_position_ids
    from fcp_exec.vision import encode_and_scatter

    lm = model.model.language_model
    embeds = lm.embed_tokens(mb.tokens)
    embeds = encode_and_scatter(tower or model.model.visual, mb, embeds, group=cp.group)
    hidden = lm(
        inputs_embeds=embeds[None], position_ids=hf_position_ids(mb), **hf_attention_kwargs(mb, cp)
    ).last_hidden_state
    loss = token_loss(model.lm_head(hidden)[0], mb.labels, mb.loss_mask)
    return loss / mb.global_num_loss_tokens


def _expect_error(
    model: Any, mb: Any, cp: Any, what: str, tower: Any = None, key: str = "v0"
) -> None:
    """Every member of the group raises, naming the sample key (nobody hangs in the ring)."""
    from fcp_exec.vision import VisionScatterError

    try:
        run_micro_batch(model, mb, cp, tower)
    except VisionScatterError as e:
        assert f"sample {key}" in str(e) and what in str(e), str(e)
    else:
        raise AssertionError(f"no error for {what}")


def bad_input_checks(model: Any, mbs: list[Any], cache: Any, rank: int) -> None:
    """Wave 0: ranks 0-2 hold v0 at degree 3; one member's payload or tower is broken."""
    import dataclasses

    mb = mbs[0]
    if rank == 3:  # the degree-1 replica of wave 0: a local check, no collective
        from fcp_exec.vision import run_keys

        assert mb.rank_plan.degree == 1 and mb.vision_scatter.numel() > 0
        bad = dataclasses.replace(mb, pixel_values=mb.pixel_values[:-1])
        with cp_context_for(mb, cache) as cp:
            _expect_error(model, bad, cp, "pixel_values has", key=run_keys(mb)[0])
        return
    assert mb.rank_plan.degree == 3 and mb.vision_scatter.numel() > 0
    cases = [
        ("pixel_values has", dataclasses.replace(mb, pixel_values=mb.pixel_values[:-1]), None),
        ("vision_scatter has", dataclasses.replace(mb, vision_scatter=mb.vision_scatter[1:]), None),
        ("hidden size 31", mb, lambda px, grid_thw: model.model.visual(px, grid_thw=grid_thw)
         .pooler_output[:, :31]),
    ]  # fmt: skip
    for what, bad_mb, tower in cases:
        broken = rank == 1  # only one member is broken; all of them must raise
        with cp_context_for(mb, cache) as cp:
            _expect_error(model, bad_mb if broken else mb, cp, what, tower if broken else None)


def cp_context_for(mb: Any, cache: Any) -> Any:
    from fcp_exec import cp_context

    return cp_context(mb.rank_plan, groups=cache, wave_groups=mb.wave_groups)


def fcp_worker(rank: int, world: int, index: str, tok_path: str, state: str, out: str) -> None:
    """One replica: encode what it holds, ring attention via the registered HF implementation."""
    import torch.distributed as dist

    from fcp_exec import CPGroupCache, ReplicaRanks, all_reduce_gradients
    from fcp_exec.hf import register_attention

    model = make_model(Path(tok_path), Path(state))
    model.set_attn_implementation({"text_config": register_attention()})
    cache = CPGroupCache(ReplicaRanks(world_size=world))
    loss_sum = torch.zeros(())
    stats = torch.zeros(3, dtype=torch.int64)  # units encoded, partial units, waves with d > 1
    mbs = list(make_loader(Path(index), Path(tok_path), world, rank))
    for mb in mbs:
        with cp_context_for(mb, cache) as cp:
            if mb.is_empty:
                continue
            loss = run_micro_batch(model, mb, cp)
            loss.backward()
            loss_sum += loss.detach()
            stats += torch.tensor([mb.vision_units, mb.vision_partial_units, cp.degree > 1])
    all_reduce_gradients(model)
    dist.all_reduce(loss_sum)
    dist.all_reduce(stats)
    if rank == 0:
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        torch.save({"loss": float(loss_sum), "grads": grads, "stats": stats.tolist()}, out)
    bad_input_checks(model, mbs, cache, rank)
