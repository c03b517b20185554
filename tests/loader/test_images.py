"""Image samples: placeholder layout, pixels decoded (resized by the rule) by their owners."""

from __future__ import annotations

import io

import numpy as np
from loader_helpers import ByteTokenizer, reassemble

from fcp_data.loader import FCPDataLoader, LoaderOptions
from fcp_data.planner import Cluster

EOD, SPECIAL, VISION = 300, 301, 302


def _png(h: int, w: int, seed: int) -> bytes:
    from PIL import Image

    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def test_image_samples_collate_with_pixels(tmp_path, cost) -> None:
    from webdataset import TarWriter

    from fcp_data.readers import build_index
    from fcp_data.readers.text import CallableCounter
    from fcp_data.vision.families import get_rule

    url = str(tmp_path / "img.tar")
    sizes = [(64, 96), (200, 120), (480, 640), (32, 32), (300, 900), (128, 128)]
    with TarWriter(url) as w:
        for i, (h, wd) in enumerate(sizes):
            w.write({"__key__": f"i{i}", "png": _png(h, wd, i), "txt": f"picture {i}".encode()})
            w.write({"__key__": f"t{i}", "txt": ("words " * (20 * i + 3)).encode()})
    index = build_index(
        url, tmp_path / "index", counter=CallableCounter(ByteTokenizer(), spec=ByteTokenizer.spec)
    )
    rule = get_rule(index.header.rule["name"])
    cap = int(index.seqlens.max()) // 2 + 16  # the largest image needs both replicas
    mbs, pixels_for = [], {}
    for r in range(2):
        ld = FCPDataLoader(
            index,
            cluster=Cluster(2, tokens_per_replica=cap),
            cost=cost,
            replica=r,
            global_batch_size=6,
            num_workers=0,
            tokenizer=ByteTokenizer(),
            vision_rule=rule,
            options=LoaderOptions(eod_id=EOD, special_token_id=SPECIAL, vision_token_id=VISION),
        )
        for mb in ld:
            mbs.append(mb)
            for vi in mb.vision:
                assert (mb.tokens[vi.token_positions] == VISION).all()
                pixels_for.setdefault(vi.sample_id, []).append(vi.pixels)
    toks, _, seen = reassemble(mbs)
    images = [i for i in range(len(index)) if int(index.modality[i]) == 2]
    assert len(images) == len(sizes) and sorted(toks) == list(range(len(index)))
    for i in images:
        vt = rule.image(height=int(index.height[i]), width=int(index.width[i]))
        assert (seen[i][: int(index.seqlens[i])] == 1).all()
        L = int(index.seqlens[i])
        t = toks[i][:L]
        assert (t[: vt.special] == SPECIAL).all() and (
            t[vt.special : vt.special + vt.vision] == VISION
        ).all()
        for px in pixels_for[i]:  # every owner decoded the whole image at the rule's size
            assert px.shape == (1, *vt.resized, 3) and str(px.dtype) == "torch.uint8"
    assert any(len(v) == 2 for v in pixels_for.values()), "no image was split: vacuous"
