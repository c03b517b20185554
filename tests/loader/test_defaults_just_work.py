"""Defaults that just work: the loader takes every tokenizer spec `fcp index` takes, an index
counted with the self-contained default (`bytes:4`) loads with no tokenizer at all, a mismatch
names both tokenizer files, and `len(loader)` says why it has no value.

Real parts: tar shards written by webdataset's TarWriter, indexes built by the `fcp index`
command line, a byte-level BPE trained by the `tokenizers` library. The ids of `bytes:4` are
checked against an independent computation (each 4-byte little-endian word, 1 + word % 500,
the stand-in the README's loop wrote by hand), not against fcp's own tokenizer.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from loader_helpers import reassemble, write_text_shards

from fcp.cli import main
from fcp_data.errors import IndexMismatchError
from fcp_data.loader import FCPDataLoader, LoaderOptions
from fcp_data.planner import Cluster
from fcp_data.readers import LengthIndex

EOD = 501
N = 3


def _words4(text: str) -> np.ndarray:
    """The oracle for `bytes:4` ids: 4 utf-8 bytes a token, zero-padded, 1 + word % 500."""
    raw = text.encode("utf-8")
    return 1 + np.frombuffer(raw + b"\0" * (-len(raw) % 4), dtype="<u4").astype(np.int64) % 500


def _bpe(path: Path, texts: list[str], vocab: int) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.save(str(path))
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str], dict[str, bytes]]:
    root = tmp_path_factory.mktemp("defaults")
    urls, data = write_text_shards(root, 30, per_shard=15, seed=3, max_bytes=2400)
    return root, urls, data


@pytest.fixture(scope="module")
def plain_index(corpus) -> Path:
    """A plain `fcp index`: no --tokenizer, so the default bytes:4."""
    root, urls, _ = corpus
    assert main(["index", *urls, "-o", str(root / "plain")]) == 0
    return root / "plain"


def _loader(source, replica: int, cost, **kw) -> FCPDataLoader:
    index = LengthIndex.open(source) if not isinstance(source, LengthIndex) else source
    cap = int(index.seqlens.max()) // N + 64  # the longest sample needs every replica
    return FCPDataLoader(
        source,
        cluster=Cluster(N, tokens_per_replica=cap),
        cost=cost,
        replica=replica,
        global_batch_size=10,
        num_workers=0,
        options=LoaderOptions(eod_id=EOD),
        **kw,
    )


def test_a_plain_index_loads_without_a_tokenizer(plain_index, corpus, cost) -> None:
    """Was: ConfigError "the sample holds text but the loader has no tokenizer=" at once."""
    _, _, data = corpus
    index = LengthIndex.open(plain_index)
    assert index.header.tokenizer == "bytes:4"
    mbs = [mb for r in range(N) for mb in _loader(plain_index, r, cost)]
    toks, _, seen = reassemble(mbs)
    assert sorted(toks) == list(range(len(index)))  # one epoch: every sample once
    assert max(mb.rank_plan.degree for mb in mbs) > 1  # sequences really split over replicas
    for sid, got in toks.items():
        n = int(index.seqlens[sid])
        want = np.concatenate([_words4(data[str(index.keys[sid])].decode()), [EOD]])
        assert n == len(want)  # the count the index planned with is the ids' count
        np.testing.assert_array_equal(got[:n], want)
        assert (seen[sid][:n] == 1).all()


def test_the_loader_takes_every_spec_fcp_index_takes(plain_index, corpus, cost) -> None:
    """bytes:R by name (was refused: "tokenizer 'bytes:4' does not exist ... bytes:R"), a
    py:module:callable, and a tokenizer.json path with its recorded hash checked."""
    root, urls, _ = corpus
    base = [mb.tokens.numpy() for mb in _loader(plain_index, 0, cost)]
    by_name = [mb.tokens.numpy() for mb in _loader(plain_index, 0, cost, tokenizer="bytes:4")]
    assert len(base) == len(by_name) > 0
    for a, b in zip(base, by_name):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(IndexMismatchError, match=r"'bytes:4'.*'bytes:3'"):
        _loader(plain_index, 0, cost, tokenizer="bytes:3")
    # py:module:callable, as `fcp index --tokenizer py:...` records it
    assert main(["index", *urls, "-o", str(root / "py"), "--tokenizer", "py:shlex:split"]) == 0
    with pytest.raises(IndexMismatchError, match="py:shlex:split"):
        _loader(root / "py", 0, cost, tokenizer="py:json:dumps")
    ld = _loader(root / "py", 0, cost, tokenizer="py:shlex:split")
    assert ld._builder.encoder.tokenizer.spec == "py:shlex:split"
    # a tokenizer.json path: the index's hash is checked against the file's
    texts = [p.decode() for p in corpus[2].values()]
    bpe = _bpe(root / "bpe.json", texts, 400)
    argv = ["index", *urls, "-o", str(root / "bpe"), "--tokenizer", str(bpe), "--no-store"]
    assert main(argv) == 0
    got = [mb for mb in _loader(root / "bpe", 0, cost, tokenizer=str(bpe))]
    assert sum(mb.num_tokens for mb in got) > 0


def test_a_tokenizer_mismatch_names_both_files(corpus, cost, tmp_path) -> None:
    """Was: "built with tokenizer 'hf:sha256=...' but the loader has 'hf:sha256=...'"."""
    _, urls, data = corpus
    texts = [p.decode() for p in data.values()]
    a, b = _bpe(tmp_path / "a.json", texts, 400), _bpe(tmp_path / "b.json", texts, 300)
    assert main(["index", *urls, "-o", str(tmp_path / "idx"), "--tokenizer", str(a)]) == 0
    assert LengthIndex.open(tmp_path / "idx").header.tokenizer_file == str(a.resolve())
    with pytest.raises(IndexMismatchError) as err:
        _loader(tmp_path / "idx", 0, cost, tokenizer=str(b))
    msg = str(err.value)
    assert str(a.resolve()) in msg and str(b.resolve()) in msg
    assert msg.count("hf:sha256=") == 2  # and both identities


def test_without_a_tokenizer_the_error_names_the_indexs_file(corpus, cost, tmp_path) -> None:
    _, urls, data = corpus
    bpe = _bpe(tmp_path / "tok.json", [p.decode() for p in data.values()], 400)
    argv = ["index", *urls[:1], "-o", str(tmp_path / "idx"), "--tokenizer", str(bpe), "--no-store"]
    assert main(argv) == 0
    ld = _loader(tmp_path / "idx", 0, cost)
    with pytest.raises(Exception, match=rf"no tokenizer=.*tokenizer='{bpe.resolve()}'"):
        next(iter(ld))


def test_len_says_why_it_has_no_value_and_what_to_use(plain_index, cost) -> None:
    """Was: TypeError "object of type 'FCPDataLoader' has no len()", naming nothing."""
    ld = _loader(plain_index, 1, cost)
    with pytest.raises(TypeError, match=r"unknowable.*loader\.num_batches"):
        len(ld)
    mbs = list(ld)  # list() reads the TypeError as "no length hint": iteration is unharmed
    assert sum(mb.is_last_wave for mb in mbs) == ld.num_batches == 3
    assert len(mbs) >= ld.num_batches
