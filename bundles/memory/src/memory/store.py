"""The memory's store: one SQLite file, one transaction per call, visibility enforced in SQL.

A caller sees the global scope, every project scope and its own private scope; another
member's private entries do not exist for it (every lookup filters them out, so an id that
is someone else's private entry answers exactly like an id that never existed).
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .config import Config
from .model import (
    DEFAULT_BUDGET,
    DEFAULT_LIMIT,
    GLOBAL,
    MAX_BUDGET,
    MAX_DESCRIPTION,
    MAX_LIMIT,
    MAX_NAME,
    MAX_QUERY,
    PRIVATE,
    TYPES,
    Refused,
    Writer,
    check_content,
    check_int,
    check_key,
    check_slug,
    check_text,
    check_type,
)
from .schema import migrate

DB_FILE = "memory.sqlite3"
# What a caller may read: shared scopes, and the private scope it owns (`:me` is its id).
_VISIBLE = "(s.kind != 'private' OR s.owner = :me)"
_ENTRY_COLUMNS = (
    "e.id, s.slug, s.kind, e.type, e.key, e.content, e.author, e.source, e.created_at, e.updated_at"
)
# load_context's order within a scope: the most important types first, then the newest.
_BY_IMPORTANCE = "CASE e.type " + " ".join(f"WHEN '{t}' THEN {i}" for i, t in enumerate(TYPES)) + " END"
_WORD_RE = re.compile(r"\w+")

NO_CALLER = (
    "this call carries no caller (params._meta[\"mesh/caller\"]), so it has no author or owner: call it "
    "through a mesh node, which stamps the caller; the memory never takes who you are from arguments"
)


def now() -> str:
    """UTC, microseconds, sortable as text."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _entry(row: sqlite3.Row) -> dict[str, Any]:
    return {
        "id": row["id"],
        "scope": PRIVATE if row["kind"] == "private" else row["slug"],
        "type": row["type"],
        "key": row["key"],
        "content": row["content"],
        "author": row["author"],
        "source": row["source"],
        "created_at": row["created_at"],
        "updated_at": row["updated_at"],
    }


def _scope(row: sqlite3.Row) -> dict[str, Any]:
    private = row["kind"] == "private"
    return {
        "slug": PRIVATE if private else row["slug"],
        "name": row["name"],
        "kind": row["kind"],
        "description": row["description"],
        "archived": bool(row["archived"]),
    }


def _need(who: Writer | None) -> Writer:
    if who is None:
        raise Refused(NO_CALLER)
    return who


