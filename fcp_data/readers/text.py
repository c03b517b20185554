"""Text tokens: counting them for the index, turning text into ids for the loader.

The planner needs a length per sample before tokenization happens in the collator, so counting
must be cheap. Counters (`as_counter`, `load_counter`):

* `RatioCounter`: ceil(utf-8 bytes / ratio). The default `bytes:4` is an ESTIMATE, not a count:
  4 bytes per token is the commonly quoted rule of thumb for English under GPT/Llama-style BPE
  (OpenAI's tokenizer help page: "one token generally corresponds to ~4 characters of common
  English text"). Code usually tokenizes denser (roughly 3-3.5 bytes/token under Llama-family
  vocabularies), and a 10% bias in the ratio moves every memory estimate the planner makes by
  10%. Index with the real tokenizer, or measure your corpus with `calibrate_ratio`.
* any `Tokenizer` (below): the exact count, len(ids).
* `CallableCounter`: any callable str -> sequence of ids (len of the result) or -> int.

Tokenizers (`as_tokenizer`): an HF `tokenizers.Tokenizer`, a transformers tokenizer
(`PreTrainedTokenizerBase`, fast or slow), a local tokenizer.json or a directory holding
tokenizer files, or any callable str -> ids. Ids never include special tokens (no BOS/EOS):
the index's `special_tokens` and the loader's `eod_id` add those. Every tokenizer has a `spec`
that the index header records and the loader checks; for HF tokenizers it is a content hash of
what decides the ids (tokenizer.json's normalizer, pre-tokenizer, model and added tokens, or a
slow tokenizer's vocabulary), so the same tokenizer loaded from a file, wrapped by transformers
or copied elsewhere has one identity, and a retrained one has another.

Counters and tokenizers are plain picklable objects so that process-pool and DataLoader workers
can use them.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import math
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ..errors import ConfigError, MissingDependencyError
from .optional import require

__all__ = [
    "DEFAULT_BYTES_PER_TOKEN",
    "CallableCounter",
    "RatioCounter",
    "TokenCounter",
    "Tokenizer",
    "as_counter",
    "as_tokenizer",
    "calibrate_ratio",
    "load_counter",
]

DEFAULT_BYTES_PER_TOKEN = 4.0
_ID_KEYS = ("normalizer", "pre_tokenizer", "model", "added_tokens")  # what decides the ids


@runtime_checkable
class Tokenizer(Protocol):
    """text -> token ids (no special tokens); `spec` names it in an index header."""

    spec: str

    def __call__(self, text: str) -> Sequence[int]: ...


class TokenCounter:
    """Counts tokens of a text. `spec` identifies the counter in an index header."""

    spec: str = ""

    def count(self, text: str) -> int:  # pragma: no cover - interface
        raise NotImplementedError

    def __call__(self, text: str) -> int:
        return self.count(text)


@dataclass(frozen=True, slots=True)
class RatioCounter(TokenCounter):
    """ceil(len(text.encode()) / bytes_per_token); 0 only for empty text. An estimate."""

    bytes_per_token: float = DEFAULT_BYTES_PER_TOKEN

    def __post_init__(self) -> None:
        if not self.bytes_per_token > 0:
            raise ConfigError(f"bytes_per_token={self.bytes_per_token} must be > 0 (e.g. 4.0)")

    @property
    def spec(self) -> str:  # type: ignore[override]
        return f"bytes:{self.bytes_per_token:g}"

    def count(self, text: str) -> int:
        return math.ceil(len(text.encode("utf-8")) / self.bytes_per_token)


class CallableCounter(TokenCounter):
    """Wraps `fn(text)` returning token ids (counted by len) or an int count."""

    def __init__(self, fn: Callable[[str], Sequence[int] | int], spec: str = "") -> None:
        self.fn = fn
        self.spec = spec or getattr(fn, "spec", "") or _callable_spec(fn)

    def count(self, text: str) -> int:
        out = self.fn(text)
        return int(out) if isinstance(out, (int, np.integer)) else len(out)


def _callable_spec(fn: object) -> str:
    name = getattr(fn, "__qualname__", type(fn).__qualname__)
    return f"callable:{getattr(fn, '__module__', type(fn).__module__)}:{name}"


def _digest(obj: object) -> str:
    raw = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()[:16]


class HFTokenizer:
    """A `tokenizers.Tokenizer`: ids of `encode(text, add_special_tokens=False)`."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        body = json.loads(tokenizer.to_str())
        self.spec = f"hf:sha256={_digest({k: body.get(k) for k in _ID_KEYS})}"

    def __call__(self, text: str) -> np.ndarray:
        return np.asarray(self.tokenizer.encode(text, add_special_tokens=False).ids, np.int64)


class TransformersTokenizer:
    """A transformers tokenizer: a fast one runs its `tokenizers` backend (same ids, same
    spec as that backend), a slow one `encode(text, add_special_tokens=False)`."""

    def __init__(self, tokenizer: Any) -> None:
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self.fast = HFTokenizer(backend) if backend is not None else None
        self.tokenizer = None if backend is not None else tokenizer
        if self.fast is not None:
            self.spec = self.fast.spec
        else:
            vocab = sorted(tokenizer.get_vocab().items())
            self.spec = f"hf:sha256={_digest([type(tokenizer).__qualname__, vocab])}"

    def __call__(self, text: str) -> np.ndarray:
        if self.fast is not None:
            return self.fast(text)
        return np.asarray(self.tokenizer.encode(text, add_special_tokens=False), np.int64)


