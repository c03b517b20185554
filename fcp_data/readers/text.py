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
tokenizer files, any callable str -> ids, or a spec string as `fcp index --tokenizer` takes it:
`bytes:R` (`BytesTokenizer`: exactly the ceil(bytes / R) ids the estimate counts, a stand-in
that needs no file) and `py:module:callable`. Ids never include special tokens (no BOS/EOS):
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
from ..optional import require

__all__ = [
    "BYTES_VOCAB",
    "DEFAULT_BYTES_PER_TOKEN",
    "BytesTokenizer",
    "CallableCounter",
    "RatioCounter",
    "TokenCounter",
    "Tokenizer",
    "as_counter",
    "as_tokenizer",
    "calibrate_ratio",
    "load_counter",
    "self_contained",
    "tokenizer_label",
]

DEFAULT_BYTES_PER_TOKEN = 4.0
BYTES_VOCAB = 501  # `BytesTokenizer` ids are 1..500: 0 stays free for padding / EOD
_SPEC_KINDS = ("bytes", "py", "hf")  # spec prefixes; anything else names a file or directory
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


def _ratio(spec: str) -> float:
    """R of a `bytes:R` spec; ConfigError naming the spec when R is no number > 0."""
    rest = spec.partition(":")[2]
    try:
        ratio = float(rest)
    except ValueError:
        ratio = math.nan
    if not (math.isfinite(ratio) and ratio > 0):
        raise ConfigError(
            f"tokenizer spec {spec!r}: R must be a number of utf-8 bytes per token > 0, e.g. "
            "bytes:4 (the default)"
        )
    return ratio


@dataclass(frozen=True, slots=True)
class BytesTokenizer:
    """`bytes:R` as a tokenizer: exactly ceil(utf-8 bytes / R) ids, the count `RatioCounter`
    recorded, so an index built with the default `bytes:4` loads with no tokenizer file.

    Token k covers bytes [floor(k R), floor((k + 1) R)) and its id is 1 + v mod 500, where v
    is those bytes as a little-endian integer (folded every 8 bytes): ids 1..500 (`BYTES_VOCAB`
    = 501), 0 left free for padding and EOD. For R = 4 that is `1 + uint32 % 500` of each
    4-byte word, the stand-in the README's loop wrote by hand. R must be >= 1 (a token of less
    than a byte has no bytes of its own). A stand-in for smoke tests and demos, not a language
    model's tokenizer: index with the model's tokenizer.json to train on real ids.
    """

    bytes_per_token: float = DEFAULT_BYTES_PER_TOKEN

    def __post_init__(self) -> None:
        ok = isinstance(self.bytes_per_token, (int, float)) and not isinstance(
            self.bytes_per_token, bool
        )
        if not (ok and math.isfinite(self.bytes_per_token) and self.bytes_per_token >= 1):
            raise ConfigError(
                f"bytes:{self.bytes_per_token} as a tokenizer: R must be >= 1 utf-8 byte per "
                "token (a token of less than a byte has no bytes of its own); index with "
                "bytes:4 or the model's tokenizer.json, or pass tokenizer= to the loader"
            )

    @property
    def spec(self) -> str:
        return f"bytes:{self.bytes_per_token:g}"

    @property
    def vocab_size(self) -> int:
        return BYTES_VOCAB

    def __call__(self, text: str) -> np.ndarray:
        raw = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
        n, r = raw.shape[0], self.bytes_per_token
        m = math.ceil(n / r)
        if m == 0:
            return np.zeros(0, dtype=np.int64)
        starts = np.floor(np.arange(m, dtype=np.float64) * r).astype(np.int64)
        owner = np.repeat(np.arange(m), np.diff(np.append(starts, n)))
        shift = (np.arange(n, dtype=np.int64) - starts[owner]) % 8 * 8  # 256^j wraps past 8
        words = raw.astype(np.uint64) << shift.astype(np.uint64)
        value = np.add.reduceat(words, starts)  # R >= 1: every token has >= 1 byte
        return (1 + value % np.uint64(BYTES_VOCAB - 1)).astype(np.int64)


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
    """A `tokenizers.Tokenizer`: ids of `encode(text, add_special_tokens=False)`. `source` is
    the absolute path of the file it was loaded from ("" for an object handed in), so an
    identity mismatch can name the files, not only their hashes."""

    def __init__(self, tokenizer: Any, source: str = "") -> None:
        self.tokenizer, self.source = tokenizer, source
        body = json.loads(tokenizer.to_str())
        self.spec = f"hf:sha256={_digest({k: body.get(k) for k in _ID_KEYS})}"

    def __call__(self, text: str) -> np.ndarray:
        return np.asarray(self.tokenizer.encode(text, add_special_tokens=False).ids, np.int64)


class TransformersTokenizer:
    """A transformers tokenizer: a fast one runs its `tokenizers` backend (same ids, same
    spec as that backend), a slow one `encode(text, add_special_tokens=False)`."""

    def __init__(self, tokenizer: Any, source: str = "") -> None:
        self.source = source
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


