"""The memory's store: one SQLite file, one transaction per call, visibility enforced in SQL.

A caller sees the global scope, every project scope and its own private scope; another
member's private entries do not exist for it (every lookup filters them out, so an id that
is someone else's private entry answers exactly like an id that never existed).

Nothing is lost by a change: every change of an entry is a version (who, when, via what, the
state after it), `forget` leaves a tombstone that history keeps and `restore` undoes, and only
`purge` erases an entry with its history, leaving "purged by X at T". Every answer is an
`Answer` (the text and the structuredContent), measured so no reply passes MAX_REPLY_BYTES.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

from . import render
from .config import Config
from .cursors import MAX_LISTED, Listings
from .model import (
    DEFAULT_BUDGET,
    DEFAULT_HISTORY_LIMIT,
    DEFAULT_LIMIT,
    DEFAULT_SCOPES_LIMIT,
    GLOBAL,
    MAX_BUDGET,
    MAX_CONTENT,
    MAX_CONTENT_BYTES,
    MAX_CURSOR,
    MAX_DESCRIPTION,
    MAX_DESCRIPTION_BYTES,
    MAX_HISTORY_LIMIT,
    MAX_KEY,
    MAX_LIMIT,
    MAX_NAME,
    MAX_NAME_BYTES,
    MAX_PROJECTS,
    MAX_SCOPES_LIMIT,
    PRIVATE,
    TYPES,
    Refused,
    Writer,
    check_content,
    check_description,
    check_id,
    check_int,
    check_key,
    check_name,
    check_slug,
    check_type,
)
from .reply import ReplyBudget, clip, json_len
from .schema import migrate
from .search import WEIGHTS, fts_query, indexed

DB_FILE = "memory.sqlite3"
# What a caller may read: shared scopes, and the private scope it owns (`:me` is its owner id).
_VISIBLE = "(s.kind != 'private' OR s.owner = :me)"
_ENTRY_COLUMNS = (
    "e.id, s.slug, s.kind, s.archived, e.scope_id, e.type, e.key, e.content, e.author, e.source, "
    "e.created_at, e.updated_at, e.version, e.forgotten"
)
_FROM_ENTRY = "FROM entry e JOIN scope s ON s.id = e.scope_id"
# The most important types first (load_context's order, and recall's tie-breaker after relevance).
_TYPE_RANK = "CASE e.type " + " ".join(f"WHEN '{t}' THEN {i}" for i, t in enumerate(TYPES)) + " END"
_NEWEST = "e.updated_at DESC, e.id DESC"
_BM25 = f"bm25(entry_search, {WEIGHTS[0]}, {WEIGHTS[1]})"
# What a stored author or source may show (a caller id is two fields of at most 256 bytes).
_MAX_WHO = 520
# load_context's smallest possible line: once less is left, nothing more can fit.
_MIN_CONTEXT_LINE = min(len(render.context_line({"type": t, "key": None, "content": "x"})) for t in TYPES)

NO_CALLER = (
    "this call carries no caller (params._meta[\"mesh/caller\"]), so it has no author or owner: call it "
    "through a mesh node, which stamps the caller; the memory never takes who you are from arguments"
)
NO_PRIVATE = "this channel reaches no private scope: use 'global' or a project's slug"


class Answer(NamedTuple):
    """What a verb answers: the text for people and agents, the structuredContent for programs."""

    text: str
    data: dict[str, Any]


def now() -> str:
    """UTC, microseconds, sortable as text."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _shown(text: str | None, max_chars: int, max_bytes: int) -> tuple[str | None, bool]:
    return clip(text, max_chars, max_bytes)


def _short(text: str, limit: int = _MAX_WHO) -> str:
    """A stored name, type or stamp as answers show it: the module writes them short; a file may not."""
    return clip(text, limit, limit)[0] or ""


def _slug(row: sqlite3.Row) -> str:
    return PRIVATE if row["kind"] == "private" else _short(row["slug"], 64)


def _entry(row: sqlite3.Row) -> dict[str, Any]:
    """An entry as answers show it, every text within its limits whatever the file holds."""
    content, cut_content = _shown(row["content"], MAX_CONTENT, MAX_CONTENT_BYTES)
    key, cut_key = _shown(row["key"], MAX_KEY, MAX_KEY)
    author, cut_author = _shown(row["author"], _MAX_WHO, _MAX_WHO)
    entry = {
        "id": row["id"],
        "scope": _slug(row),
        "type": _short(row["type"], 32),
        "key": key,
        "content": content,
        "author": author,
        "source": _short(row["source"], 16),
        "created_at": _short(row["created_at"], 40),
        "updated_at": _short(row["updated_at"], 40),
        "version": row["version"],
    }
    if cut_content or cut_key or cut_author:
        entry["clipped"] = True  # the file holds more than any caller could have written
    return entry


def _scope(row: sqlite3.Row, entries: int = 0) -> dict[str, Any]:
    private = row["kind"] == "private"
    return {
        "slug": _slug(row),
        "name": _shown(row["name"], MAX_NAME, MAX_NAME_BYTES)[0],
        "kind": row["kind"],
        "description": _shown(row["description"], MAX_DESCRIPTION, MAX_DESCRIPTION_BYTES)[0],
        "archived": bool(row["archived"]),
        "entries": entries,
    }


