"""The memory's search in-process: stems and prefixes (FTS5, porter), words of any language
matched exactly, bm25 with type and recency as tie-breakers, a caller's text never query syntax,
and cursors that neither repeat nor skip an entry while entries are added.

Through a real node and bus: tests/test_memory_bus.py and tests/test_memory_flood.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.memory_store import ALICE, BILLING, BOB, Memory, bounded  # first: the source on sys.path

# isort: split
from memory.config import Config
from memory.cursors import Listings
from memory.model import Refused
from memory.search import fts_query, indexed


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Memory]:
    s = Memory(tmp_path, Config(projects=(BILLING,)))
    yield s
    s.close()


def ids(store: Memory, **filters: Any) -> list[int]:
    return [e["id"] for e in store.find(ALICE, **filters)]


def test_stems_and_prefixes_match(store: Memory) -> None:
    invoice = store.put(ALICE, "Every invoice is numbered.", "convention")["id"]
    invoices = store.put(ALICE, "Invoices are immutable once sent.", "constraint")["id"]
    running = store.put(ALICE, "The nightly job keeps running until six.", "status")["id"]
    assert set(ids(store, query="invoice")) == {invoice, invoices}  # the issue: "invoice" found nothing
    assert set(ids(store, query="invoices")) == {invoice, invoices}
    assert set(ids(store, query="inv")) == {invoice, invoices}  # a prefix
    assert ids(store, query="run") == [running] and ids(store, query="runs") == [running]
    assert ids(store, query="numbered invoice") == [invoice]  # every word must match
    assert ids(store, query="numbered immutable") == []


def test_an_exact_word_ranks_above_a_prefix(store: Memory) -> None:
    login = store.put(ALICE, "The login page is served by nginx.", "status")["id"]
    log = store.put(ALICE, "Every request is written to the log.", "status")["id"]
    assert ids(store, query="log") == [log, login]


@pytest.mark.parametrize(
    "content, query",
    [
        ("Rechnungen werden monatlich versendet.", "Rechnungen"),
        ("Rechnungen werden monatlich versendet.", "rechnungen"),
        ("Счета отправляются ежемесячно.", "счета"),
        ("Ο λογαριασμός πληρώθηκε.", "λογαριασμός"),
        ("Le café ferme à minuit.", "café"),
        ("Le café ferme à minuit.", "cafe"),  # diacritics folded
        ("データベースはPostgresです。", "データベース"),  # written without spaces
        ("データベースはPostgresです。", "postgres"),
        ("数据库是系统的核心。", "数据库"),
        ("데이터베이스는 중요합니다.", "데이터베이스"),  # a particle joined to the word
        ("ฐานข้อมูลหลักคือโพสต์เกรส", "ฐานข้อมูล"),
        ("Der Kühlschrank läuft.", "Kühlschrank"),
    ],
)
def test_words_of_any_language_match_exactly(store: Memory, content: str, query: str) -> None:
    entry = store.put(ALICE, content, "glossary")["id"]
    store.put(ALICE, "An unrelated English sentence about caching.", "glossary")
    assert ids(store, query=query) == [entry]


def test_an_unspaced_phrase_does_not_match_its_characters_apart(store: Memory) -> None:
    together = store.put(ALICE, "数据库是系统的核心。", "glossary")["id"]
    store.put(ALICE, "数字是据说的仓库。", "glossary")  # 数, 据, 库 all there, not together
    assert ids(store, query="数据库") == [together]


def test_ranked_by_relevance_then_type_then_newest(store: Memory) -> None:
    weak = store.put(ALICE, "A long statement that mentions ledger once among many other words here.", "constraint")
    strong = store.put(ALICE, "Ledger ledger: the ledger.", "status")
    keyed = store.put(ALICE, "Balances are kept there.", "decision", "ledger.balances")
    assert ids(store, query="ledger")[0] in (strong["id"], keyed["id"])
    assert ids(store, query="ledger")[-1] == weak["id"]
    # Equal relevance (the same text): the more important type first, then the newest.
    status_old = store.put(ALICE, "Quartz freeze on Friday.", "status")["id"]
    constraint = store.put(ALICE, "Quartz freeze on Friday.", "constraint")["id"]
    status_new = store.put(ALICE, "Quartz freeze on Friday.", "status")["id"]
    assert ids(store, query="quartz freeze") == [constraint, status_new, status_old]
    # Without words: newest first.
    assert ids(store, limit=3) == [status_new, constraint, status_old]


HOSTILE = [
    'invoices" OR "ledger',
    "NEAR(invoices ledger, 2)",
    "invoices AND NOT ledger",
    "content:invoices",
    "{content key}: invoices",
    "invoices*",
    "^invoices",
    "-invoices",
    '"',
    '"""',
    "(",
    ")",
    "( invoices",
    "invoices +",
    "a" * 499,
    "*",
    "OR",
    "NOT",
    "ledger' OR 1=1 --",
    "\ninvoices\t",
]


@pytest.mark.parametrize("query", HOSTILE)
def test_a_callers_text_is_never_query_syntax(store: Memory, query: str) -> None:
    store.put(ALICE, "Invoices are in the ledger, or near it (and not elsewhere).", "status")
    try:
        bounded(store.recall(ALICE, query=query))
    except Refused as e:
        assert "no words to search for" in str(e)


