"""What a client calls a bus tool: names the two largest model APIs accept, stable and unique.

The rule (docs/mcp.md says it for users):
1. A seat's verb `mesh.seat.<seat>.<verb>` is `<seat>_<verb>` (`memory.remember` is
   `memory_remember`); a module's own tool `mesh.tool.<module>.<tool>` is `<module>_<tool>`.
2. Every character outside `A-Z a-z 0-9 _ -` becomes `_`.
3. A name longer than 64 characters keeps its first 55 and ends in `_` and 8 hex digits of the
   SHA-256 of the tool's subject.
4. Subjects that end up with one name: seat verbs before module tools, then by subject; the first
   keeps the name, each other one gets the ending of rule 3. So a name depends only on the
   subjects that collide with it, never on the order nodes answered or on the time.
"""

from __future__ import annotations

import hashlib
import re

from runtime.wire.subjects import SEAT_PREFIX, TOOL_PREFIX

MAX_NAME = 64  # ^[a-zA-Z0-9_-]{1,64}$: what the largest model APIs accept as a tool name
KEEP = MAX_NAME - 9  # characters kept before "_" and 8 hex digits
_NOT_ALLOWED = re.compile(r"[^A-Za-z0-9_-]")
NAME_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def _suffix(subject: str, digits: int = 8) -> str:
    return hashlib.sha256(subject.encode()).hexdigest()[:digits]


def _spelled(subject: str) -> str:
    """Rules 1 and 2."""
    if subject.startswith(SEAT_PREFIX):
        rest = subject[len(SEAT_PREFIX) :]
    elif subject.startswith(TOOL_PREFIX):
        rest = subject[len(TOOL_PREFIX) :]
    else:
        rest = subject
    seat_or_module, _, tool = rest.partition(".")
    return _NOT_ALLOWED.sub("_", f"{seat_or_module}_{tool}" if tool else seat_or_module) or "_"


def plain_name(subject: str) -> str:
    """Rules 1 to 3 for one subject (a mesh.tool.* or mesh.seat.* subject)."""
    name = _spelled(subject)
    return f"{name[:KEEP]}_{_suffix(subject)}" if len(name) > MAX_NAME else name


def assign_names(subjects: list[str]) -> tuple[dict[str, str], list[str]]:
    """Subject -> name for every subject (rule 4 applied), and one note per name changed by it."""
    groups: dict[str, list[str]] = {}
    notes: list[str] = []
    for subject in subjects:
        name = plain_name(subject)
        if len(_spelled(subject)) > MAX_NAME:
            notes.append(f"{subject} is shown as {name}: the name would be longer than {MAX_NAME} characters")
        groups.setdefault(name, []).append(subject)
    names: dict[str, str] = {}
    taken = set(groups)
    for name, members in sorted(groups.items()):
        members.sort(key=lambda s: (not s.startswith(SEAT_PREFIX), s))
        names[members[0]] = name
        for subject in members[1:]:
            digits = 8
            other = f"{name[:KEEP]}_{_suffix(subject, digits)}"
            while other in taken:  # a hashed name that meets another name: a longer hash, still deterministic
                digits += 4
                other = f"{name[: MAX_NAME - digits - 1]}_{_suffix(subject, digits)}"
            taken.add(other)
            names[subject] = other
            notes.append(f"{subject} is shown as {other}: {name} is {members[0]}'s (seat verbs first, then by subject)")
    return names, notes
