"""The memory's model: six fixed types, scope kinds, keys and slugs, every text's limits, and
the refusal type.

Every check says what was wrong and what would be right, because the text reaches an agent
that will try again with it. Texts are counted after Unicode NFC (the form they are stored
in), in characters and in UTF-8 bytes, and hold no control characters but line breaks and
tabs where a text may have lines.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Any

# Most important first: load_context fills its budget in this order.
TYPES = ("constraint", "decision", "convention", "glossary", "open_question", "status")
SIX = "decision, convention, constraint, open_question, glossary, status"

GLOBAL = "global"
PRIVATE = "private"  # how a caller names its own private scope; never a stored slug
KINDS = ("global", "project", "private")

# As the mesh's seat and module names: a project slug is an address an agent stores.
_SLUG_RE = re.compile(r"^[a-z][a-z0-9-]{0,62}$")
# Lower-case words joined by dots (namespaces) and hyphens (kebab), e.g. db.system-of-record.
_KEY_RE = re.compile(r"^[a-z0-9]+(?:[.-][a-z0-9]+)*$")

# The limits of every text a caller sends (README, "Limits"): characters and UTF-8 bytes, after NFC.
MAX_KEY = 128  # ASCII by its pattern: as many bytes
MAX_CONTENT = 4000
MAX_CONTENT_BYTES = 12_000  # 4,000 characters of CJK fit; 4,000 emoji do not
MAX_NAME = 200
MAX_NAME_BYTES = 600
MAX_DESCRIPTION = 2000
MAX_DESCRIPTION_BYTES = 6000
MAX_QUERY = 500
MAX_QUERY_BYTES = 2000
MAX_QUERY_WORDS = 32
MAX_CURSOR = 128
MAX_PROJECTS = 64
# Lists.
MAX_LIMIT = 200
DEFAULT_LIMIT = 20
MAX_HISTORY_LIMIT = 200
DEFAULT_HISTORY_LIMIT = 50
MAX_SCOPES_LIMIT = 200
DEFAULT_SCOPES_LIMIT = 100
# load_context.
DEFAULT_BUDGET = 8000
MAX_BUDGET = 200_000
# Every reply, as the JSON line the child writes: under the bus's default max_payload (1 MiB)
# so no reply needs the object store, and far under the node's line limit (64 MiB), whatever
# the store holds. A list stops early (and says where to go on) rather than pass it.
MAX_REPLY_BYTES = 1_000_000

# Control characters (Unicode Cc: C0, DEL, C1). A text with lines keeps \n and \t.
_CONTROL_IN_LINES = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")


class Refused(Exception):
    """A call the memory will not do; the text is the whole answer the caller sees."""


@dataclass(frozen=True, slots=True)
class Writer:
    """Who a call is, as the channel says (memory/identity.py derives it, in one place).

    `id` becomes the author of what it writes; `owner` is whose private scope "private" means
    on this channel (None: this channel reaches no private scope); `via` becomes the source.
    """

    id: str
    account: str
    via: str
    owner: str | None


def check_type(value: Any) -> str:
    if value not in TYPES:
        raise Refused(f"type {value!r} is not one of the six types: {SIX}")
    return value


def check_key(value: Any) -> str:
    if not isinstance(value, str) or len(value) > MAX_KEY or not _KEY_RE.match(value):
        raise Refused(
            f"key {_shown(value)} is not a key: lower-case letters and digits in words joined by '.' "
            f"(namespaces) or '-' (kebab), at most {MAX_KEY} characters, e.g. 'db.system-of-record'"
        )
    return value


def check_slug(value: Any, what: str = "scope") -> str:
    if not isinstance(value, str) or not _SLUG_RE.match(value):
        raise Refused(
            f"{what} {_shown(value)} is not a scope slug: a lower-case letter, then letters, digits or '-', "
            "at most 63 characters, e.g. 'billing-platform'; or 'global', or 'private' for your own"
        )
    return value


def _shown(value: Any) -> str:
    """A caller's value inside a refusal: its repr, cut, so a refusal stays short whatever came."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def check_text(
    value: Any, what: str, max_chars: int, max_bytes: int, *, required: bool, lines: bool
) -> str:
    """`value` as stored: NFC, stripped; refused when it is no text, empty (if required), holds a
    control character (line breaks and tabs allowed when `lines`) or is over either limit."""
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        raise Refused(f"{what} must be a text (a JSON string), not {type(value).__name__}")
    if _SURROGATE.search(value):
        raise Refused(f"{what} is not valid Unicode (it holds a lone UTF-16 surrogate): send well-formed text")
    text = unicodedata.normalize("NFC", value)
    bad = (_CONTROL_IN_LINES if lines else _CONTROL).search(text)
    if bad is not None:
        allowed = "only line breaks (\\n) and tabs (\\t) are allowed" if lines else "it is one line of text"
        raise Refused(
            f"{what} holds a control character (U+{ord(bad.group()):04X} at character {bad.start() + 1}): "
            f"{allowed}; remove it"
        )
    text = text.strip()
    if required and not text:
        raise Refused(f"{what} is empty: give a non-empty text")
    if len(text) > max_chars:
        raise Refused(f"{what} has {len(text)} characters, more than {max_chars} (counted after Unicode NFC)")
    size = len(text.encode())
    if size > max_bytes:
        raise Refused(
            f"{what} has {size} bytes in UTF-8, more than {max_bytes} (its {len(text)} characters are within "
            f"{max_chars}, but many of them take 3-4 bytes): shorten it"
        )
    return text


def check_content(value: Any) -> str:
    if isinstance(value, str) and not value.strip():
        raise Refused("content is empty: give the statement itself as plain text, e.g. 'Postgres is the system of record.'")
    try:
        return check_text(value, "content", MAX_CONTENT, MAX_CONTENT_BYTES, required=True, lines=True)
    except Refused as e:
        if "more than" in str(e):
            raise Refused(f"{e}: an entry is one statement (one rule, decision or definition); split it into several entries") from None
        raise


def check_name(value: Any) -> str:
    return check_text(value, "name", MAX_NAME, MAX_NAME_BYTES, required=True, lines=False)


def check_description(value: Any) -> str:
    return check_text(value, "description", MAX_DESCRIPTION, MAX_DESCRIPTION_BYTES, required=False, lines=True)


def check_int(value: Any, what: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise Refused(f"{what} {_shown(value)} is out of range: a whole number from {low} to {high}")
    return value


def check_id(value: Any) -> int:
    return check_int(value, "id", 1, 2**63 - 1)
