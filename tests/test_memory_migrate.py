"""The memory's schema 3 migration, in-process and as the module's step (src/migrate.py run as
the node runs it): a version-2 file (full-text search without stems, no history) upgrades with
its data, its entries begin their history, the new search finds them; a migration that fails
changes nothing; the step's exit codes.

Through a real node, from the released module to this one: tests/test_memory_node.py.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.memory_store import ALICE, BOB, SRC, Memory, bounded  # first: the source on sys.path

# isort: split
from memory.config import Config
from memory.schema import VERSION, migrate
from memory.store import DB_FILE

SDK = Path(__file__).resolve().parent.parent / "sdk" / "python"


def version_2_file(path: Path) -> None:
    """A file as version 0.1.0 of the module left it: schema 2, written as its store wrote it
    (the text index kept by its triggers), a shared keyed entry, a private one, an upserted one."""
    db = sqlite3.connect(path, isolation_level=None)
    migrate(db, upto=2)
    db.execute(
        "INSERT INTO scope (slug, name, kind, owner, created_at) "
        "VALUES ('private/ALICE/alice', 'private (ALICE/alice)', 'private', 'ALICE/alice', '2026-01-01T00:00:00Z')"
    )
    rows = [
        (1, "decision", "invoice.numbering", "Invoices are numbered per year.", "ALICE/alice", "bus", "T1", "T1"),
        (2, "status", None, "Ask about the running freeze.", "ALICE/alice", "mcp", "T2", "T2"),
        (1, "constraint", "data.retention", "Retention is 90 days.", "BOB/bob", "bus", "T3", "T4"),
    ]
    for scope, type_, key, content, author, source, created, updated in rows:
        db.execute(
            "INSERT INTO entry (scope_id, type, key, content, author, source, created_at, updated_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                scope,
                type_,
                key,
                content,
                author,
                source,
                f"2026-01-0{created[1]}T00:00:00Z",
                f"2026-01-0{updated[1]}T00:00:00Z",
            ),
        )
    db.close()


def test_a_version_2_file_upgrades_with_its_data(tmp_path: Path) -> None:
    version_2_file(tmp_path / DB_FILE)
    store = Memory(tmp_path, Config())
    try:
        assert store.db.execute("PRAGMA user_version").fetchone()[0] == VERSION == 3
        tables = {r[0] for r in store.db.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'trigger')")}
        assert "entry_text" not in tables and "entry_text_insert" not in tables and "entry_version" in tables
        entries = {e["id"]: e for e in store.find(ALICE)}
        assert set(entries) == {1, 2, 3}
        assert (entries[3]["content"], entries[3]["author"], entries[3]["created_at"], entries[3]["updated_at"]) == (
            "Retention is 90 days.",
            "BOB/bob",
            "2026-01-03T00:00:00Z",
            "2026-01-04T00:00:00Z",
        )
        assert entries[2]["scope"] == "private" and [e["id"] for e in store.find(BOB)] == [3, 1]
        # The new search, on the old entries: a stem ("invoice") and a prefix ("freez").
        assert [e["id"] for e in store.find(ALICE, query="invoice")] == [1]
        assert [e["id"] for e in store.find(ALICE, query="run freez")] == [2]
        # Their history begins with them as they read.
        [first] = bounded(store.history(ALICE, id=3)).data["versions"]
        assert (first["version"], first["action"], first["by"], first["via"], first["at"]) == (
            1,
            "import",
            "BOB/bob",
            "bus",
            "2026-01-04T00:00:00Z",
        )
        changed = store.put(ALICE, "Retention is 30 days.", "constraint", "data.retention")
        assert (changed["id"], changed["version"], changed["created_at"]) == (3, 2, "2026-01-03T00:00:00Z")
        assert store.history(ALICE, id=3).data["versions"][0]["before"] == "Retention is 90 days."
        assert store.put(BOB, "A new one.", "status")["id"] == 4
    finally:
        store.close()


def test_a_failing_migration_changes_nothing(tmp_path: Path) -> None:
    version_2_file(tmp_path / DB_FILE)
    db = sqlite3.connect(tmp_path / DB_FILE, isolation_level=None)
    db.execute("CREATE TABLE entry_version (x)")  # in the way of schema 3's own table
    with pytest.raises(sqlite3.OperationalError, match="table entry_version already exists"):
        migrate(db)
    assert db.execute("PRAGMA user_version").fetchone()[0] == 2
    assert db.execute("SELECT count(*) FROM entry_text WHERE entry_text MATCH 'retention'").fetchone()[0] == 1
    columns = [r[1] for r in db.execute("PRAGMA table_info(entry)")]
    assert "version" not in columns and "forgotten" not in columns  # the ALTERs rolled back too
    db.close()


def run_step(data_dir: Path | None) -> subprocess.CompletedProcess[str]:
    """src/migrate.py as the node runs a step: from the bundle's source folder, MESH_DATA_DIR set."""
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(SDK)}
    if data_dir is not None:
        env["MESH_DATA_DIR"] = str(data_dir)
    return subprocess.run([sys.executable, "migrate.py"], cwd=SRC, env=env, capture_output=True, text=True, timeout=60)


def test_the_step_migrates_once_and_names_what_it_cannot_do(tmp_path: Path) -> None:
    version_2_file(tmp_path / DB_FILE)
    first = run_step(tmp_path)
    assert first.returncode == 0, first.stderr
    assert f"{tmp_path / DB_FILE}: schema 2 -> 3 in" in first.stderr
    again = run_step(tmp_path)
    assert again.returncode == 0 and "is at schema 3 already; nothing to do" in again.stderr
    db = sqlite3.connect(tmp_path / DB_FILE)
    assert db.execute("SELECT count(*) FROM entry_version").fetchone()[0] == 3
    db.execute(f"PRAGMA user_version = {VERSION + 1}")
    db.close()
    newer = run_step(tmp_path)
    assert newer.returncode == 3 and "newer than this module's 3" in newer.stderr.splitlines()[-1]
    unset = run_step(None)
    assert unset.returncode == 2 and "MESH_DATA_DIR is not set" in unset.stderr
