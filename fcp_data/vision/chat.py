"""Chat-style media samples: a conversation in the sidecar's caption field, ChatML-rendered.

A sidecar whose caption field holds a list of turns ({"role", "content"} or LLaVA/Qwen's
{"from", "value"}, with "human"/"gpt" mapped to user/assistant) is rendered as Qwen's ChatML:
`<|im_start|>{role}\n` + content + `<|im_end|>\n` per turn. The first "<image>" or "<video>"
marker in a content marks where the media template goes (without a marker it goes first). Each
piece is tokenized on its own, so the index's count (`count_chat`) and the loader's ids come
from the same segments. Loss targets: content and `<|im_end|>\n` of turns whose role is in the
loss roles (default assistant only); headers never.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..errors import MemberError

__all__ = [
    "MEDIA_MARKERS",
    "ROLES",
    "chat_flags",
    "chat_pieces",
    "chat_segments",
    "count_chat",
    "is_chat",
]

MEDIA_MARKERS = ("<image>", "<video>")
ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant"}
ROLES |= {"system": "system", "tool": "tool"}
Segment = tuple[str, str, str]  # (role, kind: header / text / media, text)


def is_chat(value: Any) -> bool:
    """True for a non-empty list of turn objects."""
    return isinstance(value, list) and bool(value) and all(isinstance(t, dict) for t in value)


def _turn(t: dict[str, Any], i: int) -> tuple[str, str]:
    raw = t.get("role", t.get("from"))
    content = t.get("content", t.get("value"))
    if not isinstance(raw, str) or raw not in ROLES or not isinstance(content, str):
        raise MemberError(
            f"chat turn {i} is {sorted(t)[:4]}: each turn needs a role/from in "
            f"{sorted(ROLES)} and a string content/value"
        )
    return ROLES[raw], content


def chat_segments(turns: Sequence[dict[str, Any]]) -> list[Segment]:
    """Header, text and (once) media segments of a conversation, in order."""
    out: list[Segment] = []
    placed = False
    for i, t in enumerate(turns):
        role, content = _turn(t, i)
        out.append((role, "header", f"<|im_start|>{role}\n"))
        if not placed:
            cut = (
                min((content.find(m), m) for m in MEDIA_MARKERS if m in content)
                if any(m in content for m in MEDIA_MARKERS)
                else None
            )
            if cut is not None:
                at, marker = cut
                head, content = content[:at], content[at + len(marker) :]
                if head:
                    out.append((role, "text", head))
                out.append((role, "media", ""))
                placed = True
        if content:
            out.append((role, "text", content))
        out.append((role, "text", "<|im_end|>\n"))
    if not placed:
        out.insert(0, ("", "media", ""))
    return out


def count_chat(turns: Sequence[dict[str, Any]], counter: Callable[[str], int]) -> int:
    """Text tokens of a conversation (the media template not included)."""
    return sum(counter(s) for _, kind, s in chat_segments(turns) if kind != "media")


def chat_pieces(
    turns: Sequence[dict[str, Any]],
    text_ids: Callable[[str], Sequence[int]],
    loss_roles: Sequence[str],
) -> tuple[list[tuple[Any, bool]], list[tuple[Any, bool]]]:
    """(before, after) the media: lists of (ids, is_target) for `encode_media`."""
    import numpy as np

    before: list[tuple[Any, bool]] = []
    after: list[tuple[Any, bool]] = []
    side = before
    for role, kind, text in chat_segments(turns):
        if kind == "media":
            side = after
            continue
        ids = np.asarray(text_ids(text), dtype=np.int64)
        side.append((ids, kind == "text" and role in loss_roles))
    return before, after


def chat_flags(
    turns: Sequence[dict[str, Any]], counter: Callable[[str], int], loss_roles: Sequence[str]
) -> tuple[list[tuple[int, bool]], list[tuple[int, bool]]]:
    """Like `chat_pieces` with token counts instead of ids (loss counts without tokenizing)."""
    before: list[tuple[int, bool]] = []
    after: list[tuple[int, bool]] = []
    side = before
    for role, kind, text in chat_segments(turns):
        if kind == "media":
            side = after
            continue
        side.append((counter(text), kind == "text" and role in loss_roles))
    return before, after
