"""Tool names: `<seat>.<verb>` implements a seat's verb; a name without a dot is the module's own."""

from __future__ import annotations

import re

# As the manifest's seat names (manifests/model.py), so a seat tool matches its [[seat]].
_SEAT_RE = re.compile(r"^[a-z][a-z0-9-]{0,62}$")
# One token of a bus subject and a valid MCP tool name: no dots, spaces, `*` or `>`.
_PART_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")


class ToolNameError(ValueError):
    """A tool name the runtime could not serve on a subject."""


def seat_verb(seat: str, verb: str) -> str:
    """The tool name implementing `verb` of `seat`: "seat.verb"."""
    if not _SEAT_RE.match(seat):
        raise ToolNameError(f'seat {seat!r} is not a seat name: [a-z][a-z0-9-]{{0,62}}, e.g. "memory"')
    if not _PART_RE.match(verb):
        raise ToolNameError(f"verb {verb!r} is not a verb: a letter, then letters, digits, _ or - (at most 64)")
    return f"{seat}.{verb}"


def check_tool_name(name: str) -> str:
    """Return `name` if the runtime can serve it; a name has no dot, or exactly one (a seat verb)."""
    if name.count(".") == 1:
        seat, verb = name.split(".")
        return seat_verb(seat, verb)
    if "." in name:
        raise ToolNameError(f"tool {name!r} has more than one dot; a seat verb is <seat>.<verb>")
    if not _PART_RE.match(name):
        raise ToolNameError(f"tool {name!r} is not a tool name: a letter, then letters, digits, _ or - (at most 64)")
    return name
