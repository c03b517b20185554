"""Worker hand-off: one buffer per micro-batch, same values; a token store travels to workers."""

from __future__ import annotations

import io
import pickle
from pathlib import Path

import numpy as np
import torch
from datapath_helpers import fields, loader

from fcp_data.collate import MicroBatch
from fcp_data.loader.handoff import one_buffer
from fcp_data.readers import build_index
from fcp_data.readers.text import load_counter


class _CountingPickler(pickle.Pickler):
    def __init__(self, fh: io.BytesIO) -> None:
        super().__init__(fh)
        self.tensors = 0

    def persistent_id(self, obj: object) -> None:
        self.tensors += isinstance(obj, torch.Tensor)


def test_one_buffer_pickles_one_tensor_and_rebuilds_equal_views(
    tmp_path: Path, text_shards, bpe_file, cost
) -> None:
    idx = build_index(text_shards[:2], tmp_path / "i", counter=load_counter(str(bpe_file)))
    mb = next(iter(loader(idx, 2, 1, cost, store=False, tokenizer=str(bpe_file), cap=1 << 15)))
    assert isinstance(mb, MicroBatch)
    sent = one_buffer(mb)
    plain, counted = _CountingPickler(io.BytesIO()), _CountingPickler(io.BytesIO())
    plain.dump(mb)
    counted.dump(sent)
    assert plain.tensors == 8 and counted.tensors == 1  # the 8 THD tensors become 1 buffer
    one = pickle.loads(pickle.dumps(sent))
    assert isinstance(one, MicroBatch)
    a, b = fields(mb), fields(one)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    tensors = [one.tokens, one.labels, one.loss_mask, one.position_ids, one.cu_seqlens]
    assert len({t.untyped_storage().data_ptr() for t in tensors}) == 1
    assert one.loss_mask.dtype == torch.float32 and one.cu_seqlens.dtype == torch.int32


def test_workers_with_a_token_store_deliver_what_the_main_process_does(
    tmp_path: Path, text_shards, bpe_file, cost
) -> None:
    idx = build_index(
        text_shards, tmp_path / "i", counter=load_counter(str(bpe_file)), store_tokens=True
    )
    cap = int(idx.seqlens.max()) // 3 + 64
    for r in (0, 2):
        inline = [fields(mb) for mb in loader(idx, 3, r, cost, store=True, tokenizer=None, cap=cap)]
        ld = loader(idx, 3, r, cost, store=True, tokenizer=None, cap=cap)
        ld.num_workers = 2  # spawned/forked workers reopen the index and the store by path
        got = [fields(mb) for mb in ld]
        assert len(inline) == len(got) > 1
        for x, y in zip(inline, got):
            for k in x:
                np.testing.assert_array_equal(x[k], y[k], err_msg=f"{k} replica {r}")
