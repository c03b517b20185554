"""Template token ids from the user's tokenizer (or an explicit table) and text -> ids.

The template parts of a rule (fcp_data.vision.families.TemplatePart) name special tokens by
role; each family spells them its own way (`FamilySpec.tokens`): Qwen2/2.5/3-VL
`<|vision_start|>`, `<|vision_end|>`, `<|video_pad|>` (151656 in Qwen's vocabulary),
`<|image_pad|>`; InternVL `<img>`, `</img>`, `<IMG_CONTEXT>`. Ids are looked up in the
tokenizer's vocabulary (added tokens included), so a tokenizer without one of them fails here,
at loader construction, naming the token, instead of silently emitting unknown-token ids.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from .families import TOKEN_STRINGS, family_of, family_spec, family_tokens

# TOKEN_STRINGS and family_of live in the families registry; re-exported for old imports
__all__ = ["TOKEN_STRINGS", "SpecialTokenIds", "TokenizerText", "family_of"]


def _vocab(tokenizer: Any) -> Mapping[str, int]:
    """The vocabulary with added tokens; looks through fcp's tokenizer wrappers (readers.text)."""
    obj, seen = tokenizer, 0
    while getattr(obj, "get_vocab", None) is None and seen < 4:
        inner = next(
            (getattr(obj, a) for a in ("fast", "tokenizer", "fn") if getattr(obj, a, None)), None
        )
        if inner is None:
            break
        obj, seen = inner, seen + 1
    get = getattr(obj, "get_vocab", None)
    if get is None:
        raise ConfigError(
            f"tokenizer {type(tokenizer).__name__} has no vocabulary to look template tokens up "
            "in; pass a tokenizers.Tokenizer or transformers tokenizer, or "
            "VisionOptions(token_ids=SpecialTokenIds(family=..., ids={...}))"
        )
    try:
        return get(with_added_tokens=True)  # tokenizers.Tokenizer
    except TypeError:
        return get()  # transformers tokenizers include added tokens


@dataclass(frozen=True, kw_only=True, slots=True)
class SpecialTokenIds:
    """Id of every template role of a family, e.g. {"vision_start": 151652, ...}."""

    family: str
    ids: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        need = family_tokens(self.family)
        missing = sorted(set(need) - set(self.ids))
        if missing:
            raise ConfigError(
                f"SpecialTokenIds for {self.family} lacks ids of {', '.join(missing)} "
                f"({', '.join(need[m] for m in missing)}); give all of {', '.join(sorted(need))}"
            )

    @classmethod
    def from_tokenizer(cls, tokenizer: Any, rule_name: str) -> SpecialTokenIds:
        """Ids of the family's template tokens in the tokenizer's vocabulary; names any missing."""
        spec = family_spec(rule_name)
        vocab = _vocab(tokenizer)
        ids, missing = {}, []
        for role, text in spec.tokens:
            if text in vocab:
                ids[role] = int(vocab[text])
            else:
                missing.append(text)
        if missing:
            raise ConfigError(
                f"the tokenizer has no {', '.join(missing)} token(s), which the {rule_name} "
                "template needs: use the model's own tokenizer (its tokenizer.json has them as "
                "added tokens), add them with add_special_tokens, or pass "
                "VisionOptions(token_ids=SpecialTokenIds(...))"
            )
        return cls(family=spec.family, ids=ids)

    def __getitem__(self, role: str) -> int:
        return int(self.ids[role])


@dataclass(frozen=True, slots=True)
class TokenizerText:
    """Text -> ids without added BOS/EOS, for a tokenizers.Tokenizer, a transformers tokenizer or a
    plain callable returning ids. Picklable (travels to DataLoader workers) when the tokenizer is.
    """

    tokenizer: Any

    def __call__(self, text: str) -> Sequence[int]:
        tok = self.tokenizer
        enc = getattr(tok, "encode", None)
        if enc is not None:
            try:
                out = enc(text, add_special_tokens=False)
            except TypeError:
                out = enc(text)
            return list(getattr(out, "ids", out))
        out = tok(text)
        if isinstance(out, Mapping):
            return list(out["input_ids"])
        return list(out)

    def count(self, text: str) -> int:
        """Token count, so the same object can be the index's text counter."""
        return len(self(text))