class _EncodeTokenizer:
    """An object with `.encode(text)` returning ids or an Encoding with `.ids`."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.spec = getattr(tokenizer, "spec", "") or f"object:{_callable_spec(tokenizer)[9:]}"

    def __call__(self, text: str) -> np.ndarray:
        try:
            out = self.tokenizer.encode(text, add_special_tokens=False)
        except TypeError:  # encode() without that keyword
            out = self.tokenizer.encode(text)
        return np.asarray(getattr(out, "ids", out), np.int64)


class _CallableTokenizer:
    def __init__(self, fn: Callable[[str], Sequence[int]]) -> None:
        self.fn = fn
        self.spec = getattr(fn, "spec", "") or _callable_spec(fn)

    def __call__(self, text: str) -> Sequence[int]:
        return self.fn(text)


def _instance_of(obj: object, module: str, name: str) -> bool:
    """isinstance against a class of an optional package, without importing the package (an
    object of that class exists only if its module was imported already)."""
    mod = sys.modules.get(module)
    try:  # transformers resolves attributes lazily: that import may fail in a broken install
        cls = getattr(mod, name, None) if mod is not None else None
    except (ImportError, RuntimeError):
        return False
    return isinstance(cls, type) and isinstance(obj, cls)


def _load_path(path: Path) -> Tokenizer:
    """A local tokenizer.json, or a directory with tokenizer.json or transformers files."""
    if not path.exists():
        raise ConfigError(
            f"tokenizer {str(path)!r} does not exist; pass a local tokenizer.json, a directory "
            "with tokenizer files, bytes:R or py:module:callable"
        )
    file = path / "tokenizer.json" if path.is_dir() else path
    if file.is_file():
        hf = require("tokenizers", f"the tokenizer {str(path)!r}")
        try:
            return HFTokenizer(hf.Tokenizer.from_file(str(file)))
        except Exception as exc:  # the Rust loader raises a bare Exception on a bad file
            raise ConfigError(f"{file} is not a tokenizers JSON file: {exc}") from exc
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:
        raise MissingDependencyError(
            f"{path} has no tokenizer.json; loading its tokenizer files needs `transformers`: "
            "pip install transformers"
        ) from exc
    return TransformersTokenizer(AutoTokenizer.from_pretrained(str(path), local_files_only=True))


def as_tokenizer(obj: Any) -> Tokenizer:
    """A Tokenizer (ids + spec) from a tokenizers.Tokenizer, a transformers tokenizer, a local
    path (tokenizer.json or a directory), "hf:PATH", an object with `.encode`, or a callable."""
    if isinstance(obj, (HFTokenizer, TransformersTokenizer, _EncodeTokenizer, _CallableTokenizer)):
        return obj
    if isinstance(obj, (str, Path)):
        text = str(obj)
        return _load_path(Path(text[3:] if text.startswith("hf:") else text))
    if _instance_of(obj, "tokenizers", "Tokenizer"):
        return HFTokenizer(obj)
    if _instance_of(obj, "transformers", "PreTrainedTokenizerBase"):
        return TransformersTokenizer(obj)  # before callable(): tok(text) returns a dict
    if hasattr(obj, "encode") and not callable(obj):
        return _EncodeTokenizer(obj)
    if callable(obj):
        return _CallableTokenizer(obj)
    raise ConfigError(
        f"cannot tokenize with a {type(obj).__name__}; pass a tokenizers.Tokenizer, a "
        "transformers tokenizer, a tokenizer.json path or a callable str -> ids"
    )


def as_counter(obj: Any) -> TokenCounter:
    """A TokenCounter from a spec string, a TokenCounter, a tokenizer (see `as_tokenizer`) or a
    callable str -> ids / int."""
    if obj is None or isinstance(obj, str):
        return load_counter(obj)
    if isinstance(obj, TokenCounter):
        return obj
    if callable(obj) and not _instance_of(obj, "transformers", "PreTrainedTokenizerBase"):
        return CallableCounter(obj)
    try:
        return CallableCounter(as_tokenizer(obj))
    except ConfigError:
        raise ConfigError(
            f"cannot count tokens with a {type(obj).__name__}; pass a spec string (bytes:4, a "
            "tokenizer.json path), a tokenizer or a callable"
        ) from None


def load_counter(spec: str | None) -> TokenCounter:
    """Counter from a spec: None or "bytes:R", a local tokenizer.json or tokenizer directory
    (optionally "hf:PATH"), or "py:module:attr" (a callable str -> ids or int)."""
    if spec is None or spec == "":
        return RatioCounter()
    kind, _, rest = spec.partition(":")
    if kind == "bytes":
        try:
            return RatioCounter(float(rest))
        except ValueError as exc:
            raise ConfigError(
                f"tokenizer spec {spec!r}: ratio must be a number, e.g. bytes:4"
            ) from exc
    if kind == "py":
        module, _, attr = rest.partition(":")
        try:
            fn = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"tokenizer spec {spec!r}: cannot import {module}:{attr}") from exc
        return CallableCounter(fn, spec=spec)
    if kind == "hf" or Path(spec).exists():
        return CallableCounter(as_tokenizer(spec))
    raise ConfigError(
        f"tokenizer spec {spec!r} not understood; use bytes:R, a local tokenizer.json or "
        "tokenizer directory, hf:PATH or py:module:callable"
    )


def calibrate_ratio(texts: Iterable[str], tokenize: Callable[[str], Sequence[int]]) -> float:
    """Measured bytes per token of `texts` under `tokenize`: total bytes / total tokens."""
    nbytes = ntok = 0
    for t in texts:
        nbytes += len(t.encode("utf-8"))
        ntok += len(tokenize(t))
    if ntok == 0:
        raise ConfigError("calibration texts produced no tokens; pass non-empty texts")
    return nbytes / ntok
