"""The SQLite schema, as numbered migrations recorded in PRAGMA user_version.

An upgrade delivers new code onto the old data folder: `migrate` applies, in one transaction
each, the migrations the file has not seen yet, so the data stays. A file newer than this
code (a downgrade) is refused rather than written by code that does not know its shape.
Append new migrations; never edit one that has shipped. A migration is SQL, or a function of
the connection when it needs the module's own code (schema 3 fills the new search index with
`search.indexed`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from .search import indexed

Migration = str | Callable[[sqlite3.Connection], None]

MIGRATIONS: tuple[Migration, ...] = (
    # 1: scopes and entries. A private scope's stored slug is never addressable by a caller
    # (callers say "private"); it exists only so the unique index covers one per owner.
    """
    CREATE TABLE scope (
        id INTEGER PRIMARY KEY,
        slug TEXT NOT NULL UNIQUE,
        name TEXT NOT NULL,
        kind TEXT NOT NULL CHECK (kind IN ('global', 'project', 'private')),
        description TEXT NOT NULL DEFAULT '',
        owner TEXT,
        archived INTEGER NOT NULL DEFAULT 0,
        created_at TEXT NOT NULL
    );
    CREATE UNIQUE INDEX scope_private_owner ON scope(owner) WHERE kind = 'private';
    CREATE TABLE entry (
        id INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused: a forgotten id stays forgotten
        scope_id INTEGER NOT NULL REFERENCES scope(id),
        type TEXT NOT NULL,
        key TEXT,
        content TEXT NOT NULL,
        author TEXT NOT NULL,
        source TEXT NOT NULL,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        UNIQUE (scope_id, key)
    );
    CREATE INDEX entry_newest ON entry(scope_id, updated_at DESC, id DESC);
    INSERT INTO scope (slug, name, kind, description, created_at)
        VALUES ('global', 'Global', 'global', 'The team-wide baseline, read first.', strftime('%Y-%m-%dT%H:%M:%fZ', 'now'));
    """,
    # 2: full-text search over content and key, kept in step by triggers; `rebuild` indexes
    # the entries a version-1 file already holds.
    """
    CREATE VIRTUAL TABLE entry_text USING fts5(content, key, content='entry', content_rowid='id');
    CREATE TRIGGER entry_text_insert AFTER INSERT ON entry BEGIN
        INSERT INTO entry_text (rowid, content, key) VALUES (new.id, new.content, new.key);
    END;
    CREATE TRIGGER entry_text_delete AFTER DELETE ON entry BEGIN
        INSERT INTO entry_text (entry_text, rowid, content, key) VALUES ('delete', old.id, old.content, old.key);
    END;
    CREATE TRIGGER entry_text_update AFTER UPDATE ON entry BEGIN
        INSERT INTO entry_text (entry_text, rowid, content, key) VALUES ('delete', old.id, old.content, old.key);
        INSERT INTO entry_text (rowid, content, key) VALUES (new.id, new.content, new.key);
    END;
    INSERT INTO entry_text (entry_text) VALUES ('rebuild');
    """,
    # 3: history, tombstones, purges, and search with stemming (see _schema_3).
    lambda db: _schema_3(db),
)
VERSION = len(MIGRATIONS)

_SCHEMA_3 = """
-- Every change of an entry is a version: the entry's state after it (type, content, whose
-- statement it is, forgotten or not), and who made the change, when, through what channel.
-- A version-2 file's entries begin their history with one 'import' version: as they read.
ALTER TABLE entry ADD COLUMN version INTEGER NOT NULL DEFAULT 1;
ALTER TABLE entry ADD COLUMN forgotten INTEGER NOT NULL DEFAULT 0;
CREATE TABLE entry_version (
    entry_id INTEGER NOT NULL REFERENCES entry(id) ON DELETE CASCADE,
    version INTEGER NOT NULL,
    action TEXT NOT NULL,
    changed_at TEXT NOT NULL,
    changed_by TEXT NOT NULL,
    changed_via TEXT NOT NULL,
    type TEXT NOT NULL,
    content TEXT NOT NULL,
    author TEXT NOT NULL,
    source TEXT NOT NULL,
    forgotten INTEGER NOT NULL,
    restored INTEGER,
    PRIMARY KEY (entry_id, version)
) WITHOUT ROWID;
INSERT INTO entry_version
    SELECT id, 1, 'import', updated_at, author, source, type, content, author, source, 0, NULL FROM entry;
-- A purged entry is gone with its history; only who purged it, and when, stays (no content, no key).
CREATE TABLE purge (
    entry_id INTEGER PRIMARY KEY,
    scope_id INTEGER NOT NULL REFERENCES scope(id),
    purged_at TEXT NOT NULL,
    purged_by TEXT NOT NULL,
    purged_via TEXT NOT NULL,
    versions INTEGER NOT NULL
);
DROP INDEX entry_newest;
CREATE INDEX entry_live ON entry(scope_id, forgotten, updated_at DESC, id DESC);
CREATE INDEX entry_recent ON entry(updated_at DESC, id DESC);
-- Search: the porter stemmer, prefixes, diacritics folded; a table of its own (not external
-- content): the store writes it beside the entry (search.indexed splits unspaced scripts), and
-- holds only entries that are not forgotten.
DROP TRIGGER entry_text_insert;
DROP TRIGGER entry_text_delete;
DROP TRIGGER entry_text_update;
DROP TABLE entry_text;
CREATE VIRTUAL TABLE entry_search USING fts5(
    content, key, tokenize = 'porter unicode61 remove_diacritics 2', prefix = '2 3'
);
"""


def _schema_3(db: sqlite3.Connection) -> None:
    for statement in _statements(_SCHEMA_3):
        db.execute(statement)
    rows = db.execute("SELECT id, content, key FROM entry").fetchall()
    db.executemany(
        "INSERT INTO entry_search (rowid, content, key) VALUES (?, ?, ?)",
        [(entry_id, indexed(content), key) for entry_id, content, key in rows],
    )


class SchemaTooNew(Exception):
    """The data file was written by a newer version of this module."""


def _statements(script: str) -> list[str]:
    """The script's statements, whole (a trigger's body with its own semicolons included)."""
    statements, pending = [], ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            statements.append(pending.strip())
            pending = ""
    return statements


def migrate(db: sqlite3.Connection, upto: int = VERSION) -> int:
    """Bring the file to schema `upto` (default: this code's); returns the version it had.

    Each step reads the version inside its own write transaction, so two processes opening
    the same file at once (a restarted child and an operator's tool) migrate it once.
    """
    found = db.execute("PRAGMA user_version").fetchone()[0]
    if found > VERSION:
        raise SchemaTooNew(
            f"the data file has schema version {found}, newer than this module's {VERSION}: it was written by a "
            "newer version of the memory module; deliver that version again (a downgrade would lose its changes)"
        )
    for number in range(found + 1, upto + 1):
        db.execute("BEGIN IMMEDIATE")
        try:
            if db.execute("PRAGMA user_version").fetchone()[0] < number:
                step = MIGRATIONS[number - 1]
                if callable(step):
                    step(db)
                else:
                    for statement in _statements(step):
                        db.execute(statement)
                db.execute(f"PRAGMA user_version = {number}")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
    return found