class Store:
    def __init__(self, data_dir: Path, config: Config) -> None:
        self.config = config
        self.path = data_dir / DB_FILE
        # Autocommit mode: every call opens its own transaction explicitly (`_tx`).
        self.db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self.db.row_factory = sqlite3.Row
        # WAL + NORMAL: a committed call survives the process being killed (not a power cut).
        for pragma in ("journal_mode = WAL", "synchronous = NORMAL", "foreign_keys = ON", "busy_timeout = 5000"):
            self.db.execute(f"PRAGMA {pragma}")
        migrate(self.db)
        with self._tx():
            stamp = now()
            for p in config.projects:  # created when absent; an existing one is left as it is
                self.db.execute(
                    "INSERT OR IGNORE INTO scope (slug, name, kind, description, created_at) VALUES (?, ?, 'project', ?, ?)",
                    (p.slug, p.name, p.description, stamp),
                )

    def close(self) -> None:
        self.db.close()

    @contextmanager
    def _tx(self, *, write: bool = True) -> Iterator[sqlite3.Connection]:
        """One call, one transaction: a refusal or a crash halfway writes nothing; a read sees one state."""
        self.db.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    # --- scopes ----------------------------------------------------------------------------

    def _names(self) -> str:
        slugs = [r[0] for r in self.db.execute("SELECT slug FROM scope WHERE kind = 'project' ORDER BY slug")]
        return ", ".join([GLOBAL, f"{PRIVATE} (yours)", *slugs])

    def _not_found(self, slug: str) -> Refused:
        return Refused(
            f"scope {slug!r} not found: the scopes you can use are {self._names()}; "
            "memory.scopes lists them, memory.create_scope makes a project scope"
        )

    def _find_scope(self, who: Writer | None, slug: Any, *, create_private: bool) -> sqlite3.Row | None:
        """The scope a caller names; None only for a private scope not yet created."""
        if slug == PRIVATE:
            me = _need(who).id
            if create_private:
                self.db.execute(
                    "INSERT OR IGNORE INTO scope (slug, name, kind, owner, created_at) VALUES (?, ?, 'private', ?, ?)",
                    (f"private/{me}", f"private ({me})", me, now()),
                )
            return self.db.execute("SELECT * FROM scope WHERE kind = 'private' AND owner = ?", (me,)).fetchone()
        check_slug(slug)
        row = self.db.execute("SELECT * FROM scope WHERE slug = ? AND kind != 'private'", (slug,)).fetchone()
        if row is None:
            raise self._not_found(slug)
        return row

    def _writable(self, who: Writer, slug: Any) -> sqlite3.Row:
        row = self._find_scope(who, slug, create_private=True)
        assert row is not None
        if row["archived"]:
            raise Refused(
                f"scope {row['slug']!r} is archived, so it is read-only: write to another scope "
                f"(e.g. {GLOBAL!r} or an active project; memory.scopes lists them)"
            )
        return row

    def _manager(self, who: Writer | None, verb: str) -> Writer:
        me = _need(who)
        if not self.config.may_manage_scopes(me):
            raise Refused(
                f"{me.id} may not {verb} project scopes: the team's policy (scope_admins = "
                f"{', '.join(self.config.scope_admins)}) allows only those; ask one of them, or an operator "
                "to add you to MEMORY_SCOPE_ADMINS"
            )
        return me

    def scopes(self, who: Writer | None) -> list[dict[str, Any]]:
        with self._tx(write=False):
            rows = self.db.execute(
                "SELECT * FROM scope s WHERE kind != 'private' ORDER BY kind = 'project', slug"
            ).fetchall()
            found = [_scope(r) for r in rows]
            if who is not None:
                mine = self._find_scope(who, PRIVATE, create_private=False)
                found.append(_scope(mine) if mine else
                             {"slug": PRIVATE, "name": f"private ({who.id})", "kind": "private",
                              "description": "", "archived": False})
            return found

    def create_scope(self, who: Writer | None, slug: Any, name: Any, description: Any = None) -> dict[str, Any]:
        with self._tx():
            self._manager(who, "create")
            check_slug(slug)
            if slug in (GLOBAL, PRIVATE):
                raise Refused(f"{slug!r} cannot be created: the global scope and each member's private scope always exist")
            name = check_text(name, "name", MAX_NAME, required=True)
            description = check_text(description, "description", MAX_DESCRIPTION, required=False)
            existing = self.db.execute("SELECT archived FROM scope WHERE slug = ?", (slug,)).fetchone()
            if existing is not None:
                state = "archived" if existing["archived"] else "active"
                raise Refused(f"scope {slug!r} exists ({state}); a slug is never reused: choose another slug")
            self.db.execute(
                "INSERT INTO scope (slug, name, kind, description, created_at) VALUES (?, ?, 'project', ?, ?)",
                (slug, name, description, now()),
            )
            return _scope(self.db.execute("SELECT * FROM scope WHERE slug = ?", (slug,)).fetchone())

    def archive_scope(self, who: Writer | None, slug: Any) -> dict[str, Any]:
        with self._tx():
            self._manager(who, "archive")
            if slug in (GLOBAL, PRIVATE):
                raise Refused(f"{slug!r} cannot be archived: only project scopes can")
            row = self._find_scope(who, slug, create_private=False)
            assert row is not None
            self.db.execute("UPDATE scope SET archived = 1 WHERE id = ?", (row["id"],))
            return _scope(self.db.execute("SELECT * FROM scope WHERE id = ?", (row["id"],)).fetchone())

    # --- entries ---------------------------------------------------------------------------

    def _get(self, who: Writer | None, entry_id: int) -> sqlite3.Row | None:
        return self.db.execute(
            f"SELECT {_ENTRY_COLUMNS}, s.archived FROM entry e JOIN scope s ON s.id = e.scope_id "
            f"WHERE e.id = :id AND {_VISIBLE}",
            {"id": entry_id, "me": who.id if who else None},
        ).fetchone()

    def remember(self, who: Writer | None, content: Any, type: Any, key: Any = None, scope: Any = None) -> dict[str, Any]:
        with self._tx():
            me = _need(who)
            content = check_content(content)
            check_type(type)
            if key is not None:
                check_key(key)
            target = self._writable(me, self.config.default_scope if scope is None else scope)
            stamp = now()
            existing = None
            if key is not None:
                existing = self.db.execute(
                    "SELECT id FROM entry WHERE scope_id = ? AND key = ?", (target["id"], key)
                ).fetchone()
            if existing is not None:  # the key's statement changes; its creation time stays
                entry_id = existing["id"]
                self.db.execute(
                    "UPDATE entry SET type = ?, content = ?, author = ?, source = ?, updated_at = ? WHERE id = ?",
                    (type, content, me.id, me.via, stamp, entry_id),
                )
            else:
                entry_id = self.db.execute(
                    "INSERT INTO entry (scope_id, type, key, content, author, source, created_at, updated_at) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (target["id"], type, key, content, me.id, me.via, stamp, stamp),
                ).lastrowid
            row = self._get(me, entry_id)
            assert row is not None
            return _entry(row)

    def recall(
        self,
        who: Writer | None,
        *,
        key: Any = None,
        type: Any = None,
        scope: Any = None,
        query: Any = None,
        limit: Any = DEFAULT_LIMIT,
    ) -> list[dict[str, Any]]:
        with self._tx(write=False):
            where = [_VISIBLE]
            params: dict[str, Any] = {"me": who.id if who else None, "limit": check_int(limit, "limit", 1, MAX_LIMIT)}
            if scope is not None:
                row = self._find_scope(who, scope, create_private=False)
                if row is None:  # the caller's private scope, never written to: nothing in it
                    return []
                where.append("s.id = :scope")
                params["scope"] = row["id"]
            if type is not None:
                where.append("e.type = :type")
                params["type"] = check_type(type)
            if key is not None:
                where.append("e.key = :key")
                params["key"] = check_key(key)
            if query is not None:
                words = _WORD_RE.findall(query) if isinstance(query, str) and len(query) <= MAX_QUERY else []
                if not words:
                    raise Refused(
                        f"query {query!r} has no words to search for: give one or more words "
                        f"(at most {MAX_QUERY} characters), e.g. 'postgres migration'; every word must match"
                    )
                where.append("e.id IN (SELECT rowid FROM entry_text WHERE entry_text MATCH :query)")
                # Each word quoted: the caller's text is words to find, never FTS5 query syntax.
                params["query"] = " ".join('"' + w.replace('"', '""') + '"' for w in words)
            rows = self.db.execute(
                f"SELECT {_ENTRY_COLUMNS} FROM entry e JOIN scope s ON s.id = e.scope_id "
                f"WHERE {' AND '.join(where)} ORDER BY e.updated_at DESC, e.id DESC LIMIT :limit",
                params,
            ).fetchall()
            return [_entry(r) for r in rows]

    def forget(self, who: Writer | None, *, id: Any = None, scope: Any = None, key: Any = None) -> int:
        with self._tx():
            me = _need(who)
            if id is not None and (scope is not None or key is not None):
                raise Refused("give either id, or scope and key, not both")
            if id is not None:
                entry_id = check_int(id, "id", 1, 2**63 - 1)
                row = self._get(me, entry_id)
                if row is None:
                    raise Refused(f"not found: no entry with id {entry_id} that you can see; memory.recall finds ids")
            elif scope is not None and key is not None:
                target = self._find_scope(me, scope, create_private=False)
                row = None if target is None else self.db.execute(
                    f"SELECT {_ENTRY_COLUMNS}, s.archived FROM entry e JOIN scope s ON s.id = e.scope_id "
                    "WHERE e.scope_id = ? AND e.key = ?", (target["id"], check_key(key)),
                ).fetchone()
                if row is None:
                    raise Refused(f"not found: no entry with key {key!r} in scope {scope!r}")
            else:
                raise Refused("say which entry to forget: id, or scope and key")
            if row["archived"]:
                raise Refused(f"scope {row['slug']!r} is archived, so it is read-only: its entries cannot be forgotten")
            self.db.execute("DELETE FROM entry WHERE id = ?", (row["id"],))
            return row["id"]

    def load_context(self, who: Writer | None, projects: Any = None, budget_chars: Any = DEFAULT_BUDGET) -> dict[str, Any]:
        with self._tx(write=False):
            budget = check_int(budget_chars, "budget_chars", 1, MAX_BUDGET)
            if projects is None:
                projects = []
            if not isinstance(projects, list) or not all(isinstance(p, str) for p in projects):
                raise Refused("projects must be a list of project slugs, e.g. [\"billing-platform\"]")
            sections: list[sqlite3.Row] = [self._find_scope(who, GLOBAL, create_private=False)]  # type: ignore[list-item]
            for slug in dict.fromkeys(projects):  # in the order given, each once
                if slug in (GLOBAL, PRIVATE):
                    raise Refused(f"{slug!r} is not a project: global and your private scope are always included")
                sections.append(self._find_scope(who, slug, create_private=False))  # type: ignore[arg-type]
            if who is not None and (mine := self._find_scope(who, PRIVATE, create_private=False)) is not None:
                sections.append(mine)
            return self._pack(sections, budget)

    def _pack(self, sections: list[sqlite3.Row], budget: int) -> dict[str, Any]:
        """Global, the projects, the private scope, each most important first, until the budget is used."""
        text, entries, truncated = "", [], False
        for scope in sections:
            header = f"## {_scope(scope)['slug']}: {scope['name']}\n"
            wrote_header = False
            for row in self.db.execute(
                f"SELECT {_ENTRY_COLUMNS} FROM entry e JOIN scope s ON s.id = e.scope_id WHERE s.id = ? "
                f"ORDER BY {_BY_IMPORTANCE}, e.updated_at DESC, e.id DESC",
                (scope["id"],),
            ):
                label = f"[{row['type']}] {row['key']}: " if row["key"] else f"[{row['type']}] "
                line = f"- {label}{' '.join(row['content'].split())}\n"
                cost = len(line) + (0 if wrote_header else len(header))
                if len(text) + cost > budget:
                    truncated = True
                    break
                text += ("" if wrote_header else header) + line
                wrote_header = True
                entries.append(_entry(row))
            if truncated:
                break
        return {"text": text, "entries": entries, "truncated": truncated}
