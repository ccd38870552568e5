"""The memory module's store, in-process: the model's rules without a child (fast).

The same rules are proven again through a real child in tests/test_memory.py; here each
rule gets its edge cases cheaply.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.memory_store import ALICE, BILLING, BOB, OPERATOR, Memory  # first: the module's source on sys.path

# isort: split
from memory.config import Config, ConfigError, load_config
from memory.model import TYPES, Refused
from memory.schema import VERSION, SchemaTooNew, migrate
from memory.store import DB_FILE, Store


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Memory]:
    s = Memory(tmp_path, Config(projects=(BILLING,)))
    yield s
    s.close()


def test_remember_takes_author_and_source_from_the_writer(store: Memory) -> None:
    entry = store.put(ALICE, "  Postgres is the system of record. ", "decision", "db.system-of-record")
    assert entry["author"] == "ALICE/alice" and entry["source"] == "bus"
    assert entry["scope"] == "global" and entry["content"] == "Postgres is the system of record."
    assert entry["created_at"] == entry["updated_at"]
    by_bob = store.put(BOB, "Use UTC everywhere.", "convention", scope="billing")
    assert (by_bob["author"], by_bob["source"], by_bob["scope"]) == ("BOB/bob", "mcp", "billing")


def test_key_upserts_within_its_scope(store: Memory) -> None:
    first = store.put(ALICE, "Release on Tuesdays.", "convention", "release.day")
    again = store.put(BOB, "Release on Thursdays.", "decision", "release.day")
    assert again["id"] == first["id"] and again["content"] == "Release on Thursdays." and again["type"] == "decision"
    assert again["created_at"] == first["created_at"] and again["updated_at"] > first["updated_at"]
    assert again["author"] == "BOB/bob"  # the author of the statement as it now reads
    elsewhere = store.put(ALICE, "Billing releases on Mondays.", "convention", "release.day", scope="billing")
    assert elsewhere["id"] != first["id"]
    assert len(store.find(ALICE, key="release.day")) == 2


@pytest.mark.parametrize(
    "bad, fragment",
    [
        (
            {"type": "rule"},
            "not one of the six types: decision, convention, constraint, open_question, glossary, status",
        ),
        ({"key": "DB.Record"}, "is not a key"),
        ({"key": "db..record"}, "is not a key"),
        ({"key": "db record"}, "is not a key"),
        ({"content": "   "}, "content is empty"),
        ({"content": "x" * 4001}, "split it into several entries"),
        (
            {"scope": "nowhere"},
            "scope 'nowhere' not found: the scopes you can use are global, private (yours), billing",
        ),
        ({"scope": "private/BOB/bob"}, "is not a scope slug"),
        ({"scope": "Billing"}, "is not a scope slug"),
    ],
)
def test_remember_refuses_with_what_would_be_right(store: Memory, bad: dict, fragment: str) -> None:
    args = {"content": "A statement.", "type": "status", "key": None, "scope": None, **bad}
    with pytest.raises(Refused, match=None) as e:
        store.put(ALICE, args["content"], args["type"], args["key"], args["scope"])
    assert fragment in str(e.value)
    assert store.find(ALICE) == []  # nothing half-written


def test_no_caller_no_write(store: Memory) -> None:
    with pytest.raises(Refused, match="carries no caller"):
        store.put(None, "Anonymous.", "status")
    store.put(ALICE, "Shared.", "status")
    assert [e["content"] for e in store.find(None)] == ["Shared."]  # shared reads need no identity


def test_private_is_invisible_to_others(store: Memory) -> None:
    secret = store.put(ALICE, "My draft idea.", "open_question", "idea.draft", scope="private")
    store.put(BOB, "Bob's own note.", "status", scope="private")
    shared = store.put(BOB, "Shared status.", "status")
    assert secret["scope"] == "private"
    assert [e["id"] for e in store.find(ALICE, scope="private")] == [secret["id"]]
    assert secret["id"] not in [e["id"] for e in store.find(BOB)]
    assert store.find(BOB, query="draft idea") == []
    assert store.find(BOB, key="idea.draft") == []
    assert "My draft" not in store.load_context(BOB).data["text"]
    with pytest.raises(Refused) as theirs:
        store.forget(BOB, id=secret["id"])
    with pytest.raises(Refused) as nobody:
        store.forget(BOB, id=10_000)
    # The same words for someone else's entry and for no entry at all: no hint that it exists.
    assert str(theirs.value) == str(nobody.value).replace("10000", str(secret["id"]))
    with pytest.raises(Refused, match="not found"):
        store.forget(BOB, scope="private", key="idea.draft")  # "private" is always the caller's own
    assert store.find(ALICE, scope="private")[0]["content"] == "My draft idea."
    assert [e["id"] for e in store.find(BOB, scope="global")] == [shared["id"]]


def test_recall_filters_and_order(store: Memory) -> None:
    a = store.put(ALICE, "Invoices are immutable once sent.", "constraint", "invoice.immutable", scope="billing")
    b = store.put(ALICE, "A dunning run is the reminder cycle for unpaid invoices.", "glossary", "dunning")
    c = store.put(BOB, "Migration to the new ledger is half done.", "status", "ledger.migration")
    assert [e["id"] for e in store.find(ALICE)] == [c["id"], b["id"], a["id"]]  # newest first
    # Ranked: "invoice" in a's key and text outweighs it once in b's longer text.
    assert [e["id"] for e in store.find(ALICE, query="invoices")] == [a["id"], b["id"]]
    assert [e["id"] for e in store.find(ALICE, query="unpaid invoices")] == [b["id"]]  # every word
    assert [e["id"] for e in store.find(ALICE, query="ledger")] == [c["id"]]
    assert [e["id"] for e in store.find(ALICE, type="constraint")] == [a["id"]]
    assert [e["id"] for e in store.find(ALICE, scope="billing")] == [a["id"]]
    assert [e["id"] for e in store.find(ALICE, limit=1)] == [c["id"]]
    # FTS5 syntax in a query is just words: no error, no injection.
    assert store.find(ALICE, query='invoices" OR "ledger') == []
    assert [e["id"] for e in store.find(ALICE, query="invoices*")] == [a["id"], b["id"]]
    assert store.find(ALICE, query="NEAR(invoices)") == []  # "near" is a word that must match too
    d = store.put(ALICE, "We take card payments through Stripe.", "decision", "payments.psp")
    assert [e["id"] for e in store.find(ALICE, query="psp")] == [d["id"]]  # the key is searched too
    with pytest.raises(Refused, match="no words to search for"):
        store.find(ALICE, query="  ?! ")
    with pytest.raises(Refused, match="limit 0 is out of range"):
        store.find(ALICE, limit=0)
    with pytest.raises(Refused, match="not one of the six"):
        store.find(ALICE, type="rules")


def test_forget_by_id_and_by_key(store: Memory) -> None:
    a = store.put(ALICE, "Temporary.", "status", "tmp.one")
    b = store.put(ALICE, "Temporary too.", "status", "tmp.two", scope="billing")
    assert store.forget(BOB, id=a["id"]).data["forgotten"] == a["id"]
    assert store.forget(BOB, scope="billing", key="tmp.two").data["forgotten"] == b["id"]
    assert store.find(ALICE) == []
    assert store.find(ALICE, query="temporary") == []  # gone from the text index too
    with pytest.raises(Refused, match="either id, or scope and key"):
        store.forget(ALICE, id=1, key="x")
    with pytest.raises(Refused, match="say which entry"):
        store.forget(ALICE, key="tmp.one")
    # The key's entry comes back (a tombstone keeps its key), with its history.
    again = store.put(ALICE, "Temporary, again.", "status", "tmp.one")
    assert again["id"] == a["id"] and again["version"] == 3
    assert [v["action"] for v in store.history(ALICE, id=a["id"]).data["versions"]] == ["upsert", "forget", "remember"]
    # Bob forgot Alice's entry: allowed in a shared scope, and his name is on it.
    assert store.history(ALICE, id=b["id"]).data["versions"][0]["by"] == "BOB/bob"
    store.purge(OPERATOR, a["id"])
    fresh = store.put(ALICE, "Temporary.", "status", "tmp.one")
    assert fresh["id"] > b["id"]  # ids are never reused, not even a purged one's


def test_archived_scope_is_read_only(store: Memory) -> None:
    kept = store.put(ALICE, "Old rule.", "constraint", "old.rule", scope="billing")
    with pytest.raises(Refused, match="may not archive project scopes"):
        store.archive_scope(ALICE, "billing")
    assert store.archive_scope(OPERATOR, "billing").data["archived"] is True
    with pytest.raises(Refused, match="'billing' is archived, so it is read-only"):
        store.put(ALICE, "New rule.", "constraint", scope="billing")
    with pytest.raises(Refused, match="archived"):
        store.put(ALICE, "Changed.", "constraint", "old.rule", scope="billing")
    with pytest.raises(Refused, match="archived"):
        store.forget(ALICE, id=kept["id"])
    assert store.find(ALICE, scope="billing")[0]["content"] == "Old rule."  # still readable
    for slug in ("global", "private"):
        with pytest.raises(Refused, match="cannot be archived"):
            store.archive_scope(OPERATOR, slug)


def test_create_scope_by_policy(tmp_path: Path) -> None:
    store = Memory(tmp_path, Config(scope_admins=("ALICE",)))
    with pytest.raises(Refused, match="BOB/bob may not create project scopes"):
        store.create_scope(BOB, "payments", "Payments")
    made = store.create_scope(ALICE, "payments", "Payments", "Money in and out").data
    assert made == {
        "slug": "payments",
        "name": "Payments",
        "kind": "project",
        "description": "Money in and out",
        "archived": False,
        "entries": 0,
    }
    with pytest.raises(Refused, match="exists \\(active\\); a slug is never reused"):
        store.create_scope(ALICE, "payments", "Again")
    for slug in ("global", "private"):
        with pytest.raises(Refused, match="always exist"):
            store.create_scope(ALICE, slug, "X")
    with pytest.raises(Refused, match="not a scope slug"):
        store.create_scope(ALICE, "Pay Ments", "X")
    with pytest.raises(Refused, match="may not create"):
        store.create_scope(OPERATOR, "ops", "Ops")  # "@local" is not in this policy
    assert [s["slug"] for s in store.scopes(ALICE).data["scopes"]] == ["global", "payments", "private"]
    assert [s["slug"] for s in store.scopes(None).data["scopes"]] == ["global", "payments"]
    store.close()


def test_load_context_order_and_budget(store: Memory) -> None:
    store.put(ALICE, "Status of global.", "status")
    store.put(ALICE, "Never delete invoices.", "constraint")
    store.put(ALICE, "Billing decision.", "decision", scope="billing")
    store.put(ALICE, "Alice's own reminder.", "status", scope="private")
    store.put(BOB, "Bob's own reminder.", "status", scope="private")
    full = store.load_context(ALICE, ["billing"]).data
    assert [e["content"] for e in full["entries"]] == [
        "Never delete invoices.",
        "Status of global.",
        "Billing decision.",
        "Alice's own reminder.",
    ]
    assert full["text"].startswith("## global: Global\n- [constraint] Never delete invoices.\n")
    assert "## private:" in full["text"] and "Bob" not in full["text"] and full["truncated"] is False
    assert [e["content"] for e in store.load_context(ALICE).data["entries"]][-1] == "Alice's own reminder."
    cut = store.load_context(ALICE, ["billing"], budget_chars=60).data
    assert len(cut["text"]) <= 60 and cut["truncated"] is True
    assert [e["content"] for e in cut["entries"]] == ["Never delete invoices."]
    with pytest.raises(Refused, match="not found"):
        store.load_context(ALICE, ["nowhere"])
    with pytest.raises(Refused, match="always included"):
        store.load_context(ALICE, ["private"])


def test_configuration_from_file_and_environment(tmp_path: Path) -> None:
    (tmp_path / "memory.toml").write_text(
        'default_scope = "billing"\nscope_admins = ["ALICE/alice"]\n'
        '[[project]]\nslug = "billing"\nname = "Billing"\n[[project]]\nslug = "ops"\nname = "Operations"\n'
    )
    config = load_config(tmp_path, {})
    assert config.default_scope == "billing" and config.scope_admins == ("ALICE/alice",)
    assert [p.slug for p in config.projects] == ["billing", "ops"]
    store = Memory(tmp_path, config)
    assert store.put(ALICE, "Lands in billing.", "status")["scope"] == "billing"
    store.close()
    env = load_config(
        tmp_path, {"MEMORY_PROJECTS": "web=Web shop, api", "MEMORY_DEFAULT_SCOPE": "global", "MEMORY_SCOPE_ADMINS": "*"}
    )
    assert [(p.slug, p.name) for p in env.projects] == [("web", "Web shop"), ("api", "api")]
    assert env.may_manage_scopes(BOB)
    assert load_config(tmp_path / "none", {}) == Config(source="defaults")


@pytest.mark.parametrize(
    "env, fragment",
    [
        ({"MEMORY_DEFAULT_SCOPE": "private"}, "cannot be 'private'"),
        ({"MEMORY_DEFAULT_SCOPE": "nowhere"}, "neither 'global' nor a configured project"),
        ({"MEMORY_PROJECTS": "Bad Slug"}, "is not a scope slug"),
        ({"MEMORY_PROJECTS": "global"}, "always exist"),
        ({"MEMORY_PROJECTS": "a,a"}, "listed twice"),
    ],
)
def test_impossible_configuration_is_an_error(tmp_path: Path, env: dict[str, str], fragment: str) -> None:
    with pytest.raises(ConfigError, match=None) as e:
        load_config(tmp_path, env)
    assert fragment in str(e.value)


def test_an_old_schema_is_upgraded_and_keeps_its_data(tmp_path: Path) -> None:
    # A data file as version 1 of the schema left it (before full-text search existed).
    db = sqlite3.connect(tmp_path / DB_FILE, isolation_level=None)
    migrate(db, upto=1)
    db.execute(
        "INSERT INTO entry (scope_id, type, content, author, source, created_at, updated_at) "
        "VALUES (1, 'decision', 'Kafka was rejected.', 'ALICE', 'bus', '2026-01-01T00:00:00Z', '2026-01-01T00:00:00Z')"
    )
    db.close()
    store = Memory(tmp_path, Config())
    assert store.db.execute("PRAGMA user_version").fetchone()[0] == VERSION
    [found] = store.find(ALICE, query="kafka")
    assert found["content"] == "Kafka was rejected." and found["author"] == "ALICE"
    store.close()


def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / DB_FILE)
    db.execute(f"PRAGMA user_version = {VERSION + 1}")
    db.close()
    with pytest.raises(SchemaTooNew, match="newer version of the memory module"):
        Store(tmp_path, Config())


def test_six_types() -> None:
    assert sorted(TYPES) == sorted(["decision", "convention", "constraint", "open_question", "glossary", "status"])


def test_two_processes_opening_a_new_file_at_once_migrate_it_once(tmp_path: Path) -> None:
    # Separate connections racing on a fresh file, as a restarted child and an operator's tool might.
    import threading

    start = threading.Barrier(4)
    errors: list[BaseException] = []

    def open_one() -> None:
        start.wait()
        try:
            Store(tmp_path, Config()).close()
        except BaseException as e:  # noqa: BLE001 - collected and asserted below
            errors.append(e)

    threads = [threading.Thread(target=open_one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    store = Memory(tmp_path, Config())
    assert store.db.execute("SELECT count(*) FROM scope WHERE kind = 'global'").fetchone()[0] == 1
    store.close()
