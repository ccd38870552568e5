"""The memory module's store, in-process: the model's rules without a child (fast).

The same rules are proven again through a real child in tests/test_memory.py; here each
rule gets its edge cases cheaply.
"""

from __future__ import annotations

import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "bundles" / "memory" / "src"
if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))

from memory.config import Config, ConfigError, Project, load_config  # noqa: E402
from memory.model import TYPES, Refused, Writer  # noqa: E402
from memory.schema import VERSION, SchemaTooNew, migrate  # noqa: E402
from memory.store import DB_FILE, Store  # noqa: E402

ALICE = Writer(id="ALICE/alice", account="ALICE", via="bus")
BOB = Writer(id="BOB/bob", account="BOB", via="mcp")
OPERATOR = Writer(id="MESH", account="MESH", via="local")
BILLING = Project("billing", "Billing platform", "Invoices and payments")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path, Config(projects=(BILLING,)))
    yield s
    s.close()


def test_remember_takes_author_and_source_from_the_writer(store: Store) -> None:
    entry = store.remember(ALICE, "  Postgres is the system of record. ", "decision", "db.system-of-record")
    assert entry["author"] == "ALICE/alice" and entry["source"] == "bus"
    assert entry["scope"] == "global" and entry["content"] == "Postgres is the system of record."
    assert entry["created_at"] == entry["updated_at"]
    by_bob = store.remember(BOB, "Use UTC everywhere.", "convention", scope="billing")
    assert (by_bob["author"], by_bob["source"], by_bob["scope"]) == ("BOB/bob", "mcp", "billing")


def test_key_upserts_within_its_scope(store: Store) -> None:
    first = store.remember(ALICE, "Release on Tuesdays.", "convention", "release.day")
    again = store.remember(BOB, "Release on Thursdays.", "decision", "release.day")
    assert again["id"] == first["id"] and again["content"] == "Release on Thursdays." and again["type"] == "decision"
    assert again["created_at"] == first["created_at"] and again["updated_at"] > first["updated_at"]
    assert again["author"] == "BOB/bob"  # the author of the statement as it now reads
    elsewhere = store.remember(ALICE, "Billing releases on Mondays.", "convention", "release.day", scope="billing")
    assert elsewhere["id"] != first["id"]
    assert len(store.recall(ALICE, key="release.day")) == 2


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
def test_remember_refuses_with_what_would_be_right(store: Store, bad: dict, fragment: str) -> None:
    args = {"content": "A statement.", "type": "status", "key": None, "scope": None, **bad}
    with pytest.raises(Refused, match=None) as e:
        store.remember(ALICE, args["content"], args["type"], args["key"], args["scope"])
    assert fragment in str(e.value)
    assert store.recall(ALICE) == []  # nothing half-written


def test_no_caller_no_write(store: Store) -> None:
    with pytest.raises(Refused, match="carries no caller"):
        store.remember(None, "Anonymous.", "status")
    store.remember(ALICE, "Shared.", "status")
    assert [e["content"] for e in store.recall(None)] == ["Shared."]  # shared reads need no identity


def test_private_is_invisible_to_others(store: Store) -> None:
    secret = store.remember(ALICE, "My draft idea.", "open_question", "idea.draft", scope="private")
    store.remember(BOB, "Bob's own note.", "status", scope="private")
    shared = store.remember(BOB, "Shared status.", "status")
    assert secret["scope"] == "private"
    assert [e["id"] for e in store.recall(ALICE, scope="private")] == [secret["id"]]
    assert secret["id"] not in [e["id"] for e in store.recall(BOB)]
    assert store.recall(BOB, query="draft idea") == []
    assert store.recall(BOB, key="idea.draft") == []
    assert "My draft" not in store.load_context(BOB)["text"]
    with pytest.raises(Refused) as theirs:
        store.forget(BOB, id=secret["id"])
    with pytest.raises(Refused) as nobody:
        store.forget(BOB, id=10_000)
    # The same words for someone else's entry and for no entry at all: no hint that it exists.
    assert str(theirs.value) == str(nobody.value).replace("10000", str(secret["id"]))
    with pytest.raises(Refused, match="not found"):
        store.forget(BOB, scope="private", key="idea.draft")  # "private" is always the caller's own
    assert store.recall(ALICE, scope="private")[0]["content"] == "My draft idea."
    assert [e["id"] for e in store.recall(BOB, scope="global")] == [shared["id"]]


