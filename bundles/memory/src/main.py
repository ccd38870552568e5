"""memory: the team memory, served as the `memory` seat's verbs.

Each verb is a thin shell around `memory.store.Store`: it checks the raw arguments (an
`author` or `source` argument is refused, not ignored), takes the author from the caller the
node stamped, runs one transaction and answers with text for people and structuredContent for
programs. Every refusal is a tool error (isError) that says what was wrong and what is right.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Callable
from typing import Any, Literal

from memory.config import ConfigError, load_config
from memory.model import Refused, Writer
from memory.schema import SchemaTooNew
from memory.store import Store
from mesh_sdk import CallToolResult, Context, Server, caller, facts, logger, result

TypeName = Literal["decision", "convention", "constraint", "open_question", "glossary", "status"]

server = Server("memory", version="0.1.0", instructions=(
    "Team memory. memory.load_context at the start of a task; memory.recall to look something up; "
    "memory.remember for one statement (a decision, convention, constraint, open_question, glossary "
    "term or status), with a key such as db.system-of-record to update it later."
))
log = logger("memory")

# Arguments a forger would use: the author and source come from the channel alone.
_CHANNEL_FIELDS = ("author", "source")


def _open() -> tuple[Store | None, str]:
    """The store, or the reason there is none (every call then answers with that reason)."""
    try:
        data_dir = facts().data_dir
        config = load_config(data_dir, os.environ)
        store = Store(data_dir, config)
    except (ConfigError, SchemaTooNew, OSError, RuntimeError, sqlite3.Error) as e:  # RuntimeError: MESH_* unset
        log.error("memory cannot serve: %s", e)
        return None, f"the memory cannot serve: {e}"
    log.info("store %s (policy from %s)", store.path, config.source)
    return store, ""


STORE, PROBLEM = _open()


def _writer(ctx: Context) -> Writer | None:
    who = caller(ctx)
    return None if who is None else Writer(id=who.id, account=who.account, via=who.via)


def _check_arguments(ctx: Context, verb: str, allowed: tuple[str, ...]) -> None:
    params = ctx.request_context.params or {}
    raw = params.get("arguments") or {}
    for name in raw:
        if name in _CHANNEL_FIELDS:
            raise Refused(
                f"argument {name!r} is refused: an entry's author and source come from the channel "
                "(the caller the mesh node stamps), never from arguments; leave it out"
            )
        if name not in allowed:
            raise Refused(f"unknown argument {name!r}: memory.{verb} takes {', '.join(allowed) or 'no arguments'}")


def _serve(ctx: Context, verb: str, allowed: tuple[str, ...], work: Callable[[Writer | None, Store], tuple[str, dict[str, Any]]]) -> CallToolResult:
    """Run one verb: arguments checked, the store's answer or its refusal as a tool error."""
    if STORE is None:
        return result(PROBLEM, is_error=True)
    try:
        _check_arguments(ctx, verb, allowed)
        text, structured = work(_writer(ctx), STORE)
    except Refused as e:
        return result(str(e), is_error=True)
    return result(text, structured)


def _line(entry: dict[str, Any]) -> str:
    key = f" {entry['key']}" if entry["key"] else ""
    return f"#{entry['id']} [{entry['scope']}] {entry['type']}{key}: {entry['content']}  ({entry['author']} via {entry['source']}, {entry['updated_at']})"


@server.seat_tool("memory", "remember")
async def remember(
    content: str, type: TypeName, ctx: Context, key: str | None = None, scope: str | None = None
) -> CallToolResult:
    """Remember one statement. With a key, an existing entry of that key in the scope is updated.

    scope: a project's slug, "global", or "private" (your own); default: the team's default scope.
    key: lower-case, dot/kebab namespaced, e.g. "db.system-of-record".
    """
    def work(who: Writer | None, store: Store) -> tuple[str, dict[str, Any]]:
        entry = store.remember(who, content, type, key, scope)
        return f"remembered {_line(entry)}", entry

    return _serve(ctx, "remember", ("content", "type", "key", "scope"), work)


@server.seat_tool("memory", "recall")
async def recall(
    ctx: Context,
    key: str | None = None,
    type: TypeName | None = None,
    scope: str | None = None,
    query: str | None = None,
    limit: int = 20,
) -> CallToolResult:
    """Find entries you may read, newest first: by key, type, scope and/or words of the text (query)."""
    def work(who: Writer | None, store: Store) -> tuple[str, dict[str, Any]]:
        entries = store.recall(who, key=key, type=type, scope=scope, query=query, limit=limit)
        return "\n".join(_line(e) for e in entries) or "no entries", {"entries": entries}

    return _serve(ctx, "recall", ("key", "type", "scope", "query", "limit"), work)


@server.seat_tool("memory", "forget")
async def forget(ctx: Context, id: int | None = None, scope: str | None = None, key: str | None = None) -> CallToolResult:
    """Forget one entry: by id, or by scope and key. Archived scopes are read-only."""
    def work(who: Writer | None, store: Store) -> tuple[str, dict[str, Any]]:
        gone = store.forget(who, id=id, scope=scope, key=key)
        return f"forgot #{gone}", {"forgotten": gone}

    return _serve(ctx, "forget", ("id", "scope", "key"), work)


@server.seat_tool("memory", "scopes")
async def scopes(ctx: Context) -> CallToolResult:
    """The scopes you can use: global, the project scopes, your own private scope."""
    def work(who: Writer | None, store: Store) -> tuple[str, dict[str, Any]]:
        found = store.scopes(who)
        text = "\n".join(f"{s['slug']} ({s['kind']}{', archived' if s['archived'] else ''}): {s['name']}" for s in found)
        return text, {"scopes": found}

    return _serve(ctx, "scopes", (), work)


@server.seat_tool("memory", "load_context")
async def load_context(ctx: Context, projects: list[str] | None = None, budget_chars: int = 8000) -> CallToolResult:
    """The memory to read at the start of a task: global, then the named projects, then your private
    scope, most important types first within each, cut at budget_chars."""
    def work(who: Writer | None, store: Store) -> tuple[str, dict[str, Any]]:
        packed = store.load_context(who, projects, budget_chars)
        return packed["text"] or "no entries", packed

    return _serve(ctx, "load_context", ("projects", "budget_chars"), work)


@server.seat_tool("memory", "create_scope")
async def create_scope(ctx: Context, slug: str, name: str, description: str | None = None) -> CallToolResult:
    """Create a project scope (for the identities the team's policy allows). A slug is never reused."""
    def work(who: Writer | None, store: Store) -> tuple[str, dict[str, Any]]:
        made = store.create_scope(who, slug, name, description)
        return f"created scope {json.dumps(made)}", made

    return _serve(ctx, "create_scope", ("slug", "name", "description"), work)


@server.seat_tool("memory", "archive_scope")
async def archive_scope(ctx: Context, slug: str) -> CallToolResult:
    """Archive a project scope: it stays readable and becomes read-only."""
    def work(who: Writer | None, store: Store) -> tuple[str, dict[str, Any]]:
        done = store.archive_scope(who, slug)
        return f"archived scope {slug}", done

    return _serve(ctx, "archive_scope", ("slug",), work)


if __name__ == "__main__":
    server.run()