def _need(who: Writer | None) -> Writer:
    if who is None:
        raise Refused(NO_CALLER)
    return who


def _me(who: Writer | None) -> str | None:
    """Whose private scope this caller sees (None: none)."""
    return who.owner if who is not None else None


def _placeholders(values: Sequence[Any]) -> str:
    return ", ".join("?" for _ in values)


def _wal(db: sqlite3.Connection, tries: int = 50) -> None:
    """WAL mode, also when other processes open the same new file at the same moment: the switch
    takes a lock SQLite's busy handler does not wait for (seen: "database is locked" from one of four
    openers at once), so it is tried again a few times."""
    for attempt in range(tries):
        try:
            db.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or attempt == tries - 1:
                raise
            time.sleep(0.01 * (attempt + 1))


class Store:
    def __init__(self, data_dir: Path, config: Config) -> None:
        self.config = config
        self.path = data_dir / DB_FILE
        self.listings = Listings()
        # Autocommit mode: every call opens its own transaction explicitly (`_tx`).
        self.db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self.db.row_factory = sqlite3.Row
        # WAL + NORMAL: a committed call survives the process being killed (not a power cut).
        # secure_delete: the pages a purge frees are overwritten, not left holding the secret.
        self.db.execute("PRAGMA busy_timeout = 5000")
        _wal(self.db)
        for pragma in ("synchronous = NORMAL", "foreign_keys = ON", "secure_delete = ON"):
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
        slugs = [r[0] for r in self.db.execute("SELECT slug FROM scope WHERE kind = 'project' ORDER BY slug LIMIT 20")]
        more = self.db.execute("SELECT count(*) FROM scope WHERE kind = 'project'").fetchone()[0] - len(slugs)
        return ", ".join([GLOBAL, f"{PRIVATE} (yours)", *slugs, *([f"and {more} more"] if more > 0 else [])])

    def _not_found(self, slug: str) -> Refused:
        return Refused(
            f"scope {slug!r} not found: the scopes you can use are {self._names()}; "
            "memory.scopes lists them, memory.create_scope makes a project scope"
        )

    def _find_scope(self, who: Writer | None, slug: Any, *, create_private: bool) -> sqlite3.Row | None:
        """The scope a caller names; None only for a private scope not yet created."""
        if slug == PRIVATE:
            me = _need(who).owner
            if me is None:
                raise Refused(NO_PRIVATE)
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
        self._not_archived(row)
        return row

    def _not_archived(self, scope: sqlite3.Row) -> None:
        if scope["archived"]:
            raise Refused(
                f"scope {_slug(scope)!r} is archived, so it is read-only: write to another scope "
                f"(e.g. {GLOBAL!r} or an active project; memory.scopes lists them), or ask a scope admin to "
                "memory.unarchive_scope it"
            )

    def _policy(self) -> str:
        return ", ".join(self.config.scope_admins)

    def _manager(self, who: Writer | None, verb: str) -> Writer:
        me = _need(who)
        if not self.config.may_manage_scopes(me):
            raise Refused(
                f"{me.id} may not {verb} project scopes: the team's policy (scope_admins = "
                f"{self._policy()}) allows only those; ask one of them, or an operator "
                "to add you to MEMORY_SCOPE_ADMINS"
            )
        return me

    def _is_admin(self, who: Writer, scope: sqlite3.Row) -> bool:
        """A scope's admins: a private scope's owner; for the shared ones, the team's scope admins."""
        if scope["kind"] == "private":
            return scope["owner"] == who.owner
        return self.config.may_manage_scopes(who)

    def _counts(self, scope_ids: Sequence[int]) -> dict[int, int]:
        if not scope_ids:
            return {}
        rows = self.db.execute(
            f"SELECT scope_id, count(*) FROM entry WHERE forgotten = 0 AND scope_id IN ({_placeholders(scope_ids)}) "
            "GROUP BY scope_id",
            list(scope_ids),
        )
        return {r[0]: r[1] for r in rows}

    def scopes(
        self, who: Writer | None, *, include_private: Any = True, limit: Any = DEFAULT_SCOPES_LIMIT, cursor: Any = None
    ) -> Answer:
        """global, the projects by slug, the caller's private scope last; paged by a (rank, slug) cursor."""
        with self._tx(write=False):
            limit = check_int(limit, "limit", 1, MAX_SCOPES_LIMIT)
            if not isinstance(include_private, bool):
                raise Refused("include_private must be true or false")
            after_rank, after_slug = -1, ""
            if cursor is not None:
                after_rank, after_slug = _scope_cursor(cursor)
            rows = self.db.execute(
                "SELECT * FROM (SELECT *, CASE kind WHEN 'global' THEN 0 ELSE 1 END AS rank FROM scope "
                "WHERE kind != 'private') WHERE rank > ? OR (rank = ? AND slug > ?) ORDER BY rank, slug LIMIT ?",
                (after_rank, after_rank, after_slug, limit + 1),
            ).fetchall()
            listed: list[tuple[int, sqlite3.Row | None]] = [(r["rank"], r) for r in rows]
            if include_private and who is not None and who.owner is not None and after_rank < 2:
                listed.append((2, self._find_scope(who, PRIVATE, create_private=False)))
            counts = self._counts([r["id"] for _, r in listed if r is not None])
            found: list[dict[str, Any]] = []
            lines: list[str] = []
            budget = ReplyBudget()
            next_cursor = None
            last = (0, "")
            for rank, row in listed:
                if len(found) == limit:
                    next_cursor = _make_scope_cursor(*last)
                    break
                assert who is not None or row is not None
                shown = (
                    _scope(row, counts.get(row["id"], 0))
                    if row is not None
                    else {"slug": PRIVATE, "name": f"private ({_me(who)})", "kind": "private",
                          "description": "", "archived": False, "entries": 0}
                )
                line = render.scope_line(shown)
                if not budget.take(json_len(shown) + json_len(line)) and found:
                    next_cursor = _make_scope_cursor(*last)
                    break
                found.append(shown)
                lines.append(line)
                last = (rank, row["slug"] if row is not None and rank < 2 else PRIVATE)  # as stored: the key
            text = "\n".join(lines) or "no scopes"
            if next_cursor:
                text += f"\n(more: memory.scopes with cursor {next_cursor!r})"
            return Answer(text, {"scopes": found, "next_cursor": next_cursor})

    def create_scope(self, who: Writer | None, slug: Any, name: Any, description: Any = None) -> Answer:
        with self._tx():
            self._manager(who, "create")
            check_slug(slug)
            if slug in (GLOBAL, PRIVATE):
                raise Refused(f"{slug!r} cannot be created: the global scope and each member's private scope always exist")
            name = check_name(name)
            description = check_description(description)
            existing = self.db.execute("SELECT archived FROM scope WHERE slug = ?", (slug,)).fetchone()
            if existing is not None:
                state = "archived" if existing["archived"] else "active"
                raise Refused(f"scope {slug!r} exists ({state}); a slug is never reused: choose another slug")
            self.db.execute(
                "INSERT INTO scope (slug, name, kind, description, created_at) VALUES (?, ?, 'project', ?, ?)",
                (slug, name, description, now()),
            )
            made = _scope(self.db.execute("SELECT * FROM scope WHERE slug = ?", (slug,)).fetchone())
            return Answer(f"created scope {json.dumps(made, ensure_ascii=False)}", made)

    def _project(self, who: Writer | None, slug: Any, verb: str) -> tuple[Writer, sqlite3.Row]:
        me = self._manager(who, verb)
        if slug in (GLOBAL, PRIVATE):
            raise Refused(f"{slug!r} cannot be {verb}d: only project scopes can")
        row = self._find_scope(me, slug, create_private=False)
        assert row is not None
        return me, row

    def _scope_answer(self, scope_id: int, text: str) -> Answer:
        row = self.db.execute("SELECT * FROM scope WHERE id = ?", (scope_id,)).fetchone()
        shown = _scope(row, self._counts([scope_id]).get(scope_id, 0))
        return Answer(text, shown)

    def _version_all(self, scope_id: int, me: Writer, action: str, stamp: str) -> int:
        """A version for each entry of the scope that is not forgotten (archive, unarchive)."""
        count = self.db.execute(
            "INSERT INTO entry_version SELECT id, version + 1, ?, ?, ?, ?, type, content, author, source, forgotten, NULL "
            "FROM entry WHERE scope_id = ? AND forgotten = 0",
            (action, stamp, me.id, me.via, scope_id),
        ).rowcount
        self.db.execute("UPDATE entry SET version = version + 1 WHERE scope_id = ? AND forgotten = 0", (scope_id,))
        return count

    def archive_scope(self, who: Writer | None, slug: Any) -> Answer:
        with self._tx():
            me, row = self._project(who, slug, "archive")
            if row["archived"]:
                return self._scope_answer(row["id"], f"scope {slug} was archived already")
            self.db.execute("UPDATE scope SET archived = 1 WHERE id = ?", (row["id"],))
            count = self._version_all(row["id"], me, "archive", now())
            return self._scope_answer(row["id"], f"archived scope {slug} (read-only; {_entries(count)} with a new version)")

    def unarchive_scope(self, who: Writer | None, slug: Any) -> Answer:
        with self._tx():
            me, row = self._project(who, slug, "unarchive")
            if not row["archived"]:
                return self._scope_answer(row["id"], f"scope {slug} is not archived")
            self.db.execute("UPDATE scope SET archived = 0 WHERE id = ?", (row["id"],))
            count = self._version_all(row["id"], me, "unarchive", now())
            return self._scope_answer(row["id"], f"unarchived scope {slug} (writable; {_entries(count)} with a new version)")

    def rename_scope(self, who: Writer | None, slug: Any, name: Any, description: Any = None) -> Answer:
        """A new name (and description) for global or a project scope; the slug never changes."""
        with self._tx():
            me = self._manager(who, "rename")
            if slug == PRIVATE:
                raise Refused("your private scope cannot be renamed: it is named after you")
            row = self._find_scope(me, slug, create_private=False)
            assert row is not None
            name = check_name(name)
            if description is None:
                self.db.execute("UPDATE scope SET name = ? WHERE id = ?", (name, row["id"]))
            else:
                self.db.execute(
                    "UPDATE scope SET name = ?, description = ? WHERE id = ?", (name, check_description(description), row["id"])
                )
            return self._scope_answer(row["id"], f"renamed scope {slug}: {name} (its slug stays {slug})")

    # --- entries ---------------------------------------------------------------------------

    def _row(self, who: Writer | None, entry_id: int) -> sqlite3.Row | None:
        """An entry the caller may see, forgotten or not."""
        return self.db.execute(
            f"SELECT {_ENTRY_COLUMNS}, s.owner {_FROM_ENTRY} WHERE e.id = :id AND {_VISIBLE}",
            {"id": entry_id, "me": _me(who)},
        ).fetchone()

    def _named(self, who: Writer | None, id: Any, scope: Any, key: Any, verb: str) -> sqlite3.Row:
        """The entry `id` or `scope` + `key` names, forgotten or not; Refused as "not found" otherwise."""
        if id is not None and (scope is not None or key is not None):
            raise Refused("give either id, or scope and key, not both")
        if id is not None:
            entry_id = check_id(id)
            row = self._row(who, entry_id)
            if row is None:
                raise Refused(f"not found: no entry with id {entry_id} that you can see; memory.recall finds ids")
            return row
        if scope is not None and key is not None:
            check_key(key)
            target = self._find_scope(who, scope, create_private=False)
            row = None if target is None else self.db.execute(
                f"SELECT {_ENTRY_COLUMNS}, s.owner {_FROM_ENTRY} WHERE e.scope_id = ? AND e.key = ?",
                (target["id"], key),
            ).fetchone()
            if row is None:
                raise Refused(f"not found: no entry with key {key!r} in scope {scope!r}")
            return row
        raise Refused(f"say which entry to {verb}: id, or scope and key")

    def _version(
        self, row_id: int, version: int, action: str, me: Writer, stamp: str, *, restored: int | None = None
    ) -> None:
        """The entry's state as it now is, recorded as `version`, made by `me`."""
        self.db.execute(
            "INSERT INTO entry_version SELECT id, ?, ?, ?, ?, ?, type, content, author, source, forgotten, ? "
            "FROM entry WHERE id = ?",
            (version, action, stamp, me.id, me.via, restored, row_id),
        )

    def _index(self, entry_id: int, content: str, key: str | None, *, replace: bool) -> None:
        if replace:
            self.db.execute("DELETE FROM entry_search WHERE rowid = ?", (entry_id,))
        self.db.execute(
            "INSERT INTO entry_search (rowid, content, key) VALUES (?, ?, ?)", (entry_id, indexed(content), key)
        )

    def _entry_answer(self, who: Writer, entry_id: int, verb: str) -> Answer:
        row = self._row(who, entry_id)
        assert row is not None
        entry = _entry(row)
        return Answer(f"{verb} {render.entry_line(entry)}", entry)

    def remember(self, who: Writer | None, content: Any, type: Any, key: Any = None, scope: Any = None) -> Answer:
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
                    "SELECT id, type, content, version, forgotten FROM entry WHERE scope_id = ? AND key = ?",
                    (target["id"], key),
                ).fetchone()
            if existing is None:
                entry_id = self.db.execute(
                    "INSERT INTO entry (scope_id, type, key, content, author, source, created_at, updated_at, version) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, 1)",
                    (target["id"], type, key, content, me.id, me.via, stamp, stamp),
                ).lastrowid
                assert entry_id is not None
                self._index(entry_id, content, key, replace=False)
                self._version(entry_id, 1, "remember", me, stamp)
                return self._entry_answer(me, entry_id, "remembered")
            entry_id = existing["id"]
            if not existing["forgotten"] and (existing["type"], existing["content"]) == (type, content):
                # The same statement again (a retried call, an agent repeating itself): nothing changes.
                return self._entry_answer(me, entry_id, "already remembered")
            # The key's statement changes (or comes back after a forget); its creation time stays.
            self.db.execute(
                "UPDATE entry SET type = ?, content = ?, author = ?, source = ?, updated_at = ?, version = ?, "
                "forgotten = 0 WHERE id = ?",
                (type, content, me.id, me.via, stamp, existing["version"] + 1, entry_id),
            )
            self._index(entry_id, content, key, replace=not existing["forgotten"])
            self._version(entry_id, existing["version"] + 1, "upsert", me, stamp)
            return self._entry_answer(me, entry_id, "remembered")

    def forget(self, who: Writer | None, *, id: Any = None, scope: Any = None, key: Any = None) -> Answer:
        """A tombstone: recall and load_context no longer show the entry; its history keeps it."""
        with self._tx():
            me = _need(who)
            row = self._named(me, id, scope, key, "forget")
            if row["forgotten"]:
                last = self._last_version(row["id"])
                raise Refused(
                    f"entry #{row['id']} is forgotten already (by {_short(last['changed_by'])} at {_short(last['changed_at'], 40)}): "
                    "memory.history shows its versions, memory.restore brings one back"
                )
            if row["archived"]:
                raise Refused(f"scope {_slug(row)!r} is archived, so it is read-only: its entries cannot be forgotten")
            version = row["version"] + 1
            self.db.execute("UPDATE entry SET forgotten = 1, version = ? WHERE id = ?", (version, row["id"]))
            self.db.execute("DELETE FROM entry_search WHERE rowid = ?", (row["id"],))
            self._version(row["id"], version, "forget", me, now())
            return Answer(
                f"forgot #{row['id']} (version {version}; memory.restore {{id: {row['id']}, version: {version - 1}}} "
                "brings it back)",
                {"forgotten": row["id"], "version": version},
            )

    def _last_version(self, entry_id: int) -> sqlite3.Row:
        row: sqlite3.Row = self.db.execute(
            "SELECT * FROM entry_version WHERE entry_id = ? ORDER BY version DESC LIMIT 1", (entry_id,)
        ).fetchone()
        return row

    def restore(self, who: Writer | None, id: Any, version: Any) -> Answer:
        """The entry as it read at `version`, as a new version; for that version's author and the scope's admins."""
        with self._tx():
            me = _need(who)
            entry_id = check_id(id)
            row = self._row(me, entry_id)
            if row is None:
                raise Refused(f"not found: no entry with id {entry_id} that you can see; memory.recall finds ids")
            wanted = check_int(version, "version", 1, row["version"])
            old = self.db.execute(
                "SELECT * FROM entry_version WHERE entry_id = ? AND version = ?", (entry_id, wanted)
            ).fetchone()
            if old is None:  # versions are 1..current without gaps; only a file edited by hand lacks one
                raise Refused(f"version {wanted} of #{entry_id} is not in its history: memory.history lists them")
            if old["forgotten"]:
                raise Refused(
                    f"version {wanted} of #{entry_id} is a forgotten state: restore a version that reads "
                    "(memory.history lists them)"
                )
            if old["author"] != me.id and not self._is_admin(me, row):
                raise Refused(
                    f"{me.id} may not restore version {wanted} of #{entry_id}: its author ({_short(old['author'])}) and the "
                    f"scope's admins (scope_admins = {self._policy()}) may; you may memory.remember the text again"
                )
            scope_row = self.db.execute("SELECT * FROM scope WHERE id = ?", (row["scope_id"],)).fetchone()
            self._not_archived(scope_row)
            if not row["forgotten"] and (row["type"], row["content"]) == (old["type"], old["content"]):
                raise Refused(f"nothing to restore: #{entry_id} reads as version {wanted} already")
            new, stamp = row["version"] + 1, now()
            self.db.execute(
                "UPDATE entry SET type = ?, content = ?, author = ?, source = ?, updated_at = ?, version = ?, "
                "forgotten = 0 WHERE id = ?",
                (old["type"], old["content"], old["author"], old["source"], stamp, new, entry_id),
            )
            self._index(entry_id, old["content"], row["key"], replace=not row["forgotten"])
            self._version(entry_id, new, "restore", me, stamp, restored=wanted)
            return self._entry_answer(me, entry_id, f"restored version {wanted} as version {new}:")

    def purge(self, who: Writer | None, id: Any) -> Answer:
        """The entry and its whole history erased, leaving only who purged it and when."""
        with self._tx():
            me = _need(who)
            entry_id = check_id(id)
            row = self._row(me, entry_id)
            if row is None:
                gone = self._purged(me, entry_id)
                if gone is not None:
                    raise Refused(f"entry #{entry_id} is purged already (by {gone['by']} at {gone['at']})")
                raise Refused(f"not found: no entry with id {entry_id} that you can see; memory.recall finds ids")
            if not self._is_admin(me, row):
                raise Refused(
                    f"{me.id} may not purge #{entry_id}: purging erases the entry and its history for good, so only "
                    f"the scope's admins (scope_admins = {self._policy()}) may; memory.forget hides it (and can be "
                    "undone)"
                )
            versions = self.db.execute("SELECT count(*) FROM entry_version WHERE entry_id = ?", (entry_id,)).fetchone()[0]
            stamp = now()
            self.db.execute("DELETE FROM entry_search WHERE rowid = ?", (entry_id,))
            self.db.execute("DELETE FROM entry_version WHERE entry_id = ?", (entry_id,))
            self.db.execute("DELETE FROM entry WHERE id = ?", (entry_id,))
            self.db.execute(
                "INSERT INTO purge (entry_id, scope_id, purged_at, purged_by, purged_via, versions) VALUES (?, ?, ?, ?, ?, ?)",
                (entry_id, row["scope_id"], stamp, me.id, me.via, versions),
            )
            # The index keeps a deleted row's words in its older segments until they merge: merge them now.
            self.db.execute("INSERT INTO entry_search (entry_search) VALUES ('optimize')")
            scope = _slug(row)
        # Out of the transaction: the write-ahead log still holds the old pages until a checkpoint empties it.
        self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return Answer(
            f"purged #{entry_id} by {me.id} at {stamp}: the entry and its history ({_versions(versions)}) are erased",
            {"purged": entry_id, "scope": scope, "by": me.id, "via": me.via, "at": stamp, "versions": versions},
        )

    def _purged(self, who: Writer | None, entry_id: int) -> dict[str, Any] | None:
        row = self.db.execute(
            f"SELECT p.*, s.slug, s.kind FROM purge p JOIN scope s ON s.id = p.scope_id "
            f"WHERE p.entry_id = :id AND {_VISIBLE}",
            {"id": entry_id, "me": _me(who)},
        ).fetchone()
        if row is None:
            return None
        return {
            "by": _short(row["purged_by"]),
            "via": _short(row["purged_via"], 16),
            "at": _short(row["purged_at"], 40),
            "versions": row["versions"],
            "scope": _slug(row),
        }

    def history(
        self,
        who: Writer | None,
        *,
        id: Any = None,
        scope: Any = None,
        key: Any = None,
        limit: Any = DEFAULT_HISTORY_LIMIT,
        cursor: Any = None,
    ) -> Answer:
        """An entry's versions, newest first, for whoever may read the entry; paged by version."""
        with self._tx(write=False):
            limit = check_int(limit, "limit", 1, MAX_HISTORY_LIMIT)
            if id is not None and scope is None and key is None:
                entry_id = check_id(id)
                if self._row(who, entry_id) is None and (gone := self._purged(who, entry_id)) is not None:
                    text = (
                        f"#{entry_id} was purged by {gone['by']} via {gone['via']} at {gone['at']}: it and its history "
                        f"({_versions(gone['versions'])}) were erased; nothing of its text is kept"
                    )
                    return Answer(text, {"id": entry_id, "scope": gone.pop("scope"), "key": None, "forgotten": None,
                                         "purged": gone, "versions": [], "next_cursor": None})
            row = self._named(who, id, scope, key, "show the history of")
            below = row["version"] + 1
            if cursor is not None:
                below = _history_cursor(cursor, row["id"])
            rows = self.db.execute(
                "SELECT * FROM entry_version WHERE entry_id = ? AND version < ? ORDER BY version DESC LIMIT ?",
                (row["id"], below, limit + 1),
            ).fetchall()
            # Versions are numbered 1, 2, ... without gaps: the extra row is the page's last one's "before".
            entry = _entry(row)
            head = (
                f"#{entry['id']} [{entry['scope']}]{' ' + entry['key'] if entry['key'] else ''}: "
                f"{_versions(row['version'])}{', forgotten' if row['forgotten'] else ''}"
            )
            versions: list[dict[str, Any]] = []
            lines = [head]
            budget = ReplyBudget()
            budget.take(json_len(head))
            next_cursor = None
            for i, v in enumerate(rows[:limit]):
                before = rows[i + 1]["content"] if i + 1 < len(rows) else None
                shown = _version_shown(v, before)
                line = render.version_line(shown)
                if not budget.take(json_len(shown) + json_len(line)) and versions:
                    next_cursor = _make_history_cursor(row["id"], v["version"] + 1)
                    break
                versions.append(shown)
                lines.append(line)
            else:
                if len(rows) > limit:
                    next_cursor = _make_history_cursor(row["id"], versions[-1]["version"])
            text = "\n".join(lines)
            if next_cursor:
                text += f"\n(older: memory.history with cursor {next_cursor!r})"
            return Answer(text, {
                "id": entry["id"],
                "scope": entry["scope"],
                "key": entry["key"],
                "forgotten": bool(row["forgotten"]),
                "purged": None,
                "versions": versions,
                "next_cursor": next_cursor,
            })

    def recall(
        self,
        who: Writer | None,
        *,
        key: Any = None,
        type: Any = None,
        scope: Any = None,
        query: Any = None,
        limit: Any = DEFAULT_LIMIT,
        cursor: Any = None,
    ) -> Answer:
        """What the caller may read: by words ranked by relevance (bm25, then the type's importance,
        then the newest), or without words newest first; paged by `next_cursor`."""
        with self._tx(write=False):
            me = _me(who)
            limit = check_int(limit, "limit", 1, MAX_LIMIT)
            where = [_VISIBLE, "e.forgotten = 0"]
            params: dict[str, Any] = {"me": me}
            if scope is not None:
                row = self._find_scope(who, scope, create_private=False)
                if row is None:  # the caller's private scope, never written to: nothing in it
                    return Answer("no entries", {"entries": [], "next_cursor": None})
                where.append("e.scope_id = :scope")
                params["scope"] = row["id"]
            if type is not None:
                where.append("e.type = :type")
                params["type"] = check_type(type)
            if key is not None:
                where.append("e.key = :key")
                params["key"] = check_key(key)
            if query is not None:
                params["query"] = fts_query(query)
                source = "FROM entry_search JOIN entry e ON e.id = entry_search.rowid JOIN scope s ON s.id = e.scope_id"
                where.append("entry_search MATCH :query")
                order = f"{_BM25}, {_TYPE_RANK}, {_NEWEST}"
            else:
                source, order = _FROM_ENTRY, _NEWEST
            arguments = json.dumps([key, type, scope, query], ensure_ascii=False)
            owner = who.id if who is not None else None
            listing_sql = f"SELECT e.id {source} WHERE {' AND '.join(where)} ORDER BY {order} LIMIT :n"

            if cursor is None:
                # Ranked, every match is scored and sorted whatever the LIMIT: take all the ids at once.
                first = MAX_LISTED + 1 if query is not None else limit + 1
                ids = [r[0] for r in self.db.execute(listing_sql, {**params, "n": first})]
                at, total, complete, token = 0, len(ids), len(ids) <= MAX_LISTED, None
            else:
                listing, at = self.listings.find(cursor, owner, arguments)
                ids, total, complete = list(listing.ids[at:at + limit]), len(listing.ids), listing.complete
                token = cursor.rpartition(".")[0].partition(".")[2]
            page_ids = ids[:limit]
            # The page's entries as they are now, still matching: one forgotten, or changed so that it no
            # longer matches, since the listing began is left out (not a gap: the others keep their places).
            rows = {
                r["id"]: r
                for r in self.db.execute(
                    f"SELECT {_ENTRY_COLUMNS} {source} WHERE {' AND '.join(where)} "
                    "AND e.id IN (SELECT value FROM json_each(:ids))",
                    {**params, "ids": json.dumps(page_ids)},
                )
            }
            entries: list[dict[str, Any]] = []
            lines: list[str] = []
            used = 0
            budget = ReplyBudget()
            for entry_id in page_ids:
                row = rows.get(entry_id)
                if row is not None:
                    entry = _entry(row)
                    line = render.entry_line(entry)
                    if not budget.take(json_len(entry) + json_len(line)) and entries:
                        break
                    entries.append(entry)
                    lines.append(line)
                used += 1
            next_cursor = None
            if at + used < total:
                if token is None:  # more than this page: the listing's order is kept for the next ones
                    everything = ids if query is not None else [
                        r[0] for r in self.db.execute(listing_sql, {**params, "n": MAX_LISTED + 1})
                    ]
                    complete = len(everything) <= MAX_LISTED
                    token = self.listings.open(owner, arguments, everything[:MAX_LISTED], complete)
                next_cursor = self.listings.cursor(token, at + used)
            text = "\n".join(lines) or "no entries"
            data: dict[str, Any] = {"entries": entries, "next_cursor": next_cursor}
            if next_cursor:
                text += f"\n(more: memory.recall with the same filters and cursor {next_cursor!r})"
            elif not complete:
                data["listing_cut"] = True
                text += f"\n(the listing stops after {MAX_LISTED} entries: narrow it by scope, type or query)"
            return Answer(text, data)

    # --- load_context ----------------------------------------------------------------------

    def load_context(self, who: Writer | None, projects: Any = None, budget_chars: Any = DEFAULT_BUDGET) -> Answer:
        with self._tx(write=False):
            budget = check_int(budget_chars, "budget_chars", 1, MAX_BUDGET)
            if projects is None:
                projects = []
            if not isinstance(projects, list) or not all(isinstance(p, str) for p in projects):
                raise Refused("projects must be a list of project slugs, e.g. [\"billing-platform\"]")
            if len(projects) > MAX_PROJECTS:
                raise Refused(f"projects names {len(projects)} scopes, more than {MAX_PROJECTS}: name the ones this task needs")
            sections: list[sqlite3.Row] = [self._find_scope(who, GLOBAL, create_private=False)]  # type: ignore[list-item]
            for slug in dict.fromkeys(projects):  # in the order given, each once
                if slug in (GLOBAL, PRIVATE):
                    raise Refused(f"{slug!r} is not a project: global and your private scope are always included")
                sections.append(self._find_scope(who, slug, create_private=False))  # type: ignore[arg-type]
            if who is not None and who.owner is not None:
                mine = self._find_scope(who, PRIVATE, create_private=False)
                if mine is not None:
                    sections.append(mine)
            return self._pack(sections, budget)

    def _pack(self, sections: list[sqlite3.Row], budget: int) -> Answer:
        """The most important entries first (the type, then the section, then the newest) while they fit;
        one that does not fit is left out (and counted) and the next is tried. The text is then laid out
        by section. Every character of the text counts; the reply's bytes stay under its bound too."""
        rank = {s["id"]: i for i, s in enumerate(sections)}
        headers = {s["id"]: render.context_header(_scope(s)["slug"], _scope(s)["name"]) for s in sections}
        ids = list(rank)
        section_rank = "CASE e.scope_id " + " ".join(f"WHEN {i} THEN {r}" for i, r in rank.items()) + " END"
        chosen: dict[int, list[tuple[dict[str, Any], str]]] = {i: [] for i in ids}
        left = budget
        replies = ReplyBudget()
        # The answer's own fields: truncated, left_out (a slug and a count per section), the note, twice.
        replies.take(3 * sum(len(_scope(s)["slug"]) + 24 for s in sections) + 256)
        # Each entry's line length at least, from SQL, so one that cannot fit is never read whole: its
        # content's characters as answers show it (clipped: at least 3,000 when its bytes are cut), its
        # label ("- [type] key: ", "\n"). Plain tuples: the loop may pass every entry of the scopes.
        candidates = self.db.cursor()
        candidates.row_factory = None
        candidates.execute(
            f"SELECT e.id, e.scope_id, length(e.type) + 6 + coalesce(length(e.key) + 2, 0) + CASE WHEN "
            f"length(CAST(e.content AS BLOB)) <= {MAX_CONTENT_BYTES} THEN min(length(e.content), {MAX_CONTENT}) "
            f"ELSE {MAX_CONTENT_BYTES // 4} END "
            f"FROM entry e WHERE e.forgotten = 0 AND e.scope_id IN ({_placeholders(ids)}) "
            f"ORDER BY {_TYPE_RANK}, {section_rank}, {_NEWEST}",
            ids,
        )
        for entry_id, scope_id, at_least in candidates:
            if left < _MIN_CONTEXT_LINE:
                break  # nothing more can fit; what is left is counted below
            header = 0 if chosen[scope_id] else len(headers[scope_id])
            if at_least + header > left:
                continue
            row = self.db.execute(f"SELECT {_ENTRY_COLUMNS} {_FROM_ENTRY} WHERE e.id = ?", (entry_id,)).fetchone()
            entry = _entry(row)
            line = render.context_line(entry)
            cost = len(line) + header
            # Each line is in the text twice (the text, and structuredContent's copy), the entry once.
            size = 2 * json_len(line) + json_len(entry) + (2 * json_len(headers[scope_id]) if header else 0)
            if cost > left or not replies.take(size):
                continue  # does not fit: the next, smaller or less important, may
            left -= cost
            chosen[scope_id].append((entry, line))
        candidates.close()
        counts = self._counts(ids)
        text_parts, entries = [], []
        left_out: dict[str, int] = {}
        for s in sections:
            picked = chosen[s["id"]]
            slug = _scope(s)["slug"]
            left_out[slug] = counts.get(s["id"], 0) - len(picked)
            if picked:
                text_parts.append(headers[s["id"]])
                for entry, line in picked:  # in packing order: within a section, the type's, then the newest
                    text_parts.append(line)
                    entries.append(entry)
        text = "".join(text_parts)
        truncated = any(left_out.values())
        if truncated:
            note = "(left out for the budget: " + ", ".join(f"{k} {v}" for k, v in left_out.items() if v) + \
                "; memory.recall finds them)\n"
            if len(text) + len(note) <= budget:
                text += note
        assert len(text) <= budget
        return Answer(text or "no entries", {"text": text, "entries": entries, "truncated": truncated, "left_out": left_out})


