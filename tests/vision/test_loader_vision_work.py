"""The loader hands the planner the batch's vision work when the cost model prices an encoder."""

from __future__ import annotations

from typing import Any

import numpy as np
from vision_helpers import png, video_sample, write_shards

from fcp_data.loader import FCPDataLoader, LoaderOptions
from fcp_data.planner import Cluster, CostModel, VisionWork, plan_global_batch
from fcp_data.readers import build_index
from fcp_data.readers.scan import ScanConfig
from fcp_data.vision import VisionOptions, vision_work_from_index


class Spy:
    """A planner that records what it was given and plans with fcp's own."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(self, seqlens: Any, cluster: Any, cost: Any, **kw: Any) -> Any:
        self.calls.append({"seqlens": np.asarray(seqlens), **kw})
        return plan_global_batch(seqlens, cluster, cost, **kw)


def _loader(index, tok, cost, spy) -> FCPDataLoader:
    return FCPDataLoader(
        index, cluster=Cluster(2, tokens_per_replica=4096), cost=cost, replica=0,
        global_batch_size=3, num_workers=0, tokenizer=tok,
        options=LoaderOptions(vision=VisionOptions(), planner=spy),
    )  # fmt: skip


def test_vision_work_reaches_the_planner_only_with_a_vision_cost(tmp_path, tok) -> None:
    samples = [
        video_sample("v0", 40, 96, 64, 10, seed=0),
        {"__key__": "i0", "png": png(90, 140, 1), "txt": b"a cat on a mat"},
        {"__key__": "t0", "txt": b"the cat sits on the mat"},
    ]
    url = write_shards(tmp_path / "s.tar", samples)
    index = build_index(url, tmp_path / "idx", config=ScanConfig(vision_rule="qwen2.5-vl"),
                        counter=tok)  # fmt: skip
    spy = Spy()
    list(_loader(index, tok, CostModel.from_model("qwen3-vl-2b", "cpu"), spy))
    (call,) = spy.calls
    work = call["vision"]
    assert isinstance(work, VisionWork)
    # the same samples, in the batch's order: match them by length to the index
    order = [int(np.flatnonzero(index.seqlens == n)[0]) for n in call["seqlens"]]
    want = vision_work_from_index(index, np.asarray(order))
    np.testing.assert_array_equal(work.units, want.units)
    assert int(work.units.sum()) > 0 and set(work.units[np.asarray(order) == 2]) == {0}
    spy = Spy()
    list(_loader(index, tok, CostModel.from_model("qwen3-1.7b", "cpu"), spy))
    assert "vision" not in spy.calls[0]
