"""HF `datasets.Dataset.save_to_disk` directories as a source, read with pyarrow alone.

`datasets` is only the oracle that writes the directory (dataset_info.json, state.json,
data-*.arrow) and reads it back; fcp's reader must not import it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from sources_helpers import (
    assert_same_batches,
    corpus,
    epoch_fields,
    make_loader,
    train_bpe,
    write_tar,
)

from fcp_data.errors import ConfigError
from fcp_data.readers import LengthIndex, build_index
from fcp_data.readers.scan import ScanConfig

datasets = pytest.importorskip("datasets")
pytest.importorskip("pyarrow")

TEXTS = corpus(30, seed=21)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("src-hf")


@pytest.fixture(scope="module")
def bpe(root: Path) -> str:
    return str(train_bpe(root / "bpe.json", TEXTS))


@pytest.fixture(scope="module")
def saved(root: Path) -> Path:
    ds = datasets.Dataset.from_dict({"text": TEXTS, "n": list(range(len(TEXTS)))})
    out = root / "saved"
    ds.save_to_disk(str(out), num_shards=3)  # three data-*.arrow files
    return out


def test_save_to_disk_matches_datasets_and_the_tar_oracle(
    root: Path, bpe: str, saved: Path
) -> None:
    index = build_index(str(saved), root / "i", config=ScanConfig(tokenizer=bpe))
    assert [s.format for s in index.header.shards] == ["arrow"] * 3
    back = datasets.load_from_disk(str(saved))
    assert [index.read(i)["txt"].decode() for i in range(len(index))] == back["text"]
    tar = write_tar(root / "oracle.tar", [{"txt": t} for t in TEXTS])
    tar_index = build_index(tar, root / "i-tar", config=ScanConfig(tokenizer=bpe))
    np.testing.assert_array_equal(index.seqlens, tar_index.seqlens)
    for r in range(2):
        assert_same_batches(
            epoch_fields(make_loader(LengthIndex.open(root / "i"), bpe, replica=r)),
            epoch_fields(make_loader(tar_index, bpe, replica=r)),
        )


def test_reading_does_not_import_datasets(root: Path, bpe: str, saved: Path) -> None:
    build_index(str(saved), root / "i-noimp", config=ScanConfig(tokenizer=bpe))
    code = (
        "import sys; from fcp_data.readers import LengthIndex, build_index;"
        f"build_index({str(saved)!r}, {str(root / 'i-sub')!r});"
        f"i = LengthIndex.open({str(root / 'i-noimp')!r}); i.read(0);"
        "assert 'datasets' not in sys.modules, 'datasets was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_dataset_dict_and_missing_column_are_named(root: Path, saved: Path) -> None:
    dd = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"text": ["a"]}),
            "test": datasets.Dataset.from_dict({"text": ["b"]}),
        }
    )
    dd.save_to_disk(str(root / "dd"))
    with pytest.raises(ConfigError, match=r"DatasetDict \(splits .*train.*\).*pass .*dd/"):
        build_index(str(root / "dd"), root / "i-dd")
    train = build_index(str(root / "dd" / "train"), root / "i-train")
    assert len(train) == 1
    with pytest.raises(ConfigError, match=r"no column 'body'; its columns are \['text', 'n'\]"):
        build_index(str(saved), root / "i-col", config=ScanConfig(text_field="body"))
