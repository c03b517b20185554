"""Text token counting: exact with a tokenizer, or a calibrated bytes-per-token ratio.

The planner needs a length per sample before tokenization happens in the collator, so counting
must be cheap. Three counters:

* `RatioCounter`: ceil(utf-8 bytes / ratio). `DEFAULT_BYTES_PER_TOKEN = 4.0` is the commonly
  quoted rule of thumb for English under GPT/Llama-style BPE (OpenAI's tokenizer help page: "one
  token generally corresponds to ~4 characters of common English text"). It was NOT measured
  here (no BPE tokenizer ships with fcp's dependencies); code usually tokenizes denser (roughly
  3-3.5 bytes/token under Llama-family vocabularies), so for a real run measure your corpus with
  `calibrate_ratio(texts, tokenizer)` and pass `bytes:R`: a 10% bias in the ratio moves every
  memory estimate the planner makes by 10%.
* `CallableCounter`: any callable str -> sequence of ids (len of the result) or -> int.
* a Hugging Face `tokenizers.Tokenizer` loaded from tokenizer.json when that package is
  installed (`load_counter("hf:PATH")`).

Counters are plain picklable objects so that process-pool workers can use them; a spec string
(`load_counter`) is what the CLI and index header record.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DEFAULT_BYTES_PER_TOKEN",
    "CallableCounter",
    "HFTokenizerCounter",
    "RatioCounter",
    "TokenCounter",
    "as_counter",
    "calibrate_ratio",
    "load_counter",
]

DEFAULT_BYTES_PER_TOKEN = 4.0


class TokenCounter:
    """Counts tokens of a text. `spec` identifies the counter in an index header."""

    spec: str = ""

    def count(self, text: str) -> int:  # pragma: no cover - interface
        raise NotImplementedError

    def __call__(self, text: str) -> int:
        return self.count(text)


@dataclass(frozen=True, slots=True)
class RatioCounter(TokenCounter):
    """ceil(len(text.encode()) / bytes_per_token); 0 only for empty text."""

    bytes_per_token: float = DEFAULT_BYTES_PER_TOKEN

    def __post_init__(self) -> None:
        if not self.bytes_per_token > 0:
            raise ValueError(f"bytes_per_token={self.bytes_per_token} must be > 0 (e.g. 4.0)")

    @property
    def spec(self) -> str:  # type: ignore[override]
        return f"bytes:{self.bytes_per_token:g}"

    def count(self, text: str) -> int:
        return math.ceil(len(text.encode("utf-8")) / self.bytes_per_token)


class CallableCounter(TokenCounter):
    """Wraps `fn(text)` returning token ids (counted by len) or an int count."""

    def __init__(self, fn: Callable[[str], Sequence[int] | int], spec: str = "") -> None:
        self.fn = fn
        self.spec = (
            spec
            or f"callable:{getattr(fn, '__module__', '?')}:"
            f"{getattr(fn, '__qualname__', type(fn).__name__)}"
        )

    def count(self, text: str) -> int:
        out = self.fn(text)
        return int(out) if isinstance(out, int) else len(out)


class HFTokenizerCounter(TokenCounter):
    """A `tokenizers.Tokenizer` from a tokenizer.json path; loads lazily, pickles as its path."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.spec = f"hf:{path}"
        self._tok: Any = None

    def __getstate__(self) -> dict[str, str]:
        return {"path": self.path}

    def __setstate__(self, state: dict[str, str]) -> None:
        self.__init__(state["path"])  # type: ignore[misc]

    def count(self, text: str) -> int:
        if self._tok is None:
            try:
                from tokenizers import Tokenizer
            except ImportError as exc:
                raise ValueError(
                    f"tokenizer spec {self.spec!r} needs the `tokenizers` package; "
                    "`pip install tokenizers` or use --tokenizer bytes:4"
                ) from exc
            self._tok = Tokenizer.from_file(self.path)
        return len(self._tok.encode(text, add_special_tokens=False).ids)


class _EncodeCounter(TokenCounter):
    """An object with `.encode(text)` returning ids or an Encoding with `.ids` (HF Tokenizer)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.spec = f"object:{type(tokenizer).__module__}.{type(tokenizer).__qualname__}"

    def count(self, text: str) -> int:
        try:
            out = self.tokenizer.encode(text, add_special_tokens=False)
        except TypeError:  # encode() without that keyword
            out = self.tokenizer.encode(text)
        return len(getattr(out, "ids", out))


def as_counter(obj: Any) -> TokenCounter:
    """A TokenCounter from a spec string, a TokenCounter, an object with `.encode` (a HF
    `tokenizers.Tokenizer` or `transformers` tokenizer) or a callable str -> ids / int."""
    if obj is None or isinstance(obj, str):
        return load_counter(obj)
    if isinstance(obj, TokenCounter):
        return obj
    if hasattr(obj, "encode") and not callable(obj):
        return _EncodeCounter(obj)
    if callable(obj):
        return CallableCounter(obj)
    raise ValueError(
        f"cannot count tokens with {type(obj).__name__}; pass a spec string "
        "(bytes:4, hf:PATH), a tokenizer with .encode, or a callable"
    )


def load_counter(spec: str | None) -> TokenCounter:
    """Counter from a spec: None or "bytes:R", "hf:PATH/tokenizer.json", "py:module:attr".

    "py:module:attr" imports a callable (str -> ids or int), e.g. a factory-made tokenizer.
    """
    if spec is None or spec == "":
        return RatioCounter()
    kind, _, rest = spec.partition(":")
    if kind == "bytes":
        try:
            return RatioCounter(float(rest))
        except ValueError as exc:
            raise ValueError(
                f"tokenizer spec {spec!r}: ratio must be a number, e.g. bytes:4"
            ) from exc
    if kind == "hf":
        return HFTokenizerCounter(rest)
    if kind == "py":
        module, _, attr = rest.partition(":")
        try:
            fn = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"tokenizer spec {spec!r}: cannot import {module}:{attr}") from exc
        return CallableCounter(fn, spec=spec)
    raise ValueError(
        f"tokenizer spec {spec!r} not understood; use bytes:R, hf:PATH or py:module:attr"
    )


def calibrate_ratio(texts: Iterable[str], tokenize: Callable[[str], Sequence[int]]) -> float:
    """Measured bytes per token of `texts` under `tokenize`: total bytes / total tokens."""
    nbytes = ntok = 0
    for t in texts:
        nbytes += len(t.encode("utf-8"))
        ntok += len(tokenize(t))
    if ntok == 0:
        raise ValueError("calibration texts produced no tokens; pass non-empty texts")
    return nbytes / ntok