def test_recall_filters_and_order(store: Store) -> None:
    a = store.remember(ALICE, "Invoices are immutable once sent.", "constraint", "invoice.immutable", scope="billing")
    b = store.remember(ALICE, "A dunning run is the reminder cycle for unpaid invoices.", "glossary", "dunning")
    c = store.remember(BOB, "Migration to the new ledger is half done.", "status", "ledger.migration")
    assert [e["id"] for e in store.recall(ALICE)] == [c["id"], b["id"], a["id"]]  # newest first
    assert [e["id"] for e in store.recall(ALICE, query="invoices")] == [b["id"], a["id"]]
    assert [e["id"] for e in store.recall(ALICE, query="unpaid invoices")] == [b["id"]]  # every word
    assert [e["id"] for e in store.recall(ALICE, query="ledger")] == [c["id"]]
    assert [e["id"] for e in store.recall(ALICE, type="constraint")] == [a["id"]]
    assert [e["id"] for e in store.recall(ALICE, scope="billing")] == [a["id"]]
    assert [e["id"] for e in store.recall(ALICE, limit=1)] == [c["id"]]
    # FTS5 syntax in a query is just words: no error, no injection.
    assert store.recall(ALICE, query='invoices" OR "ledger') == []
    assert [e["id"] for e in store.recall(ALICE, query="invoices*")] == [b["id"], a["id"]]
    assert store.recall(ALICE, query="NEAR(invoices)") == []  # "near" is a word that must match too
    d = store.remember(ALICE, "We take card payments through Stripe.", "decision", "payments.psp")
    assert [e["id"] for e in store.recall(ALICE, query="psp")] == [d["id"]]  # the key is searched too
    with pytest.raises(Refused, match="no words to search for"):
        store.recall(ALICE, query="  ?! ")
    with pytest.raises(Refused, match="limit 0 is out of range"):
        store.recall(ALICE, limit=0)
    with pytest.raises(Refused, match="not one of the six"):
        store.recall(ALICE, type="rules")


def test_forget_by_id_and_by_key(store: Store) -> None:
    a = store.remember(ALICE, "Temporary.", "status", "tmp.one")
    b = store.remember(ALICE, "Temporary too.", "status", "tmp.two", scope="billing")
    assert store.forget(BOB, id=a["id"]) == a["id"]
    assert store.forget(BOB, scope="billing", key="tmp.two") == b["id"]
    assert store.recall(ALICE) == []
    assert store.recall(ALICE, query="temporary") == []  # gone from the text index too
    with pytest.raises(Refused, match="either id, or scope and key"):
        store.forget(ALICE, id=1, key="x")
    with pytest.raises(Refused, match="say which entry"):
        store.forget(ALICE, key="tmp.one")
    again = store.remember(ALICE, "Temporary.", "status", "tmp.one")
    assert again["id"] > b["id"]  # ids are never reused


def test_archived_scope_is_read_only(store: Store) -> None:
    kept = store.remember(ALICE, "Old rule.", "constraint", "old.rule", scope="billing")
    with pytest.raises(Refused, match="may not archive project scopes"):
        store.archive_scope(ALICE, "billing")
    assert store.archive_scope(OPERATOR, "billing")["archived"] is True
    with pytest.raises(Refused, match="'billing' is archived, so it is read-only"):
        store.remember(ALICE, "New rule.", "constraint", scope="billing")
    with pytest.raises(Refused, match="archived"):
        store.remember(ALICE, "Changed.", "constraint", "old.rule", scope="billing")
    with pytest.raises(Refused, match="archived"):
        store.forget(ALICE, id=kept["id"])
    assert store.recall(ALICE, scope="billing")[0]["content"] == "Old rule."  # still readable
    for slug in ("global", "private"):
        with pytest.raises(Refused, match="cannot be archived"):
            store.archive_scope(OPERATOR, slug)


def test_create_scope_by_policy(tmp_path: Path) -> None:
    store = Store(tmp_path, Config(scope_admins=("ALICE",)))
    with pytest.raises(Refused, match="BOB/bob may not create project scopes"):
        store.create_scope(BOB, "payments", "Payments")
    made = store.create_scope(ALICE, "payments", "Payments", "Money in and out")
    assert made == {
        "slug": "payments",
        "name": "Payments",
        "kind": "project",
        "description": "Money in and out",
        "archived": False,
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
    assert [s["slug"] for s in store.scopes(ALICE)] == ["global", "payments", "private"]
    assert [s["slug"] for s in store.scopes(None)] == ["global", "payments"]
    store.close()


def test_load_context_order_and_budget(store: Store) -> None:
    store.remember(ALICE, "Status of global.", "status")
    store.remember(ALICE, "Never delete invoices.", "constraint")
    store.remember(ALICE, "Billing decision.", "decision", scope="billing")
    store.remember(ALICE, "Alice's own reminder.", "status", scope="private")
    store.remember(BOB, "Bob's own reminder.", "status", scope="private")
    full = store.load_context(ALICE, ["billing"])
    assert [e["content"] for e in full["entries"]] == [
        "Never delete invoices.",
        "Status of global.",
        "Billing decision.",
        "Alice's own reminder.",
    ]
    assert full["text"].startswith("## global: Global\n- [constraint] Never delete invoices.\n")
    assert "## private:" in full["text"] and "Bob" not in full["text"] and full["truncated"] is False
    assert [e["content"] for e in store.load_context(ALICE)["entries"]][-1] == "Alice's own reminder."
    cut = store.load_context(ALICE, ["billing"], budget_chars=60)
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
    store = Store(tmp_path, config)
    assert store.remember(ALICE, "Lands in billing.", "status")["scope"] == "billing"
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
    store = Store(tmp_path, Config())
    assert store.db.execute("PRAGMA user_version").fetchone()[0] == VERSION
    [found] = store.recall(ALICE, query="kafka")
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
    store = Store(tmp_path, Config())
    assert store.db.execute("SELECT count(*) FROM scope WHERE kind = 'global'").fetchone()[0] == 1
    store.close()
