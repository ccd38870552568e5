"""memory: the team memory, served as the `memory` seat's verbs.

Each verb is a thin shell around `memory.store.Store`: it checks the raw arguments (an
`author` or `source` argument is refused, not ignored), takes who is calling from the caller
the node stamped (memory/identity.py, the one place that decides it), runs one transaction and
answers with text for people and structuredContent for programs (its shape published as the
tool's output schema: memory/shapes.py). Every refusal is a tool error (isError) that says
what was wrong and what is right.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from typing import Annotated

from memory import shapes
from memory.config import ConfigError, load_config
from memory.identity import writer
from memory.model import Refused, Writer
from memory.schema import SchemaTooNew
from memory.store import Answer, Store
from mesh_sdk import CallToolResult, Context, Server, caller, facts, logger, result

server = Server("memory", version="0.2.0", instructions=(
    "Team memory. memory.load_context at the start of a task; memory.recall to look something up; "
    "memory.remember for one statement (a decision, convention, constraint, open_question, glossary "
    "term or status), with a key such as db.system-of-record to update it later. Nothing is lost: "
    "memory.history shows every version of an entry, memory.restore brings one back."
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


def _who(ctx: Context) -> Writer | None:
    try:
        meta = ctx.request_context.meta
    except ValueError:
        meta = None
    return writer(caller(ctx), meta if isinstance(meta, dict) else None)


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
            raise Refused(f"unknown argument {name[:64]!r}: memory.{verb} takes {', '.join(allowed) or 'no arguments'}")


def _serve(ctx: Context, verb: str, allowed: tuple[str, ...], work: Callable[[Writer | None, Store], Answer]) -> CallToolResult:
    """Run one verb: arguments checked, the store's answer or its refusal as a tool error."""
    if STORE is None:
        return result(PROBLEM, is_error=True)
    try:
        _check_arguments(ctx, verb, allowed)
        answer = work(_who(ctx), STORE)
    except Refused as e:
        return result(str(e), is_error=True)
    return result(answer.text, answer.data)


@server.seat_tool("memory", "remember")
async def remember(
    content: str, type: shapes.TypeName, ctx: Context, key: str | None = None, scope: str | None = None
) -> Annotated[CallToolResult, shapes.Entry]:
    """Remember one statement (at most 4,000 characters and 12,000 bytes; line breaks and tabs, no
    other control characters). With a key, the entry of that key in the scope gets a new version.

    scope: a project's slug, "global", or "private" (your own); default: the team's default scope.
    key: lower-case, dot/kebab namespaced, e.g. "db.system-of-record".
    """
    return _serve(ctx, "remember", ("content", "type", "key", "scope"),
                  lambda who, store: store.remember(who, content, type, key, scope))


@server.seat_tool("memory", "recall")
async def recall(
    ctx: Context,
    key: str | None = None,
    type: shapes.TypeName | None = None,
    scope: str | None = None,
    query: str | None = None,
    limit: int = 20,
    cursor: str | None = None,
) -> Annotated[CallToolResult, shapes.Recalled]:
    """Find entries you may read: by words of the text or key (query: every word must match, as a
    word, its stem or a prefix; ranked by relevance), by key, type and/or scope (newest first).
    limit: 1-200 per page; next_cursor in the answer, passed as cursor with the same filters, gives
    the next page."""
    return _serve(ctx, "recall", ("key", "type", "scope", "query", "limit", "cursor"),
                  lambda who, store: store.recall(who, key=key, type=type, scope=scope, query=query,
                                                  limit=limit, cursor=cursor))


@server.seat_tool("memory", "forget")
async def forget(
    ctx: Context, id: int | None = None, scope: str | None = None, key: str | None = None
) -> Annotated[CallToolResult, shapes.Forgot]:
    """Forget one entry (by id, or by scope and key): recall and load_context no longer show it; its
    history keeps it and memory.restore brings it back. Archived scopes are read-only."""
    return _serve(ctx, "forget", ("id", "scope", "key"), lambda who, store: store.forget(who, id=id, scope=scope, key=key))