def _missing(path: Path) -> ConfigError:
    """The error for a tokenizer spec naming a file or directory that is not there."""
    where = "" if path.is_absolute() else f" (relative to the working directory {Path.cwd()})"
    return ConfigError(
        f"tokenizer file {str(path)!r} does not exist{where}; pass an existing tokenizer.json, "
        "a directory with tokenizer files, bytes:R (e.g. bytes:4) or py:module:callable"
    )


def _load_path(path: Path) -> Tokenizer:
    """A local tokenizer.json, or a directory with tokenizer.json or transformers files."""
    if not path.exists():
        raise _missing(path)
    file = path / "tokenizer.json" if path.is_dir() else path
    if file.is_file():
        hf = require("tokenizers", f"the tokenizer {str(path)!r}")
        try:
            return HFTokenizer(hf.Tokenizer.from_file(str(file)), source=str(file.resolve()))
        except Exception as exc:  # the Rust loader raises a bare Exception on a bad file
            raise ConfigError(f"{file} is not a tokenizers JSON file: {exc}") from exc
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:
        raise MissingDependencyError(
            f"{path} has no tokenizer.json; loading its tokenizer files needs `transformers`: "
            "pip install transformers"
        ) from exc
    loaded = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    return TransformersTokenizer(loaded, source=str(path.resolve()))


def _py_callable(spec: str) -> Callable[..., Any]:
    """The callable a `py:module:attr` spec names; ConfigError naming the spec otherwise."""
    module, _, attr = spec[3:].partition(":")
    try:
        fn = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(f"tokenizer spec {spec!r}: cannot import {module}:{attr}") from exc
    if not callable(fn):
        raise ConfigError(f"tokenizer spec {spec!r}: {module}:{attr} is not callable")
    return fn


def as_tokenizer(obj: Any) -> Tokenizer:
    """A Tokenizer (ids + spec) from a tokenizers.Tokenizer, a transformers tokenizer, a spec
    string as `fcp index --tokenizer` takes it (a local tokenizer.json or directory, "hf:PATH",
    "bytes:R", "py:module:callable"), an object with `.encode`, or a callable."""
    if isinstance(
        obj,
        (HFTokenizer, TransformersTokenizer, _EncodeTokenizer, _CallableTokenizer, BytesTokenizer),
    ):
        return obj
    if isinstance(obj, RatioCounter):
        return BytesTokenizer(obj.bytes_per_token)
    if isinstance(obj, (str, Path)):
        text = str(obj)
        if isinstance(obj, str) and text.startswith("bytes:"):
            return BytesTokenizer(_ratio(text))
        if isinstance(obj, str) and text.startswith("py:"):
            tok = _CallableTokenizer(_py_callable(text))
            tok.spec = text  # what the index recorded for it
            return tok
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
    if isinstance(obj, BytesTokenizer):  # counts as its spec does (vision templates included)
        return RatioCounter(obj.bytes_per_token)
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
    kind = spec.partition(":")[0]
    if kind == "bytes":
        return RatioCounter(_ratio(spec))
    if kind == "py":
        return CallableCounter(_py_callable(spec), spec=spec)
    path = Path(spec[3:] if kind == "hf" else spec)
    if not path.exists():  # was "spec not understood": a typo'd path is named as missing
        raise _missing(path)
    return CallableCounter(as_tokenizer(spec))


def self_contained(spec: str) -> bool:
    """True for a spec whose ids need no file (`bytes:R`, R >= 1): a loader over an index
    counted with it builds its own tokenizer when given none."""
    if not spec.startswith("bytes:"):
        return False
    try:
        return _ratio(spec) >= 1
    except ConfigError:
        return False


def tokenizer_label(obj: Any, spec: str | None = None) -> str:
    """How an error names a tokenizer: its file and identity ("/x/tokenizer.json
    (hf:sha256=...)"), or the identity alone when it was not loaded from a file."""
    spec = spec if spec is not None else str(getattr(obj, "spec", "") or "")
    inner = getattr(obj, "fn", obj)  # a CallableCounter's tokenizer
    source = getattr(obj, "source", "") or getattr(inner, "source", "")
    if source:
        return f"{source} ({spec})"
    if obj is not None and not isinstance(obj, (str, RatioCounter, BytesTokenizer)):
        what = type(getattr(inner, "tokenizer", inner)).__name__
        return f"{spec!r} (a {what} object, not a file)"
    return repr(spec)


def calibrate_ratio(texts: Iterable[str], tokenize: Callable[[str], Sequence[int]]) -> float:
    """Measured bytes per token of `texts` under `tokenize`: total bytes / total tokens."""
    nbytes = ntok = 0
    for t in texts:
        nbytes += len(t.encode("utf-8"))
        ntok += len(tokenize(t))
    if ntok == 0:
        raise ConfigError("calibration texts produced no tokens; pass non-empty texts")
    return nbytes / ntok
