"""Shared pieces of the vision tests: a real byte-level BPE tokenizer with the families' special
tokens (built offline, Qwen2-style pre-tokenizer), shards with video, image and text samples."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np

SPECIALS = [
    "<|endoftext|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|video_pad|>",
    "<|image_pad|>",
    "<img>",
    "</img>",
    "<IMG_CONTEXT>",
]
# Qwen2's pre-tokenizer split: digits one by one, letters with an optional leading symbol
QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
CORPUS = [
    "a cat sits on the mat and looks at the camera",
    "<0.5 seconds> <12.3 seconds> Frame-1: Frame-12: the video shows a red car",
    "captions describe what happens in each clip of the video",
] * 20


def make_tokenizer(specials: list[str] | None = None) -> Any:
    """A tokenizers.Tokenizer: byte-level BPE (vocab 400) + the special tokens as added tokens."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=SPECIALS if specials is None else specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    return tok


class HFCounter:
    """A picklable TokenCounter-like callable over a tokenizers.Tokenizer (index building)."""

    spec = "hf:test-bpe"

    def __init__(self, tok: Any) -> None:
        self.tok = tok

    def __call__(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids


def png(h: int, w: int, seed: int, mode: str = "RGB") -> bytes:
    from PIL import Image

    rng = np.random.default_rng(seed)
    im = Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8))
    buf = io.BytesIO()
    if mode == "CMYK":
        im.convert("CMYK").save(buf, format="JPEG", quality=95)
    elif mode == "I;16":
        Image.fromarray(rng.integers(0, 65535, (h, w), dtype=np.uint16)).save(buf, format="PNG")
    elif mode == "P":
        im.convert("P").save(buf, format="PNG")
    else:
        im.save(buf, format="PNG")
    return buf.getvalue()


def write_shards(path: Path, samples: list[dict[str, Any]]) -> str:
    from webdataset import TarWriter

    url = str(path)
    with TarWriter(url) as w:
        for s in samples:
            w.write(s)
    return url


def video_sample(key: str, frames: int, w: int, h: int, fps: int, seed: int, **side: Any) -> dict:
    from fcp_data.readers.synth import encode_video

    meta = {"num_frames": frames, "fps": fps, "width": w, "height": h, **side}
    return {
        "__key__": key,
        "mp4": encode_video(frames, w, h, fps, seed=seed),
        "json": json.dumps({**meta, "caption": f"the video {key} shows a cat"}).encode(),
    }


def qwen_vl_utils_vision_process() -> Any:
    """qwen-vl-utils' `vision_process` module, for its pure functions (smart_nframes,
    smart_resize) as an oracle.

    qwen_vl_utils imports torchvision at module level, which has no build for this CPU torch;
    an empty stand-in is put in sys.modules for the import only, then the previous entries are
    restored.
    """
    import sys
    import types

    stub = types.ModuleType("torchvision")
    stub.io = types.ModuleType("torchvision.io")
    stub.transforms = types.ModuleType("torchvision.transforms")
    stub.transforms.InterpolationMode = object
    saved = {k: sys.modules.get(k) for k in ("torchvision", "torchvision.transforms")}
    sys.modules.update({"torchvision": stub, "torchvision.transforms": stub.transforms})
    try:
        import qwen_vl_utils.vision_process as vp
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    return vp
