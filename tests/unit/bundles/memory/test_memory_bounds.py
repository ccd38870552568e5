"""The memory's bounds in-process: every text's limits (characters and bytes after NFC, no
control characters but line breaks and tabs), load_context's budget counting every character it
sends and packing by importance, and no reply over MAX_REPLY_BYTES whatever the file holds (the
issue's flood, and a file written by hand).

The flood through a real node: tests/test_memory_flood.py.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.memory_store import (  # first: the source on sys.path
    ALICE,
    BILLING,
    BOB,
    OPERATOR,
    Memory,
    bounded,
    reply_bytes,
)

# isort: split
from memory.config import Config, Project
from memory.model import MAX_REPLY_BYTES, Refused
from memory.store import DB_FILE

FLOOD = "a" + "\x1c" * 3998 + "b"  # the issue's: 4,000 characters, whitespace to str.split()
TABS = "a" + "\t" * 3998 + "b"  # the same, made of a character a caller may send


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Memory]:
    s = Memory(tmp_path, Config(projects=(BILLING, Project("web", "Web shop"))))
    yield s
    s.close()


@pytest.mark.parametrize(
    "content, fragment",
    [
        (FLOOD, "content holds a control character (U+001C at character 2): only line breaks (\\n) and tabs"),
        ("line one\r\nline two", "(U+000D at character 9)"),
        ("nul\x00", "U+0000"),
        ("del\x7f", "U+007F"),
        ("next line\x85", "U+0085"),  # C1
        ("escape \x1b[31mred", "U+001B"),
        ("lone \ud800 surrogate", "not valid Unicode (it holds a lone UTF-16 surrogate)"),
        ("x" * 4001, "content has 4001 characters, more than 4000 (counted after Unicode NFC): an entry is one"),
        ("e\u0301" * 4001, "content has 4001 characters"),  # 8,002 code points sent, 4,001 after NFC
        ("😀" * 3001, "content has 12004 bytes in UTF-8, more than 12000"),
        (42, "content must be a text (a JSON string), not int"),
        (["a"], "content must be a text (a JSON string), not list"),
        (" \n\t ", "content is empty"),
    ],
)
def test_content_limits(store: Memory, content: Any, fragment: str) -> None:
    with pytest.raises(Refused) as e:
        store.remember(ALICE, content, "status")
    assert fragment in str(e.value)
    assert store.find(ALICE) == []


def test_texts_are_stored_in_nfc_and_counted_so(store: Memory) -> None:
    decomposed = "e\u0301" * 4000  # 8,000 code points: 4,000 characters once composed
    entry = store.put(ALICE, decomposed, "status")
    assert entry["content"] == "\u00e9" * 4000
    euros = store.put(ALICE, "€" * 4000, "status")  # 12,000 bytes: at the limit
    assert len(euros["content"].encode()) == 12_000
    lines = store.put(ALICE, "first line\n\tindented second", "status")
    assert lines["content"] == "first line\n\tindented second"
    fridge = store.put(ALICE, "Der Ku\u0308hlschrank la\u0308uft.", "glossary")  # stored composed
    assert fridge["content"] == "Der K\u00fchlschrank l\u00e4uft."
    assert [e["id"] for e in store.find(ALICE, query="Ku\u0308hlschrank")] == [fridge["id"]]  # a query too


@pytest.mark.parametrize(
    "name, description, fragment",
    [
        ("Two\nlines", None, "name holds a control character (U+000A at character 4): it is one line of text"),
        ("Tab\there", None, "U+0009"),
        ("x" * 201, None, "name has 201 characters, more than 200"),
        ("😀" * 151, None, "name has 604 bytes in UTF-8, more than 600"),
        ("   ", None, "name is empty"),
        ("Fine", "x" * 2001, "description has 2001 characters, more than 2000"),
        ("Fine", "bell\x07", "description holds a control character (U+0007"),
    ],
)
def test_scope_text_limits(store: Memory, name: str, description: str | None, fragment: str) -> None:
    with pytest.raises(Refused) as e:
        store.create_scope(OPERATOR, "ops", name, description)
    assert fragment in str(e.value)
    with pytest.raises(Refused) as again:
        store.rename_scope(OPERATOR, "billing", name, description)
    assert fragment in str(again.value)


def test_a_description_may_have_lines(store: Memory) -> None:
    made = store.create_scope(OPERATOR, "ops", "Operations", "Runs the nodes.\n\tAnd the bus.").data
    assert made["description"] == "Runs the nodes.\n\tAnd the bus."


def context(store: Memory, who: Any = ALICE, **args: Any) -> dict[str, Any]:
    answer = bounded(store.load_context(who, **args))
    data = answer.data
    assert len(data["text"]) <= args.get("budget_chars", 8000)
    return data


def test_load_context_skips_what_does_not_fit_and_goes_on(store: Memory) -> None:
    # The issue: one 3,990-character constraint and budget 3,000 returned 0 entries.
    store.put(ALICE, "C" * 3990, "constraint")
    store.put(ALICE, "Ledger migration is half done.", "status")
    store.put(ALICE, "Invoices are immutable.", "decision", scope="billing")
    store.put(ALICE, "Ask Bob about the freeze.", "open_question", scope="private")
    packed = context(store, projects=["billing"], budget_chars=3000)
    assert [e["content"] for e in packed["entries"]] == [
        "Ledger migration is half done.",
        "Invoices are immutable.",
        "Ask Bob about the freeze.",
    ]
    assert packed["truncated"] is True
    assert packed["left_out"] == {"global": 1, "billing": 0, "private": 0}
    assert packed["text"].endswith("(left out for the budget: global 1; memory.recall finds them)\n")


def test_load_context_packs_by_importance_across_scopes(store: Memory) -> None:
    store.put(ALICE, "Global status, old.", "status")
    store.put(ALICE, "Global status, new.", "status")
    store.put(ALICE, "Private constraint.", "constraint", scope="private")
    store.put(ALICE, "Billing decision.", "decision", scope="billing")
    store.put(ALICE, "Global glossary.", "glossary")
    full = context(store, projects=["billing"], budget_chars=200_000)
    assert full["text"] == (
        "## global: Global\n"
        "- [glossary] Global glossary.\n"
        "- [status] Global status, new.\n"
        "- [status] Global status, old.\n"
        "## billing: Billing platform\n"
        "- [decision] Billing decision.\n"
        "## private: private (ALICE/alice)\n"
        "- [constraint] Private constraint.\n"
    )
    # Room for little: the constraint and the decision win over global's glossary and statuses.
    need = len("## private: private (ALICE/alice)\n- [constraint] Private constraint.\n")
    need += len("## billing: Billing platform\n- [decision] Billing decision.\n")
    small = context(store, projects=["billing"], budget_chars=need)
    assert [e["content"] for e in small["entries"]] == ["Billing decision.", "Private constraint."]
    assert small["left_out"] == {"global": 3, "billing": 0, "private": 0}
    # A little more: the newest status before the older one.
    more = context(
        store, projects=["billing"], budget_chars=need + len("## global: Global\n- [glossary] Global glossary.\n") + 31
    )
    assert [e["content"] for e in more["entries"]][:2] == ["Global glossary.", "Global status, new."]


def test_the_budget_counts_every_character_sent(store: Memory) -> None:
    # 4,000 characters that are nearly all whitespace: counted as 4,000, not as 3 (the issue).
    for _ in range(5):
        store.put(ALICE, TABS, "status")
    store.put(ALICE, "Short one.", "decision")
    store.put(ALICE, "Two\nlines.", "decision")
    for budget in (1, 17, 18, 40, 60, 100, 4000, 4040, 8000, 8100, 12_100, 20_000, 200_000):
        packed = context(store, budget_chars=budget)
        # The text is exactly its headers and lines: nothing sent uncounted.
        assert len(packed["text"]) <= budget
        lines = sum(
            len("- [" + e["type"] + "] " + e["content"].replace("\n", "\n  ") + "\n") for e in packed["entries"]
        )
        header = len("## global: Global\n") if packed["entries"] else 0
        note = packed["text"].count("(left out") and len(packed["text"].splitlines(keepends=True)[-1])
        assert len(packed["text"]) == header + lines + note
    assert "- [decision] Two\n  lines.\n" in context(store)["text"]  # a line break stays inside its item
    assert len(context(store, budget_chars=8000)["entries"]) == 3  # both decisions and one of the tab entries


def test_the_flood_of_the_issue_is_refused_and_its_tab_twin_stays_bounded(store: Memory) -> None:
    with pytest.raises(Refused, match="U\\+001C"):
        store.remember(ALICE, FLOOD, "status")
    for _ in range(2900):
        store.remember(ALICE, TABS, "status")
    default = bounded(store.load_context(BOB))
    assert len(default.data["text"]) <= 8000 and len(default.data["entries"]) == 1
    assert default.data["left_out"] == {"global": 2899}
    widest = bounded(store.load_context(BOB, budget_chars=200_000))
    assert len(widest.data["text"]) <= 200_000
    # A tab is two bytes of JSON, and each line is sent twice: the bytes bound the reply first.
    assert reply_bytes(widest) <= MAX_REPLY_BYTES and widest.data["truncated"] is True
    assert sum(widest.data["left_out"].values()) + len(widest.data["entries"]) == 2900
    seen, cursor = 0, None
    while True:
        page = bounded(store.recall(BOB, limit=200, cursor=cursor)).data
        assert 0 < len(page["entries"]) < 200  # cut by bytes, not by the limit
        seen += len(page["entries"])
        if (cursor := page["next_cursor"]) is None:
            break
    assert seen == 2900


def write_raw(path: Path, rows: list[tuple[str, str]]) -> None:
    """Entries as a file may hold them whatever the module checks: written with SQL, not the store."""
    db = sqlite3.connect(path)
    db.executemany(
        "INSERT INTO entry (scope_id, type, content, author, source, created_at, updated_at) "
        "VALUES (1, ?, ?, 'ALICE/alice', 'bus', '2026-01-01T00:00:00Z', '2026-01-01T00:00:00Z')",
        rows,
    )
    db.execute(
        "INSERT INTO entry_version SELECT id, 1, 'import', updated_at, author, source, type, content, author, "
        "source, 0, NULL FROM entry WHERE id NOT IN (SELECT entry_id FROM entry_version)"
    )
    db.commit()
    db.close()


def test_a_file_holding_the_flood_still_answers_within_the_bound(store: Memory, tmp_path: Path) -> None:
    # As an older version (no control-character check) or a hand-edited file would hold it.
    write_raw(tmp_path / DB_FILE, [("status", FLOOD)] * 2900)
    for budget in (8000, 200_000):
        answer = bounded(store.load_context(BOB, budget_chars=budget))
        assert len(answer.data["text"]) <= budget and answer.data["truncated"] is True
    page = bounded(store.recall(BOB, limit=200))
    assert page.data["next_cursor"] is not None and len(page.data["entries"]) < 200
    assert bounded(store.history(BOB, id=1)).data["versions"][0]["content"] == FLOOD


def test_a_file_holding_more_than_any_caller_could_write_is_shown_clipped(store: Memory, tmp_path: Path) -> None:
    write_raw(tmp_path / DB_FILE, [("decision", "huge " + "\x1c" * 2_000_000)])
    [entry] = store.find(BOB)
    assert entry["clipped"] is True and len(entry["content"]) == 4000 and entry["content"].startswith("huge ")
    packed = bounded(store.load_context(BOB)).data
    assert [e["clipped"] for e in packed["entries"]] == [True] and len(packed["text"]) < 4100
    assert bounded(store.load_context(BOB, budget_chars=4000)).data["left_out"] == {"global": 1}
    assert len(bounded(store.history(BOB, id=entry["id"])).data["versions"][0]["content"]) == 4000


def test_every_list_is_paged_within_the_bound(store: Memory) -> None:
    for i in range(300):
        store.create_scope(OPERATOR, f"p{i:03d}", "N" * 200, "€" * 2000)
    seen: list[str] = []
    pages: list[int] = []
    cursor = None
    while True:
        answer = bounded(store.scopes(ALICE, limit=200, cursor=cursor))
        pages.append(len(answer.data["scopes"]))
        seen += [s["slug"] for s in answer.data["scopes"]]
        if (cursor := answer.data["next_cursor"]) is None:
            break
    assert seen == ["global", "billing", *(f"p{i:03d}" for i in range(300)), "web", "private"]
    assert len(pages) == 2 and pages[0] < 200  # the first page cut by bytes (6 KB a scope), not by the limit
    shared = [s["slug"] for s in store.scopes(ALICE, include_private=False, limit=200).data["scopes"]]
    assert "private" not in shared
