"""The shapes of the verbs' structuredContent, published as each tool's output schema (and checked
by the MCP library against every answer), so a program, or a web page, knows what it gets.
"""

from __future__ import annotations

from typing import Literal

from typing_extensions import NotRequired, TypedDict  # pydantic needs its TypedDict for nested ones (Python < 3.12)

TypeName = Literal["decision", "convention", "constraint", "open_question", "glossary", "status"]
Action = Literal["import", "remember", "upsert", "forget", "archive", "unarchive", "restore"]


class Entry(TypedDict):
    id: int
    scope: str  # a project's slug, "global", or "private" (the caller's own)
    type: str  # one of the six (TypeName); a str here so a hand-edited file cannot fail every answer
    key: str | None
    content: str
    author: str  # whose statement it is, from the channel
    source: str  # the channel it came through: bus, local, mcp
    created_at: str
    updated_at: str
    version: int  # the entry's current version (memory.history)
    clipped: NotRequired[bool]  # present (true) when the file holds more than a caller could write


class Recalled(TypedDict):
    entries: list[Entry]
    next_cursor: str | None  # pass as cursor (with the same filters) for the next page
    listing_cut: NotRequired[bool]  # the listing stopped at its bound (20,000 entries)


class Forgot(TypedDict):
    forgotten: int
    version: int


class Version(TypedDict):
    version: int
    action: str  # one of Action (a str, as Entry.type)
    at: str
    by: str  # who made the change
    via: str  # the channel it came through
    type: str
    content: str  # the entry's text after the change
    author: str  # whose statement the text is
    source: str
    forgotten: bool  # the entry is forgotten after this change
    restored: int | None  # the version a restore brought back
    before: str | None  # the text before the change (None for the first version)


class Purged(TypedDict):
    by: str
    via: str
    at: str
    versions: int  # how many versions were erased


class History(TypedDict):
    id: int
    scope: str
    key: str | None
    forgotten: bool | None  # None when purged
    purged: Purged | None
    versions: list[Version]  # newest first
    next_cursor: str | None  # pass as cursor for older versions


class PurgeDone(TypedDict):
    purged: int
    scope: str
    by: str
    via: str
    at: str
    versions: int


class Scope(TypedDict):
    slug: str
    name: str
    kind: Literal["global", "project", "private"]
    description: str
    archived: bool
    entries: int  # entries in it, not counting forgotten ones


class Scopes(TypedDict):
    scopes: list[Scope]
    next_cursor: str | None


class Context(TypedDict):
    text: str
    entries: list[Entry]
    truncated: bool
    left_out: dict[str, int]  # per scope slug: entries that did not fit the budget
