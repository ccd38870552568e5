"""The memory's model: six fixed types, scope kinds, keys and slugs, and the refusal type.

Every check says what was wrong and what would be right, because the text reaches an agent
that will try again with it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

# Most important first: load_context fills its budget in this order within each scope.
TYPES = ("constraint", "decision", "convention", "glossary", "open_question", "status")
SIX = "decision, convention, constraint, open_question, glossary, status"

GLOBAL = "global"
PRIVATE = "private"  # how a caller names its own private scope; never a stored slug
KINDS = ("global", "project", "private")

# As the mesh's seat and module names: a project slug is an address an agent stores.
_SLUG_RE = re.compile(r"^[a-z][a-z0-9-]{0,62}$")
# Lower-case words joined by dots (namespaces) and hyphens (kebab), e.g. db.system-of-record.
_KEY_RE = re.compile(r"^[a-z0-9]+(?:[.-][a-z0-9]+)*$")
MAX_KEY = 128
MAX_CONTENT = 4000
MAX_NAME = 200
MAX_DESCRIPTION = 2000
MAX_LIMIT = 200
DEFAULT_LIMIT = 20
DEFAULT_BUDGET = 8000
MAX_BUDGET = 200_000
MAX_QUERY = 500


class Refused(Exception):
    """A call the memory will not do; the text is the whole answer the caller sees."""


@dataclass(frozen=True, slots=True)
class Writer:
    """Who writes, as the channel says: `id` becomes the author, `via` the source."""

    id: str
    account: str
    via: str


def check_type(value: Any) -> str:
    if value not in TYPES:
        raise Refused(f"type {value!r} is not one of the six types: {SIX}")
    return value


def check_key(value: Any) -> str:
    if not isinstance(value, str) or len(value) > MAX_KEY or not _KEY_RE.match(value):
        raise Refused(
            f"key {value!r} is not a key: lower-case letters and digits in words joined by '.' "
            f"(namespaces) or '-' (kebab), at most {MAX_KEY} characters, e.g. 'db.system-of-record'"
        )
    return value


def check_slug(value: Any, what: str = "scope") -> str:
    if not isinstance(value, str) or not _SLUG_RE.match(value):
        raise Refused(
            f"{what} {value!r} is not a scope slug: a lower-case letter, then letters, digits or '-', "
            "at most 63 characters, e.g. 'billing-platform'; or 'global', or 'private' for your own"
        )
    return value


def check_content(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise Refused("content is empty: give the statement itself as plain text, e.g. 'Postgres is the system of record.'")
    if len(value) > MAX_CONTENT:
        raise Refused(
            f"content has {len(value)} characters, more than {MAX_CONTENT}: an entry is one statement "
            "(one rule, decision or definition); split it into several entries"
        )
    return value.strip()


def check_text(value: Any, what: str, limit: int, *, required: bool) -> str:
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value.strip()) or len(value) > limit:
        need = "a non-empty text" if required else "a text"
        raise Refused(f"{what} must be {need} of at most {limit} characters")
    return value.strip()


def check_int(value: Any, what: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise Refused(f"{what} {value!r} is out of range: a whole number from {low} to {high}")
    return value
