"""Real HF tokenizers end to end: `fcp index --tokenizer`, the header's identity, the loader.

A tiny byte-level BPE and a WordLevel tokenizer are trained offline with the `tokenizers`
library on a few strings; transformers' PreTrainedTokenizerFast wraps the BPE one. The oracle
for ids is the tokenizers library itself (`encode(text, add_special_tokens=False).ids`): the
index must count exactly those, and the loader must emit exactly those (+ EOD).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from loader_helpers import reassemble
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from fcp.cli import main
from fcp_data.errors import ConfigError, IndexMismatchError
from fcp_data.loader import FCPDataLoader, LoaderOptions
from fcp_data.planner import Cluster
from fcp_data.readers import LengthIndex, make_shards
from fcp_data.readers.text import as_counter, as_tokenizer

EOD = 7
CORPUS = ["def f(x):\n    return x + 1", "the quick brown fox", "import os, sys"] * 5


def _bpe(extra: tuple[str, ...] = ()) -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["[UNK]", "<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS + list(extra), trainer=trainer)
    return tok


def _wordlevel() -> Tokenizer:
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(special_tokens=["[UNK]"], show_progress=False)
    tok.train_from_iterator(CORPUS, trainer=trainer)
    return tok


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tok")
    _bpe().save(str(root / "bpe.json"))
    _wordlevel().save(str(root / "word.json"))
    fast = PreTrainedTokenizerFast(tokenizer_object=_bpe(), eos_token="<eos>")
    fast.save_pretrained(str(root / "bpe-dir"))
    shards = make_shards(root / "shards", text=14, seed=3, samples_per_shard=8)
    return {"root": root, "shards": shards[0].parent}


def test_every_form_of_one_tokenizer_has_one_identity(files: dict[str, Path]) -> None:
    raw = Tokenizer.from_file(str(files["root"] / "bpe.json"))
    forms = [
        raw,
        str(files["root"] / "bpe.json"),
        f"hf:{files['root'] / 'bpe.json'}",
        files["root"] / "bpe-dir",  # tokenizer.json inside
        PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<eos>"),
        AutoTokenizer.from_pretrained(str(files["root"] / "bpe-dir"), local_files_only=True),
    ]
    toks = [as_tokenizer(f) for f in forms]
    assert len({t.spec for t in toks}) == 1 and toks[0].spec.startswith("hf:sha256=")
    text = "héllo wörld, the fox!\n\tdef g(): pass"
    want = raw.encode(text, add_special_tokens=False).ids
    for t in toks:
        assert list(t(text)) == want
        assert as_counter(t)(text) == len(want)
    assert as_counter(forms[-1])(text) == len(want)  # not len() of a BatchEncoding
    other = {as_tokenizer(_wordlevel()).spec, as_tokenizer(_bpe(("zzz qqq",))).spec}
    assert toks[0].spec not in other and len(other) == 2


def test_bad_tokenizer_paths_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        as_tokenizer(str(tmp_path / "nope.json"))
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ConfigError, match="not a tokenizers JSON"):
        as_tokenizer(str(tmp_path / "bad.json"))
    with pytest.raises(ConfigError, match="cannot tokenize"):
        as_tokenizer(42)


def _texts(index: LengthIndex) -> list[str]:
    out = []
    for i in range(len(index)):
        s = index.read(i)
        out.append(s["txt"].decode() if "txt" in s else json.loads(s["json"])["text"])
    return out


@pytest.fixture(scope="module")
def bpe_index(files: dict[str, Path]) -> Path:
    """`fcp index --tokenizer bpe.json` over real text shards."""
    out = files["root"] / "index-bpe"
    args = ["index", f"{files['shards']}/*.tar", "-o", str(out)]
    assert main([*args, "--tokenizer", str(files["root"] / "bpe.json")]) == 0
    return out


def test_index_counts_and_loader_emits_the_same_ids(files, bpe_index: Path, cost) -> None:
    out, tok_json = bpe_index, files["root"] / "bpe.json"
    index = LengthIndex.open(out)
    raw = Tokenizer.from_file(str(tok_json))
    assert index.header.tokenizer == as_tokenizer(raw).spec
    ids = [raw.encode(t, add_special_tokens=False).ids for t in _texts(index)]
    assert [len(x) for x in ids] == list(index.text_tokens)
    fast = AutoTokenizer.from_pretrained(str(files["root"] / "bpe-dir"), local_files_only=True)
    cap = int(index.seqlens.max()) // 2 + 64
    loaders = [
        FCPDataLoader(
            out,
            cluster=Cluster(2, tokens_per_replica=cap),
            cost=cost,
            replica=r,
            global_batch_size=len(index),
            num_workers=0,
            tokenizer=fast,
            options=LoaderOptions(eod_id=EOD),
        )
        for r in range(2)
    ]
    toks, _, _ = reassemble([mb for ld in loaders for mb in ld])
    assert sorted(toks) == list(range(len(index)))
    for sid, padded in toks.items():
        want = ids[sid] + [EOD] * int(index.special_tokens[sid])
        assert len(want) == int(index.seqlens[sid])
        np.testing.assert_array_equal(padded[: len(want)], want)


def test_loader_refuses_another_tokenizer_naming_both(files, bpe_index: Path, cost) -> None:
    out = bpe_index
    have = LengthIndex.open(out).header.tokenizer
    word = Tokenizer.from_file(str(files["root"] / "word.json"))
    want = as_tokenizer(word).spec
    for tok in (word, str(files["root"] / "word.json")):
        with pytest.raises(IndexMismatchError) as err:
            FCPDataLoader(
                out,
                cluster=Cluster(2, tokens_per_replica=4096),
                cost=cost,
                replica=0,
                global_batch_size=4,
                num_workers=0,
                tokenizer=tok,
            )
        assert have in str(err.value) and want in str(err.value)
