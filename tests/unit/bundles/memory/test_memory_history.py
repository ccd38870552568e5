"""The memory's history in-process: every change a version (who, when, via what, the text
before), forget a tombstone, restore for a version's author and the scope's admins, purge that
erases an entry with its history (down to the bytes of the file), scope rename and unarchive.

The same verbs through a real node and bus: tests/test_memory_bus.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.memory_store import ALICE, BILLING, BOB, OPERATOR, Memory, bounded  # first: the source on sys.path

# isort: split
from memory.config import Config
from memory.model import Refused, Writer
from memory.store import DB_FILE


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Memory]:
    s = Memory(tmp_path, Config(projects=(BILLING,)))
    yield s
    s.close()


def versions(store: Memory, who: Writer, **which: Any) -> list[dict[str, Any]]:
    return bounded(store.history(who, **which)).data["versions"]


def test_every_change_is_a_version_with_who_when_via_and_the_text_before(store: Memory) -> None:
    first = store.put(ALICE, "Retention is 30 days.", "constraint", "data.retention", scope="billing")
    store.put(BOB, "Retention is 90 days.", "decision", "data.retention", scope="billing")
    store.forget(BOB, scope="billing", key="data.retention")
    store.restore(ALICE, first["id"], 1)
    store.archive_scope(OPERATOR, "billing")
    store.unarchive_scope(OPERATOR, "billing")
    found = versions(store, ALICE, id=first["id"])
    assert [(v["version"], v["action"], v["by"], v["via"]) for v in found] == [
        (6, "unarchive", "local:MESH", "local"),
        (5, "archive", "local:MESH", "local"),
        (4, "restore", "ALICE/alice", "bus"),
        (3, "forget", "BOB/bob", "mcp"),
        (2, "upsert", "BOB/bob", "mcp"),
        (1, "remember", "ALICE/alice", "bus"),
    ]
    by_version = {v["version"]: v for v in found}
    assert by_version[1]["before"] is None and by_version[1]["content"] == "Retention is 30 days."
    assert by_version[2]["before"] == "Retention is 30 days." and by_version[2]["content"] == "Retention is 90 days."
    assert (by_version[2]["type"], by_version[2]["author"]) == ("decision", "BOB/bob")
    assert by_version[3]["forgotten"] is True and by_version[3]["content"] == "Retention is 90 days."
    # The restore brings alice's statement back as hers; who restored it is the version's "by".
    assert by_version[4]["restored"] == 1 and by_version[4]["author"] == "ALICE/alice"
    assert by_version[4]["content"] == "Retention is 30 days." and by_version[4]["forgotten"] is False
    assert all(v["at"].endswith("Z") for v in found)
    assert [v["at"] for v in found] == sorted((v["at"] for v in found), reverse=True)
    [now] = store.find(BOB, key="data.retention")
    assert (now["content"], now["type"], now["version"]) == ("Retention is 30 days.", "constraint", 6)
    # By scope and key: the same history.
    assert versions(store, BOB, scope="billing", key="data.retention") == found
    text = store.history(BOB, id=first["id"]).text
    v3 = next(line for line in text.splitlines() if line.startswith("v3 "))
    assert v3 == f"v3 {by_version[3]['at']} forgotten by BOB/bob via mcp"  # the text did not change: not repeated
    assert f"v2 {by_version[2]['at']} changed by BOB/bob via mcp: decision: Retention is 90 days.\n" in text
    assert "\n    before: Retention is 30 days.\n" in text
    assert "restored version 1 by ALICE/alice via bus: constraint: Retention is 30 days.\n" in text


def test_the_same_statement_again_is_no_new_version(store: Memory) -> None:
    first = store.put(ALICE, "Deploys on Tuesday.", "convention", "deploy.day")
    again = store.remember(BOB, "Deploys on Tuesday.", "convention", "deploy.day")
    assert again.text.startswith("already remembered #") and again.data == first
    assert len(versions(store, ALICE, id=first["id"])) == 1
    assert store.put(BOB, "Deploys on Tuesday.", "decision", "deploy.day")["version"] == 2  # the type changed


def test_forget_is_a_tombstone_that_history_keeps(store: Memory) -> None:
    entry = store.put(ALICE, "The wombat cache is warm at 9.", "status", "cache.wombat")
    store.put(ALICE, "Unrelated.", "status")
    store.forget(BOB, id=entry["id"])
    assert entry["id"] not in [e["id"] for e in store.find(ALICE)]
    assert store.find(ALICE, query="wombat") == [] and store.find(ALICE, key="cache.wombat") == []
    assert "wombat" not in store.load_context(ALICE, budget_chars=200_000).data["text"]
    assert [v["action"] for v in versions(store, ALICE, id=entry["id"])] == ["forget", "remember"]
    assert store.history(ALICE, id=entry["id"]).data["forgotten"] is True
    with pytest.raises(Refused, match=r"is forgotten already \(by BOB/bob at .*memory.restore brings one back"):
        store.forget(ALICE, id=entry["id"])
    # The tombstone keeps its key: remembering the key again brings the entry back, as a new version.
    back = store.put(ALICE, "The wombat cache is warm at 8.", "status", "cache.wombat")
    assert (back["id"], back["version"]) == (entry["id"], 3)
    assert [e["id"] for e in store.find(BOB, query="wombat")] == [entry["id"]]


def test_history_is_for_the_entrys_readers_only(store: Memory) -> None:
    secret = store.put(ALICE, "My own draft.", "open_question", "draft.one", scope="private")
    assert len(versions(store, ALICE, id=secret["id"])) == 1
    assert len(versions(store, ALICE, scope="private", key="draft.one")) == 1
    with pytest.raises(Refused) as theirs:
        store.history(BOB, id=secret["id"])
    with pytest.raises(Refused) as nobody:
        store.history(BOB, id=999)
    assert str(theirs.value) == str(nobody.value).replace("999", str(secret["id"]))
    with pytest.raises(Refused, match="not found"):
        store.history(BOB, scope="private", key="draft.one")  # bob's own private scope: no such key
    with pytest.raises(Refused, match="say which entry to show the history of"):
        store.history(ALICE)


def test_restore_is_for_the_versions_author_and_the_scopes_admins(store: Memory) -> None:
    entry = store.put(ALICE, "Kafka carries order events.", "decision", "events.bus")
    store.put(BOB, "RabbitMQ carries order events.", "decision", "events.bus")
    # bob may not bring back alice's version (he may write the text again himself).
    with pytest.raises(Refused, match=r"BOB/bob may not restore version 1 of #1: its author \(ALICE/alice\)"):
        store.restore(BOB, entry["id"], 1)
    restored = bounded(store.restore(ALICE, entry["id"], 1))
    assert restored.text.startswith("restored version 1 as version 3:")
    assert (restored.data["content"], restored.data["author"], restored.data["version"]) == (
        "Kafka carries order events.",
        "ALICE/alice",
        3,
    )
    # bob's own version is his to bring back; the scope admins may bring back any.
    assert store.restore(BOB, entry["id"], 2).data["content"] == "RabbitMQ carries order events."
    assert store.restore(OPERATOR, entry["id"], 1).data["content"] == "Kafka carries order events."
    with pytest.raises(Refused, match="nothing to restore: #1 reads as version 1 already"):
        store.restore(ALICE, entry["id"], 1)
    store.forget(BOB, id=entry["id"])
    forgotten_at = store.history(ALICE, id=entry["id"]).data["versions"][0]["version"]
    with pytest.raises(Refused, match=f"version {forgotten_at} of #1 is a forgotten state"):
        store.restore(OPERATOR, entry["id"], forgotten_at)
    with pytest.raises(Refused, match=f"version 0 is out of range: a whole number from 1 to {forgotten_at}"):
        store.restore(ALICE, entry["id"], 0)
    # A forgotten entry comes back by a restore, in recall and in the index.
    store.restore(ALICE, entry["id"], 1)
    assert [e["id"] for e in store.find(BOB, query="kafka")] == [entry["id"]]


def test_restore_and_forget_respect_archived_scopes_and_private_scopes(store: Memory) -> None:
    kept = store.put(ALICE, "Old rule.", "constraint", "old.rule", scope="billing")
    store.put(BOB, "Old rule, changed.", "constraint", "old.rule", scope="billing")
    store.archive_scope(OPERATOR, "billing")
    with pytest.raises(Refused, match="'billing' is archived, so it is read-only"):
        store.restore(ALICE, kept["id"], 1)
    mine = store.put(ALICE, "Draft one.", "status", "draft", scope="private")
    store.put(ALICE, "Draft two.", "status", "draft", scope="private")
    assert store.restore(ALICE, mine["id"], 1).data["content"] == "Draft one."
    with pytest.raises(Refused, match="not found"):
        store.restore(OPERATOR, mine["id"], 1)  # the admins do not see a private scope at all


def test_purge_erases_the_entry_and_its_history_down_to_the_files_bytes(tmp_path: Path) -> None:
    store = Memory(tmp_path, Config())
    secret = "sk_live_4eC39HqLyjWDarjtT1zdp7dc"
    for i in range(50):  # other entries before it, in the index's older segments
        store.put(ALICE, f"Filler entry number {i}.", "status")
    entry = store.put(ALICE, f"The API key is {secret}.", "constraint", "api.key")
    store.put(BOB, f"The API key is {secret}, do not share.", "constraint", "api.key")
    store.forget(BOB, id=entry["id"])
    store.restore(BOB, entry["id"], 2)  # back in the index
    with pytest.raises(
        Refused, match=f"BOB/bob may not purge #{entry['id']}: purging erases the entry and its history"
    ):
        store.purge(BOB, entry["id"])
    done = bounded(store.purge(OPERATOR, entry["id"]))
    assert done.data["purged"] == entry["id"] and done.data["by"] == "local:MESH" and done.data["versions"] == 4
    # The bytes, while the store is open: not in the database, not in its write-ahead log.
    files = [p for p in tmp_path.iterdir() if p.name.startswith(DB_FILE)]
    assert {p.name for p in files} >= {DB_FILE, f"{DB_FILE}-wal"}
    for path in files:
        raw = path.read_bytes()
        # The text, and the index's own copy of its words (lower-cased tokens).
        assert secret.encode() not in raw and b"sk_live" not in raw, path.name
        assert secret.split("_")[-1].lower().encode() not in raw, path.name
    # What stays: "purged by X at T", nothing of the text or the key.
    gone = bounded(store.history(ALICE, id=entry["id"]))
    assert gone.data["versions"] == [] and gone.data["key"] is None
    assert gone.data["purged"] == {"by": "local:MESH", "via": "local", "at": done.data["at"], "versions": 4}
    assert gone.text.startswith(f"#{entry['id']} was purged by local:MESH via local at {done.data['at']}")
    assert secret not in gone.text
    assert store.find(ALICE, query="sk_live_4eC39HqLyjWDarjtT1zdp7dc") == []
    with pytest.raises(Refused, match="not found"):
        store.history(ALICE, scope="global", key="api.key")
    with pytest.raises(Refused, match="is purged already"):
        store.purge(OPERATOR, entry["id"])
    assert store.put(ALICE, "A new key entry.", "status", "api.key")["id"] > entry["id"]  # the key is free again
    store.close()


def test_purge_by_a_private_scopes_owner_and_on_an_archived_scope(store: Memory) -> None:
    mine = store.put(BOB, "My password is hunter2.", "status", scope="private")
    assert store.purge(BOB, mine["id"]).data["scope"] == "private"  # not a scope admin, but it is his
    assert store.history(BOB, id=mine["id"]).data["purged"]["by"] == "BOB/bob"
    with pytest.raises(Refused, match="not found"):
        store.history(ALICE, id=mine["id"])  # someone else's private purge is not even a record for her
    leaked = store.put(ALICE, "Staging password: hunter3.", "status", scope="billing")
    store.archive_scope(OPERATOR, "billing")
    assert store.purge(OPERATOR, leaked["id"]).data["purged"] == leaked["id"]  # a secret goes, archived or not


def test_history_pages_without_repeats_or_gaps_as_versions_are_added(store: Memory) -> None:
    entry = store.put(ALICE, "Counter 0.", "status", "counter")
    for i in range(1, 120):
        store.put(ALICE if i % 2 else BOB, f"Counter {i}.", "status", "counter")
    seen: list[int] = []
    page = store.history(ALICE, id=entry["id"], limit=50).data
    while True:
        seen += [v["version"] for v in page["versions"]]
        store.put(BOB, f"Counter written while paging {len(seen)}.", "status", "counter")
        if page["next_cursor"] is None:
            break
        page = store.history(ALICE, id=entry["id"], limit=50, cursor=page["next_cursor"]).data
    assert seen == list(range(120, 0, -1))
    with pytest.raises(Refused, match="cursor belongs to the history of another entry"):
        other = store.put(ALICE, "Another.", "status", "another")
        store.history(ALICE, id=other["id"], cursor="h.1.5")
    with pytest.raises(Refused, match="cursor is not one this memory gave"):
        store.history(ALICE, id=entry["id"], cursor="h.x.y")


def test_a_history_of_large_versions_is_paged_by_bytes(store: Memory) -> None:
    entry = store.put(ALICE, "x" * 4000, "status", "big")
    for i in range(1, 200):
        store.put(ALICE, f"{i:04d}" + "é" * 3996, "status", "big")
    pages, seen, cursor = 0, [], None
    while True:
        answer = bounded(store.history(ALICE, id=entry["id"], limit=200, cursor=cursor))
        pages += 1
        seen += [v["version"] for v in answer.data["versions"]]
        if (cursor := answer.data["next_cursor"]) is None:
            break
    assert seen == list(range(200, 0, -1)) and pages > 1  # 200 versions of ~16 KB each pass one reply


def test_rename_and_unarchive_scope_for_the_scope_admins(store: Memory) -> None:
    with pytest.raises(Refused, match="ALICE/alice may not rename project scopes"):
        store.rename_scope(ALICE, "billing", "Billing and invoicing")
    renamed = bounded(store.rename_scope(OPERATOR, "billing", "Billing and invoicing", "Money in"))
    assert renamed.data == {
        "slug": "billing",
        "name": "Billing and invoicing",
        "kind": "project",
        "description": "Money in",
        "archived": False,
        "entries": 0,
    }
    assert renamed.text == "renamed scope billing: Billing and invoicing (its slug stays billing)"
    assert store.put(ALICE, "Still addressed as billing.", "status", scope="billing")["scope"] == "billing"
    assert store.rename_scope(OPERATOR, "global", "Team-wide").data["name"] == "Team-wide"
    with pytest.raises(Refused, match="your private scope cannot be renamed"):
        store.rename_scope(OPERATOR, "private", "Mine")
    with pytest.raises(Refused, match="name holds a control character"):
        store.rename_scope(OPERATOR, "billing", "Two\nlines")
    store.archive_scope(OPERATOR, "billing")
    with pytest.raises(Refused, match="ALICE/alice may not unarchive project scopes"):
        store.unarchive_scope(ALICE, "billing")
    back = store.unarchive_scope(OPERATOR, "billing")
    assert back.data["archived"] is False and back.data["entries"] == 1
    assert store.put(ALICE, "Writable again.", "status", scope="billing")["scope"] == "billing"
    assert store.unarchive_scope(OPERATOR, "billing").text == "scope billing is not archived"
    for slug in ("global", "private"):
        with pytest.raises(Refused, match="cannot be unarchived: only project scopes can"):
            store.unarchive_scope(OPERATOR, slug)