def test_every_quote_is_doubled_and_every_piece_quoted() -> None:
    assert fts_query('say "hi"') == '("say" OR "say" *) AND ("""hi""" OR """hi""" *)'
    assert fts_query("数据库") == '" 数  据  库 "'  # a phrase, no prefix of one character
    assert indexed("Postgresです") == "Postgres で  す "


@pytest.mark.parametrize(
    "query, fragment",
    [
        ("  ?! ", "no words to search for"),
        ("x" * 501, "more than 500 (counted after Unicode NFC)"),
        (" ".join(["w"] * 33), "query has 33 words, more than 32"),
        ("bell\x07", "control character (U+0007"),
        (42, "query must be a text"),
    ],
)
def test_a_query_has_limits(store: Memory, query: Any, fragment: str) -> None:
    with pytest.raises(Refused) as e:
        store.recall(ALICE, query=query)
    assert fragment in str(e.value)


def page_through(store: Memory, write_between: Any = None, **filters: Any) -> list[int]:
    seen: list[int] = []
    answer = bounded(store.recall(ALICE, **filters)).data
    while True:
        seen += [e["id"] for e in answer["entries"]]
        if write_between is not None:
            write_between(len(seen))
        if answer["next_cursor"] is None:
            return seen
        answer = bounded(store.recall(ALICE, cursor=answer["next_cursor"], **filters)).data


@pytest.mark.parametrize("filters", [{}, {"query": "rule"}, {"query": "ledger rule"}, {"type": "decision"}])
def test_paging_2000_entries_while_200_more_are_written(store: Memory, filters: dict[str, Any]) -> None:
    words = "ledger invoice refund cart release deploy postgres kafka retention audit".split()
    types = ("decision", "convention", "constraint", "status")
    for i in range(2000):
        store.put(ALICE, f"Entry {i}: the {words[i % 10]} rule number {i}.", types[i % 4], f"k.n{i}" if i % 3 else None)
    expected = set(page_through(store, **filters))
    written = iter(range(200))
    per_page = -(-200 // -(-len(expected) // 37))  # all 200 written before the last page

    def write(_: int) -> None:  # new entries, and changed ones (an upsert moves an entry to the top)
        for _ in range(per_page):
            if (i := next(written, None)) is not None:
                store.put(BOB, f"Added {i}: another {words[i % 10]} rule.", types[i % 4])
                # Changed, still matching the filters (the same words, the same type).
                n = 3 * i + 1
                store.put(BOB, f"Entry {n}: the {words[n % 10]} rule number {n}, changed.", types[n % 4], f"k.n{n}")

    seen = page_through(store, write, limit=37, **filters)
    assert len(seen) == len(set(seen)), "an entry was repeated"
    assert set(seen) == expected, "an entry was skipped"
    assert next(written, None) is None  # all 200 were written while paging


def test_a_forgotten_entry_leaves_the_listing_without_a_gap(store: Memory) -> None:
    made = [store.put(ALICE, f"Entry {i}.", "status")["id"] for i in range(30)]
    first = store.recall(ALICE, limit=10).data
    store.forget(BOB, id=made[-15])  # on the second page
    second = store.recall(ALICE, limit=10, cursor=first["next_cursor"]).data
    assert [e["id"] for e in second["entries"]] == [i for i in reversed(made[10:20]) if i != made[-15]]
    third = store.recall(ALICE, limit=10, cursor=second["next_cursor"]).data
    assert [e["id"] for e in third["entries"]] == list(reversed(made[:10])) and third["next_cursor"] is None
    # The same cursor again gives the same page (a retried call loses nothing).
    again = store.recall(ALICE, limit=10, cursor=first["next_cursor"]).data
    assert again == second


def test_cursors_are_checked(store: Memory) -> None:
    for i in range(5):
        store.put(ALICE, f"Ledger entry {i}.", "status")
    cursor = store.recall(ALICE, query="ledger", limit=2).data["next_cursor"]
    assert cursor is not None
    with pytest.raises(Refused, match="cursor belongs to a recall with other filters"):
        store.recall(ALICE, query="entry", cursor=cursor)
    with pytest.raises(Refused, match="cursor has expired or is unknown"):
        store.recall(BOB, query="ledger", cursor=cursor)  # another caller's cursor is no cursor
    for bad in ("", "r.", "r.x.y", "x" * 200, "h.1.2", cursor + "0" * 10):
        with pytest.raises(Refused, match="cursor is not one this memory gave|expired or is unknown"):
            store.recall(ALICE, query="ledger", cursor=bad)


def test_listings_are_bounded_in_number_and_time() -> None:
    listings = Listings(capacity=3, ttl_s=0.2)
    tokens = [listings.open("A", "[]", [1, 2, 3], True) for _ in range(4)]
    assert len(listings) == 3  # the oldest went
    with pytest.raises(Refused, match="expired or is unknown"):
        listings.find(listings.cursor(tokens[0], 1), "A", "[]")
    listing, at = listings.find(listings.cursor(tokens[3], 2), "A", "[]")
    assert (list(listing.ids), at) == ([1, 2, 3], 2)
    time.sleep(0.3)
    with pytest.raises(Refused, match="15 minutes|expired or is unknown"):
        listings.find(listings.cursor(tokens[3], 2), "A", "[]")
    assert len(listings) == 0
