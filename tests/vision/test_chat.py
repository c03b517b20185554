"""Chat-style samples: ChatML around the media, loss on the chosen roles, counts from the index."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_loader_vision import _run
from vision_helpers import video_sample, write_shards

from fcp_data.collate import IGNORE_INDEX
from fcp_data.loader.global_batch import SampleReadError
from fcp_data.planner import CostModel
from fcp_data.readers import build_index
from fcp_data.readers.scan import ScanConfig
from fcp_data.vision import VisionOptions

TURNS = [
    {"from": "human", "value": "Look: <video>\nWhat happens?"},
    {"from": "gpt", "value": "A cat walks on a mat."},
    {"role": "user", "content": "And then?"},
    {"role": "assistant", "content": "It sits."},
]


@pytest.fixture(scope="module")
def cost() -> CostModel:
    return CostModel.from_model("qwen3-1.7b", "cpu")


def test_chat_sample_loss_on_assistant_turns_only(tmp_path, tok, cost) -> None:
    s = video_sample("chat", 40, 96, 64, 10, seed=0)
    meta = json.loads(s["json"])
    meta["conversations"] = TURNS
    s["json"] = json.dumps(meta).encode()
    url = write_shards(tmp_path / "chat.tar", [s])
    cfg = ScanConfig(vision_rule="qwen2.5-vl", caption_field="conversations", on_error="raise")
    index = build_index(url, tmp_path / "idx", config=cfg, counter=tok)
    cap = int(index.seqlens.max()) // 2 + 64
    opts = {"caption_field": "conversations"}
    with pytest.raises(SampleReadError, match=r"'chat'.*VisionOptions\(chat=True\)"):
        _run(index, tok, cost, 2, cap, **opts)
    vision = VisionOptions(chat=True)
    per_replica = _run(index, tok, cost, 2, cap, vision=vision, **opts)
    mbs = [mb for mbs in per_replica for mb in mbs if not mb.rank_plan.is_empty]
    assert {mb.rank_plan.degree for mb in mbs} == {2}
    # the whole sequence, reassembled from the two zigzag shards by global position
    L = int(index.seqlens[0])
    tokens = np.empty(L, dtype=np.int64)
    labels = np.full(L, IGNORE_INDEX, dtype=np.int64)
    for mb in mbs:
        real = mb.position_ids < L
        tokens[mb.position_ids[real]] = mb.tokens[real]
        labels[mb.position_ids[real]] = mb.labels[real]
    ids = lambda t: tok.encode(t, add_special_tokens=False).ids  # noqa: E731
    head = ids("<|im_start|>user\n") + ids("Look: ")
    assert tokens[: len(head)].tolist() == head  # the media sits inside the user turn
    assert tokens[len(head)] == tok.token_to_id("<|vision_start|>")
    want = ids("A cat walks on a mat.") + ids("<|im_end|>\n")
    want += ids("It sits.") + ids("<|im_end|>\n") + [0]  # end-of-document id (eod_id 0)
    assert labels[labels != IGNORE_INDEX].tolist() == want  # loss on assistant text only
    assert sum(mb.num_loss_tokens for mb in mbs) == mbs[0].global_num_loss_tokens == len(want)
    # user turns in the loss too when asked
    both = _run(
        index,
        tok,
        cost,
        2,
        cap,
        vision=VisionOptions(chat=True, chat_loss_roles=("user", "assistant")),
        **opts,
    )
    n = sum(mb.num_loss_tokens for mbs in both for mb in mbs)
    assert n == both[0][0].global_num_loss_tokens > len(want)
