"""The loader's vision path end to end: real index, real tokenizer, every replica's micro-batch."""

from __future__ import annotations

import numpy as np
import pytest
from vision_helpers import png, video_sample, write_shards

from fcp_data.collate import IGNORE_INDEX
from fcp_data.loader import FCPDataLoader, LoaderOptions
from fcp_data.planner import Cluster, CostModel
from fcp_data.readers import build_index
from fcp_data.readers.scan import ScanConfig
from fcp_data.vision import SpecialTokenIds, VisionOptions


@pytest.fixture(scope="module")
def cost() -> CostModel:
    return CostModel.from_model("qwen3-1.7b", "cpu")


def _index(tmp_path, tok, rule, samples):
    url = write_shards(tmp_path / f"{rule}.tar", samples)
    over = {"num_frames": 6} if rule == "internvl" else {}
    cfg = ScanConfig(vision_rule=rule, rule_overrides=over, on_error="raise")
    return build_index(url, tmp_path / f"idx-{rule}", config=cfg, counter=tok)


def _run(index, tok, cost, replicas, cap, **opts):
    out = []
    for r in range(replicas):
        ld = FCPDataLoader(
            index,
            cluster=Cluster(replicas, tokens_per_replica=cap),
            cost=cost,
            replica=r,
            global_batch_size=len(index.seqlens),
            num_workers=0,
            tokenizer=tok,
            options=LoaderOptions(**{"vision": VisionOptions(), **opts}),
        )
        out.append(list(ld))
    return out


@pytest.mark.parametrize("rule", ["qwen2.5-vl", "qwen3-vl", "internvl"])
def test_every_replica_gets_a_consistent_payload(tmp_path, tok, cost, rule) -> None:
    samples = [
        video_sample("v0", 40, 96, 64, 10, seed=0),
        {"__key__": "i0", "png": png(90, 140, 1), "txt": b"a cat on a mat"},
        {"__key__": "t0", "txt": b"the cat sits on the mat and looks at the camera"},
    ]
    index = _index(tmp_path, tok, rule, samples)
    ids = SpecialTokenIds.from_tokenizer(tok, rule)
    pads = [ids[r] for r in ids.ids if r.endswith(("pad", "context"))]
    template = list(ids.ids.values())
    cap = int(index.seqlens.max()) // 2 + 64  # the video needs both replicas
    per_replica = _run(index, tok, cost, 2, cap)
    split, loss = False, 0
    for waves in zip(*per_replica):
        for mb in waves:
            loss += mb.num_loss_tokens
            if mb.rank_plan.is_empty:
                continue
            split |= mb.rank_plan.degree > 1
            held_pads = np.isin(mb.tokens.numpy(), pads)
            kept = mb.vision_scatter[mb.vision_scatter >= 0]
            assert kept.numel() == int(held_pads.sum())  # count check
            assert len(set(kept.tolist())) == kept.numel() and held_pads[kept.numpy()].all()
            t, h, w = mb.grid_thw.T
            assert mb.vision_scatter.numel() == int((t * h * w).sum()) // 4
            n_rows = mb.pixel_values.shape[0]
            assert n_rows == (int((t * h * w).sum()) if rule != "internvl" else int(t.sum()))
            # loss on text only: no label is a template or vision token
            labels = mb.labels[mb.labels != IGNORE_INDEX].numpy()
            assert not np.isin(labels, template).any()
            if rule == "internvl":
                assert mb.mrope_position_ids is None
            else:
                assert mb.mrope_position_ids.shape == (3, mb.num_tokens)
    # the count known from the index alone equals the loss tokens the replicas hold
    assert loss == per_replica[0][0].global_num_loss_tokens
    assert split, "no sample was split over replicas: vacuous"


def test_spawned_worker_yields_the_same_payload(tmp_path, tok, cost) -> None:
    """Encoder, tokenizer, token ids and options pickle into a spawned DataLoader worker."""
    import torch

    samples = [
        video_sample("v0", 40, 96, 64, 10, seed=0),
        {"__key__": "i0", "png": png(90, 140, 1), "txt": b"a cat"},
    ]
    index = _index(tmp_path, tok, "qwen2.5-vl", samples)
    outs = []
    for workers in (0, 1):
        ld = FCPDataLoader(
            index,
            cluster=Cluster(2, tokens_per_replica=int(index.seqlens.max()) // 2 + 64),
            cost=cost,
            replica=1,
            global_batch_size=2,
            num_workers=workers,
            tokenizer=tok,
            options=LoaderOptions(vision=VisionOptions(), multiprocessing_context="spawn"),
        )
        outs.append(list(ld))
    assert len(outs[0]) == len(outs[1]) > 0
    for a, b in zip(*outs):
        for name in ("tokens", "labels", "pixel_values", "grid_thw", "vision_scatter"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name
        assert torch.equal(a.mrope_position_ids, b.mrope_position_ids)


def test_loss_on_template_counts_timestamp_text(tmp_path, tok, cost) -> None:
    samples = [video_sample("v0", 40, 96, 64, 10, seed=0)]
    index = _index(tmp_path, tok, "qwen3-vl", samples)
    cap = int(index.seqlens.max()) // 2 + 64
    counts = []
    for on in (False, True):
        runs = _run(index, tok, cost, 2, cap, vision=VisionOptions(loss_on_template=on))
        mbs = [mb for mbs in runs for mb in mbs]
        local = sum(mb.num_loss_tokens for mb in mbs)
        assert local == mbs[0].global_num_loss_tokens  # exact from the index either way
        counts.append(local)
    from fcp_data.vision.families import get_rule

    vt = get_rule("qwen3-vl").video(num_frames=40, fps=10.0, height=64, width=96)
    stamps = [v for k, v in vt.parts if k == "text"]
    assert len(stamps) == vt.grid[0] == 4 and stamps[0] == "<0.3 seconds>"
    # the timestamp texts join the loss; the first opens the sequence (never predicted)
    n_ts = sum(len(tok.encode(t, add_special_tokens=False).ids) for t in stamps)
    assert counts[1] - counts[0] == n_ts - 1
