"""The text of each answer, for people and agents (the structuredContent carries the same facts).

The store measures these lines before it sends them (a reply's byte bound), so they are made
here, once, for the store and for nothing else.
"""

from __future__ import annotations

from typing import Any


def entry_line(entry: dict[str, Any]) -> str:
    key = f" {entry['key']}" if entry["key"] else ""
    return (
        f"#{entry['id']} [{entry['scope']}] {entry['type']}{key}: {entry['content']}  "
        f"({entry['author']} via {entry['source']}, {entry['updated_at']})"
    )


def context_line(entry: dict[str, Any]) -> str:
    """One entry in load_context's text: a list item; a line break inside it stays inside the item."""
    label = f"[{entry['type']}] {entry['key']}: " if entry["key"] else f"[{entry['type']}] "
    return "- " + label + entry["content"].replace("\n", "\n  ") + "\n"


def context_header(slug: str, name: str) -> str:
    return f"## {slug}: {name}\n"


def scope_line(scope: dict[str, Any]) -> str:
    count = scope["entries"]
    flags = f"{scope['kind']}{', archived' if scope['archived'] else ''}, {count} {'entry' if count == 1 else 'entries'}"
    return f"{scope['slug']} ({flags}): {scope['name']}"


def version_line(version: dict[str, Any]) -> str:
    """One version of an entry's history: when, what, by whom, through what; the text when it changed."""
    what = {
        "import": "as it read when its history began",
        "remember": "remembered",
        "upsert": "changed",
        "forget": "forgotten",
        "archive": "scope archived",
        "unarchive": "scope unarchived",
        "restore": f"restored version {version['restored']}",
    }.get(version["action"], version["action"])
    line = f"v{version['version']} {version['at']} {what} by {version['by']} via {version['via']}"
    if version["action"] in ("forget", "archive", "unarchive"):
        return line  # the text is as the version before left it
    line += f": {version['type']}: {version['content']}"
    if version["author"] != version["by"]:
        line += f"  (written by {version['author']})"
    if version["before"] is not None and version["before"] != version["content"]:
        line += f"\n    before: {version['before']}"
    return line
