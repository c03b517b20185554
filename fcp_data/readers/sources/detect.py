"""Which reader a shard needs, and what a directory holds: format detection by name.

A shard's format is decided by its name, never guessed from a partial read at load time:
`.tar` (and any name fcp does not know, after a content check at expansion) is a WebDataset
tar; `.jsonl` / `.ndjson` (optionally `.gz` or `.zst`) JSON Lines; `.parquet` Parquet;
`.arrow` an Arrow IPC stream file as `datasets.Dataset.save_to_disk` writes it; `.bin` / `.idx`
a megatron indexed dataset (the `.bin` is the shard, the `.idx` beside it its lengths). A local
file whose name says nothing is read for 512 bytes at expansion: a tar header keeps it, anything
else is refused naming the file and the formats fcp reads (it used to be indexed as an empty tar
with exit status 0).

Inside a directory, files that are not data (a tokenizer.json, tokenizer_config.json, a README,
a config.yaml, a vocab.txt) are skipped and counted (`SkippedFile`, recorded in the index
header and printed by `fcp index`): a model folder often holds its data beside its tokenizer,
and a tokenizer.json there used to stop indexing with "name it *.jsonl". Data under a wrong
name is still refused by name (Parquet, Arrow or megatron magic bytes, or JSON Lines content:
two JSON objects on two lines), since skipping it would silently shrink the corpus.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ...errors import ConfigError
from ..errors import SkippedFile
from ..remote import is_remote
from .format import CorpusFormat
from .registry import fallback, format_for, formats, match, prefix_shard, readable

__all__ = [
    "UnreadableSourceError",
    "check_remote",
    "expand_local",
    "hf_data_files",
    "refuse",
]

# files a dataset directory commonly carries beside its data: skipped when a directory is
# expanded (a file named on the command line is never skipped)
_NOT_DATA = ("readme", "license", "licence", "changelog", "citation")
_NOT_DATA_EXT = (".md", ".txt.md", ".rst", ".yaml", ".yml", ".py", ".sh", ".lock")


class UnreadableSourceError(ConfigError):
    """A local file no reader of fcp can read; the message names it and the readable formats."""


def check_remote(url: str) -> None:
    """ConfigError for a remote URL whose format has no byte-range access (or breaks a rule
    of its own format)."""
    fmt = format_for(url)
    if not is_remote(url):
        return
    if fmt.check_remote is not None:
        fmt.check_remote(url)
    if not fmt.byte_range:
        remote = ", ".join("/".join(f.suffixes) for f in _byte_range())
        raise ConfigError(
            f"{url}: {fmt.name} shards are read locally only (a {fmt.name} sample is not a byte "
            f"range fcp can fetch and verify); copy the files locally. Remote shards fcp reads: "
            f"{remote}"
        )


def _byte_range() -> list[CorpusFormat]:
    return [f for f in formats() if f.byte_range]


def _sniff(path: str) -> tuple[CorpusFormat | None, str]:
    """The format whose `magic` the first 512 bytes of an unnamed local file show, and its
    rename hint; (None, why) when none does (for the error message)."""
    try:
        with open(path, "rb") as f:
            head = f.read(512)
    except OSError as exc:
        return None, f"cannot be read ({exc})"
    for fmt in formats():
        if fmt.magic is not None and fmt.magic(head):
            return fmt, fmt.hint
    return None, "no format fcp reads"


def refuse(path: str, why: str) -> UnreadableSourceError:
    """The error for local file `path` no reader can read, naming why and what fcp reads."""
    return UnreadableSourceError(f"cannot read {path}: {why}. fcp reads {readable()}")


def _hf_state(path: Path) -> dict | None:
    state = path / "state.json"
    if not (state.is_file() and (path / "dataset_info.json").is_file()):
        return None
    try:
        obj = json.loads(state.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise refuse(str(state), f"a HF datasets state.json that does not parse ({exc})") from exc
    return obj if isinstance(obj, dict) and isinstance(obj.get("_data_files"), list) else None


def _inside(name: str) -> bool:
    """True when `name`, a path from a dataset's metadata, stays inside the dataset's folder:
    relative, no `..` step, no NUL (checked by its words, not by resolving links, so a folder
    whose files are links into a cache still reads)."""
    if not name or "\0" in name or os.path.isabs(name):
        return False
    parts = name.replace("\\", "/").split("/")
    return ".." not in parts and not (len(parts[0]) == 2 and parts[0][1] == ":")


def hf_data_files(path: str | os.PathLike[str]) -> list[str] | None:
    """The data-*.arrow files of a `Dataset.save_to_disk` directory in the dataset's order
    (state.json's `_data_files`), or None when `path` is not one."""
    root = Path(path)
    state = _hf_state(root)
    if state is None:
        return None
    files = []
    for entry in state["_data_files"]:
        name = entry.get("filename") if isinstance(entry, dict) else None
        if isinstance(name, str) and not _inside(name):
            raise refuse(
                str(root / "state.json"),
                f"it lists a data file {name!r} outside the dataset folder {root} (a path "
                "inside a dataset's own metadata must stay in its folder: a plain file name "
                "such as 'data-00000-of-00001.arrow'); fix state.json or re-save the dataset",
            )
        if not isinstance(name, str) or not (root / name).is_file():
            raise refuse(str(root / "state.json"), f"it lists a data file {name!r} that is missing")
        files.append(str(root / name))
    if not files:
        raise refuse(str(root), "a HF datasets directory whose state.json lists no data file")
    return files


def _dataset_dict(root: Path) -> None:
    meta = root / "dataset_dict.json"
    if meta.is_file():
        try:
            splits = json.loads(meta.read_text(encoding="utf-8")).get("splits", [])
        except (OSError, ValueError, AttributeError):
            splits = []
        raise ConfigError(
            f"{root} is a HF DatasetDict (splits {', '.join(map(str, splits)) or '?'}): fcp "
            f"indexes one split at a time; pass {root / (str(splits[0]) if splits else 'SPLIT')}"
        )


def _skippable(name: str) -> bool:
    """Skipped by name alone, never counted: dot files and a HF dataset's own metadata."""
    low = name.lower()
    return low.startswith(".") or low in ("dataset_info.json", "state.json", "dataset_dict.json")


def _not_data_by_name(name: str) -> str:
    """Why a file is not data by its name alone ("" when the name does not say)."""
    low = name.lower()
    if low.split(".", 1)[0] in _NOT_DATA:
        return "a README/LICENSE-style file"
    if low.endswith(_NOT_DATA_EXT):
        return f"a {low.rsplit('.', 1)[-1]} file (documentation, config or code)"
    return ""


def _in_directory(path: str) -> tuple[str, str]:
    """(shard, "") for a data file found inside a directory, or ("", why it is not data).

    Raises for data fcp could read under another name (Parquet / Arrow / megatron magic, JSON
    Lines content), for a megatron half without its pair and for a compressed tar."""
    name = os.path.basename(path)
    why = _not_data_by_name(name)
    if why:
        return "", why
    if match(path) is not None or not os.path.isfile(path):
        return _check_file(path), ""
    fmt, why = _sniff(path)
    if fmt is fallback():  # a tar named for no format (a compressed one is refused later)
        return path, ""
    if fmt is None:
        return "", f"not a format fcp reads ({readable()})"
    not_data = fmt.confirm(path) if fmt.confirm is not None else ""
    if not_data:  # JSON that is not JSON Lines: a config or tokenizer file
        return "", not_data
    raise refuse(path, why)  # Parquet, Arrow, a megatron .idx, JSON Lines: a wrong name


def _walk(root: Path, out: list[str], skipped: list[SkippedFile]) -> None:
    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        path = Path(entry.path)
        if entry.is_dir():
            if entry.name.startswith(".") or (path / "seqlens.npy").is_file():
                continue  # .git, .cache, a length index written beside the data: never data
            files = hf_data_files(path)
            if files is not None:
                out.extend(files)
            else:
                _dataset_dict(path)
                _walk(path, out, skipped)
        elif not _skippable(entry.name):
            shard, why = _in_directory(str(path))
            if shard:
                out.append(shard)
            else:
                skipped.append(SkippedFile(str(path), why))


def _check_file(path: str) -> str:
    """`path` as the shard to index (its format's `resolve_local`: a megatron .idx becomes its
    .bin); raises when unreadable."""
    fmt = match(path)
    if fmt is not None and fmt.resolve_local is not None:
        return fmt.resolve_local(path)
    if fmt is not None or not os.path.isfile(path):
        return path  # named for its format (a FIFO is a tar stream)
    fmt, why = _sniff(path)
    if fmt is not fallback():
        raise refuse(path, why)
    return path


def expand_local(path: str, skipped: list[SkippedFile] | None = None) -> list[str]:
    """The shards of a local path: a file (checked), a megatron prefix (its .bin), a HF
    save_to_disk directory (its data files), or any other directory (its files, recursively,
    sorted by name; dot files skipped, files that are not data appended to `skipped`). Raises
    UnreadableSourceError for a file fcp cannot read and ConfigError for a directory holding
    no shard."""
    prefix = prefix_shard(path)
    if prefix:
        return [prefix]
    if not os.path.isdir(path):
        return [_check_file(path)]
    root = Path(path)
    files = hf_data_files(root)
    if files is not None:
        return files
    _dataset_dict(root)
    out: list[str] = []
    left: list[SkippedFile] = []
    _walk(root, out, left)
    if not out:
        shown = "; ".join(f"{f.path}: {f.reason}" for f in left[:3])
        raise ConfigError(
            f"directory {path} holds no file to index"
            + (f" ({len(left)} skipped as not data: {shown})" if left else "")
            + f"; fcp reads {readable()}"
        )
    if skipped is not None:
        skipped.extend(left)
    return list(dict.fromkeys(out))
