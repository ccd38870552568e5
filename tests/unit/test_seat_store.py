"""The store identity of a stateful seat's folder (runtime/seats/store.py) and the replica's
helpers that need no bus (runtime/seats/replica.py)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from runtime.config import NatsConfig
from runtime.seats.replica import buckets, config_text, skip_ids
from runtime.seats.store import matches, move_aside, read_identity, what_is_there, write_identity
from runtime.wire.leases import HomeRecord

HOME = HomeRecord("n1", "memory", 1.0, store="00ff00ff00ff00ff", store_node="n1", store_since=1.0)


def test_a_folder_says_what_it_holds(tmp_path: Path) -> None:
    folder = tmp_path / "memory"
    assert what_is_there(folder, "memory") == "no folder"
    folder.mkdir()
    assert what_is_there(folder, "memory") == "an empty folder"
    (folder / "memory.sqlite3").write_bytes(b"x")
    assert what_is_there(folder, "memory") == "files without a store identity (memory.sqlite3)"
    write_identity(folder, "memory", HOME)
    assert matches(folder, "memory", HOME) and read_identity(folder, "memory").node == "n1"  # type: ignore[union-attr]
    other = HomeRecord("n1", "memory", 1.0, store="1111111111111111")
    assert not matches(folder, "memory", other)
    assert what_is_there(folder, "memory") == "store 00ff00ff00ff00ff (made on node n1), another store"


def test_an_unreadable_identity_is_none_and_an_old_copy_is_moved_aside_never_deleted(tmp_path: Path) -> None:
    folder = tmp_path / "memory"
    folder.mkdir()
    (folder / ".mesh-store-memory.json").write_text("not json")
    assert read_identity(folder, "memory") is None
    first, second = move_aside(folder), None
    folder.mkdir()
    second = move_aside(folder)
    assert first is not None and second is not None and first != second
    assert first.name.startswith("memory.stale-") and (first / ".mesh-store-memory.json").exists()
    assert move_aside(folder) is None  # nothing there: nothing to move


def test_ids_skip_after_an_unclean_takeover(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE e (id INTEGER PRIMARY KEY AUTOINCREMENT, v TEXT)")
    db.execute("INSERT INTO e (v) VALUES ('a')")
    db.commit()
    db.close()
    assert skip_ids(path, 100) == 1
    db = sqlite3.connect(path)
    db.execute("INSERT INTO e (v) VALUES ('b')")
    assert [r[0] for r in db.execute("SELECT id FROM e ORDER BY id")] == [1, 102]
    db.close()


def test_litestream_config_names_one_bucket_a_database_and_keeps_credentials_out_of_the_url() -> None:
    names = buckets("mesh-seat-memory-0a1b2c3d", ["a.db", "b.db"])
    assert names == ["mesh-seat-memory-0a1b2c3d-0", "mesh-seat-memory-0a1b2c3d-1"]
    bus = NatsConfig(url="nats://u:p@127.0.0.1:4222", user="u", password="p")
    text = config_text(Path("/d"), Path("/m"), ["a.db", "b.db"], names, bus, 1000)
    assert '"url": "nats://127.0.0.1:4222/mesh-seat-memory-0a1b2c3d-1"' in text and '"sync-interval": "1000ms"' in text
    assert '"username": "u"' in text and "u:p@" not in text
