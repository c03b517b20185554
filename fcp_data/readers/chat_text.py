"""Text chat samples: a `messages` list of {role, content} turns, rendered and counted exactly.

A text sample whose text field (`--text-field messages`) holds a list of turns instead of a
string is a conversation. It is rendered with the ChatML template of the vision chat path
(`fcp_data.vision.chat`: `<|im_start|>{role}\\n` + content + `<|im_end|>\\n` a turn, each piece
tokenized on its own), so the index's count (`count_text_chat`, with the index's tokenizer) and
the loader's ids (`encode_text_chat`, with the loader's: the same spec, checked on open) come
from one list of segments. Roles: system, user, assistant, tool (and LLaVA's human / gpt);
any other role is a bad sample naming the turn. Loss targets are the content and `<|im_end|>\\n`
of the turns whose role is in `loss_roles` (default assistant only), never the role headers,
plus the end-of-document ids. Media markers (`<image>`, `<video>`) have no place in a text
sample and are refused rather than silently cut out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import ConfigError, MemberError
from ..vision import MEDIA_MARKERS, ROLES, chat_pieces, count_chat, is_chat

__all__ = [
    "CHAT_ROLES",
    "ChatNotStorableError",
    "check_loss_roles",
    "check_text_chat",
    "count_text_chat",
    "encode_text_chat",
    "is_chat",
]

CHAT_ROLES = ("system", "user", "assistant", "tool")


class ChatNotStorableError(ConfigError):
    """Kept for callers that catch it; no longer raised: a token store now leaves chats out
    (an empty span), and the loader renders them and their loss targets from the sample."""


def check_loss_roles(roles: Any) -> tuple[str, ...]:
    """`roles` as a tuple of chat roles; ConfigError naming a role that does not exist."""
    if isinstance(roles, str) or not isinstance(roles, (list, tuple)) or not roles:
        raise ConfigError(
            f"chat_loss_roles={roles!r} must be a non-empty tuple of roles from {CHAT_ROLES}"
        )
    bad = [r for r in roles if r not in CHAT_ROLES]
    if bad:
        raise ConfigError(f"chat_loss_roles has unknown role(s) {bad}; allowed: {CHAT_ROLES}")
    return tuple(roles)


def check_text_chat(turns: Sequence[dict[str, Any]]) -> None:
    """ValueError (one bad sample) naming the turn whose role or content cannot be rendered."""
    for i, t in enumerate(turns):
        if not isinstance(t, dict):  # was an AttributeError ("'int' object has no attribute")
            raise MemberError(
                f"chat turn {i} is {t!r:.40} ({type(t).__name__}); each turn must be an object "
                "with a role and a string content"
            )
        role = t.get("role", t.get("from"))
        if not isinstance(role, str) or role not in ROLES:
            raise MemberError(
                f"chat turn {i} has role {role!r}; allowed: {', '.join(sorted(ROLES))}"
            )
        content = t.get("content", t.get("value"))
        if not isinstance(content, str):
            raise MemberError(
                f"chat turn {i} ({role}) has {type(content).__name__} content; each turn's "
                "content must be a string"
            )
        marker = next((m for m in MEDIA_MARKERS if m in content), None)
        if marker is not None:
            raise MemberError(
                f"chat turn {i} holds a {marker} marker but the sample is text only (no media "
                "member); write it as a media sample or remove the marker"
            )


def count_text_chat(turns: Sequence[dict[str, Any]], counter: Callable[[str], int]) -> int:
    """Tokens of the rendered conversation (what `encode_text_chat` emits, EOD not included)."""
    check_text_chat(turns)
    return count_chat(turns, counter)


def encode_text_chat(
    turns: Sequence[dict[str, Any]],
    text_ids: Callable[[str], Sequence[int]],
    loss_roles: Sequence[str] = ("assistant",),
) -> tuple[np.ndarray, np.ndarray]:
    """(ids, targets) of the rendered conversation; targets flag the loss-role turns' text."""
    check_text_chat(turns)
    before, after = chat_pieces(turns, text_ids, loss_roles)
    pieces = [*before, *after]
    if not pieces:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool)
    ids = np.concatenate([np.asarray(p, dtype=np.int64) for p, _ in pieces])
    targets = np.concatenate([np.full(len(p), t, dtype=bool) for p, t in pieces])
    return ids, targets