def _entries(count: int) -> str:
    return f"{count} entr{'y' if count == 1 else 'ies'}"


def _versions(count: int) -> str:
    return f"{count} version{'' if count == 1 else 's'}"


def _version_shown(v: sqlite3.Row, before: str | None) -> dict[str, Any]:
    content = _shown(v["content"], MAX_CONTENT, MAX_CONTENT_BYTES)[0]
    return {
        "version": v["version"],
        "action": _short(v["action"], 16),
        "at": _short(v["changed_at"], 40),
        "by": _short(v["changed_by"]),
        "via": _short(v["changed_via"], 16),
        "type": _short(v["type"], 32),
        "content": content,
        "author": _short(v["author"]),
        "source": _short(v["source"], 16),
        "forgotten": bool(v["forgotten"]),
        "restored": v["restored"],
        "before": None if before is None else _shown(before, MAX_CONTENT, MAX_CONTENT_BYTES)[0],
    }


_BAD_CURSOR = (
    "cursor is not one this memory gave: pass next_cursor from the previous answer unchanged, or leave it out "
    "for the first page"
)


def _history_cursor(cursor: Any, entry_id: int) -> int:
    if isinstance(cursor, str) and len(cursor) <= MAX_CURSOR:
        kind, _, rest = cursor.partition(".")
        of, _, below = rest.partition(".")
        if kind == "h" and of.isdigit() and below.isdigit():
            if int(of) != entry_id:
                raise Refused("cursor belongs to the history of another entry: pass it with the same id (or scope and key)")
            return int(below)
    raise Refused(_BAD_CURSOR)


def _make_history_cursor(entry_id: int, below: int) -> str:
    return f"h.{entry_id}.{below}"


def _scope_cursor(cursor: Any) -> tuple[int, str]:
    if isinstance(cursor, str) and len(cursor) <= MAX_CURSOR:
        kind, _, rest = cursor.partition(".")
        rank, _, slug = rest.partition(".")
        if kind == "s" and rank in ("0", "1", "2"):
            return int(rank), slug
    raise Refused(_BAD_CURSOR)


def _make_scope_cursor(rank: int, slug: str) -> str:
    return f"s.{rank}.{slug}"