@server.seat_tool("memory", "history")
async def history(
    ctx: Context,
    id: int | None = None,
    scope: str | None = None,
    key: str | None = None,
    limit: int = 50,
    cursor: str | None = None,
) -> Annotated[CallToolResult, shapes.History]:
    """Every version of one entry (by id, or by scope and key), newest first: who changed it, when,
    through what, and its text before and after. For whoever may read the entry. limit: 1-200."""
    return _serve(ctx, "history", ("id", "scope", "key", "limit", "cursor"),
                  lambda who, store: store.history(who, id=id, scope=scope, key=key, limit=limit, cursor=cursor))


@server.seat_tool("memory", "restore")
async def restore(ctx: Context, id: int, version: int) -> Annotated[CallToolResult, shapes.Entry]:
    """Bring back an entry as it read at one of its versions (memory.history lists them), as a new
    version; a forgotten entry comes back. For that version's author and the scope's admins."""
    return _serve(ctx, "restore", ("id", "version"), lambda who, store: store.restore(who, id, version))


@server.seat_tool("memory", "purge")
async def purge(ctx: Context, id: int) -> Annotated[CallToolResult, shapes.PurgeDone]:
    """Erase an entry and its whole history for good (a secret pasted by mistake); only "purged by
    X at T" stays. For the scope's admins, and a private scope's owner."""
    return _serve(ctx, "purge", ("id",), lambda who, store: store.purge(who, id))


@server.seat_tool("memory", "scopes")
async def scopes(
    ctx: Context, include_private: bool = True, limit: int = 100, cursor: str | None = None
) -> Annotated[CallToolResult, shapes.Scopes]:
    """The scopes you can use: global, the project scopes, your own private scope (unless
    include_private is false). limit: 1-200 per page; next_cursor continues."""
    return _serve(ctx, "scopes", ("include_private", "limit", "cursor"),
                  lambda who, store: store.scopes(who, include_private=include_private, limit=limit, cursor=cursor))


@server.seat_tool("memory", "load_context")
async def load_context(
    ctx: Context, projects: list[str] | None = None, budget_chars: int = 8000
) -> Annotated[CallToolResult, shapes.Context]:
    """The memory to read at the start of a task, most important first (constraints, decisions,
    conventions, glossary, open questions, status; newest first; global, then the named projects,
    then your private scope), as many as fit budget_chars (1-200,000: every character of the text
    counts); says how many entries per scope were left out."""
    return _serve(ctx, "load_context", ("projects", "budget_chars"),
                  lambda who, store: store.load_context(who, projects, budget_chars))


@server.seat_tool("memory", "create_scope")
async def create_scope(
    ctx: Context, slug: str, name: str, description: str | None = None
) -> Annotated[CallToolResult, shapes.Scope]:
    """Create a project scope (for the identities the team's policy allows). A slug is never reused."""
    return _serve(ctx, "create_scope", ("slug", "name", "description"),
                  lambda who, store: store.create_scope(who, slug, name, description))


@server.seat_tool("memory", "archive_scope")
async def archive_scope(ctx: Context, slug: str) -> Annotated[CallToolResult, shapes.Scope]:
    """Archive a project scope: it stays readable and becomes read-only (for the scope admins)."""
    return _serve(ctx, "archive_scope", ("slug",), lambda who, store: store.archive_scope(who, slug))


@server.seat_tool("memory", "unarchive_scope")
async def unarchive_scope(ctx: Context, slug: str) -> Annotated[CallToolResult, shapes.Scope]:
    """Make an archived project scope writable again (for the scope admins)."""
    return _serve(ctx, "unarchive_scope", ("slug",), lambda who, store: store.unarchive_scope(who, slug))


@server.seat_tool("memory", "rename_scope")
async def rename_scope(
    ctx: Context, slug: str, name: str, description: str | None = None
) -> Annotated[CallToolResult, shapes.Scope]:
    """Give global or a project scope a new name (and description); its slug never changes (for the
    scope admins)."""
    return _serve(ctx, "rename_scope", ("slug", "name", "description"),
                  lambda who, store: store.rename_scope(who, slug, name, description))


if __name__ == "__main__":
    server.run()
