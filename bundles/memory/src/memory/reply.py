"""The size of what a reply sends, counted before it is sent, and what a stored text may show.

A reply is one JSON line (JSON-RPC around the tool's result: the text for people and the
structuredContent for programs, each holding the entries). Each part is measured as the
library serializes it (compact JSON, UTF-8, only `"`, `\\` and control characters escaped),
so a list can stop at the entry that would pass `MAX_REPLY_BYTES` and say where to go on.

A stored text is shown within the limits a caller's text has (`clip`): a file written by an
older version, or by hand, may hold more, and no reply may grow with it.
"""

from __future__ import annotations

import json
from typing import Any

from .model import MAX_REPLY_BYTES

# The JSON-RPC envelope, the result's keys and the answer's fixed fields, with room to spare.
ENVELOPE_BYTES = 4096


def json_len(value: Any) -> int:
    """Bytes of `value` as compact JSON in UTF-8 (what the reply line holds for it)."""
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())


class ReplyBudget:
    """Bytes left for a reply's items; `take` says whether one more fits (and counts it if so)."""

    def __init__(self, limit: int = MAX_REPLY_BYTES) -> None:
        self.left = limit - ENVELOPE_BYTES

    def take(self, size: int) -> bool:
        if size + 2 > self.left:  # its comma (or newline) in each of the two lists
            return False
        self.left -= size + 2
        return True


def clip(text: str | None, max_chars: int, max_bytes: int) -> tuple[str | None, bool]:
    """`text` cut to the limits (characters, then UTF-8 bytes), and whether it was cut."""
    if text is None:
        return None, False
    cut = False
    if len(text) > max_chars:
        text, cut = text[:max_chars], True
    raw = text.encode()
    if len(raw) > max_bytes:
        text, cut = raw[:max_bytes].decode(errors="ignore"), True
    return text, cut
