"""The memory module through a real child over stdio, with callers in _meta as the node sets them.

The child runs as the runtime runs a Python bundle from source: the node's interpreter, cwd =
the bundle's source folder, MESH_* set, the SDK from this checkout on PYTHONPATH. Two callers
(ALICE and BOB, different accounts) share one child, as two members share one seat.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support import memory_store  # noqa: F401  (puts the module's source on sys.path)
from tests.support.stdio_client import StdioClient

REPO = Path(__file__).resolve().parent.parent
MODULE = REPO / "bundles" / "memory"
SOURCE = MODULE / "src"
SDK = REPO / "sdk" / "python"

ALICE = {"account": "ALICE", "user": "alice", "name": "alice-laptop", "via": "bus"}
BOB = {"account": "BOB", "user": "bob", "name": None, "via": "mcp"}
OPERATOR = {"account": "MESH", "user": None, "name": None, "via": "local"}
VERBS = {
    "remember",
    "recall",
    "forget",
    "history",
    "restore",
    "purge",
    "scopes",
    "load_context",
    "create_scope",
    "archive_scope",
    "unarchive_scope",
    "rename_scope",
}


class MemoryChild:
    """One memory child; `call` sends a verb as the named caller (None: no caller at all)."""

    def __init__(self, data_dir: Path, **env: str) -> None:
        self.client = StdioClient(
            [sys.executable, "main.py"],
            cwd=SOURCE,
            env={
                "MESH_NODE": "node-a",
                "MESH_MODULE": "memory",
                "MESH_BUNDLE": "tools",
                "MESH_BUNDLE_DIR": str(SOURCE),
                "MESH_DATA_DIR": str(data_dir),
                "PYTHONPATH": str(SDK),
                "MEMORY_DEFAULT_SCOPE": "global",
                "MEMORY_SCOPE_ADMINS": "@local",
                **env,
            },
        )
        self.client.initialize()

    def call(self, verb: str, arguments: dict[str, Any], who: dict[str, Any] | None) -> dict[str, Any]:
        params: dict[str, Any] = {"name": f"memory.{verb}", "arguments": arguments}
        if who is not None:
            params["_meta"] = {"mesh/caller": who}
        return self.client.request("tools/call", params)

    def ok(self, verb: str, arguments: dict[str, Any], who: dict[str, Any] | None) -> dict[str, Any]:
        reply = self.call(verb, arguments, who)
        assert reply["isError"] is False, reply
        return reply["structuredContent"]

    def refused(self, verb: str, arguments: dict[str, Any], who: dict[str, Any] | None) -> str:
        reply = self.call(verb, arguments, who)
        assert reply["isError"] is True, reply
        assert "structuredContent" not in reply or reply["structuredContent"] is None
        return reply["content"][0]["text"]

    def close(self) -> None:
        self.client.close()


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data" / "memory"


@pytest.fixture
def child(data_dir: Path):
    c = MemoryChild(data_dir, MEMORY_PROJECTS="billing=Billing platform,web=Web shop")
    yield c
    c.close()


def test_the_seat_verbs_are_listed(child: MemoryChild) -> None:
    tools = {t["name"]: t for t in child.client.list_tools()}
    assert set(tools) == {f"memory.{v}" for v in VERBS}
    schema = tools["memory.remember"]["inputSchema"]
    assert schema["required"] == ["content", "type"]
    assert set(schema["properties"]) == {"content", "type", "key", "scope"}  # no author, no source
    assert schema["properties"]["type"]["enum"] == [
        "decision",
        "convention",
        "constraint",
        "open_question",
        "glossary",
        "status",
    ]
    # What a program (the console's web page) gets, published as each verb's output schema.
    for verb, fields in {
        "remember": {
            "id",
            "scope",
            "type",
            "key",
            "content",
            "author",
            "source",
            "created_at",
            "updated_at",
            "version",
        },
        "recall": {"entries", "next_cursor"},
        "history": {"id", "scope", "key", "forgotten", "purged", "versions", "next_cursor"},
        "scopes": {"scopes", "next_cursor"},
        "load_context": {"text", "entries", "truncated", "left_out"},
    }.items():
        published = tools[f"memory.{verb}"]["outputSchema"]
        assert fields <= set(published["properties"]), (verb, published)


def test_two_members_write_and_read(child: MemoryChild) -> None:
    a = child.ok(
        "remember",
        {"content": "Postgres is the system of record.", "type": "decision", "key": "db.system-of-record"},
        ALICE,
    )
    b = child.ok(
        "remember", {"content": "Invoices are immutable once sent.", "type": "constraint", "scope": "billing"}, BOB
    )
    assert (a["author"], a["source"], a["scope"]) == ("ALICE/alice", "bus", "global")
    assert (b["author"], b["source"], b["scope"]) == ("BOB/bob", "mcp", "billing")
    for who in (ALICE, BOB):
        assert [e["id"] for e in child.ok("recall", {}, who)["entries"]] == [b["id"], a["id"]]


def test_private_entries_are_invisible_to_the_other_member(child: MemoryChild) -> None:
    secret = child.ok(
        "remember",
        {"content": "Thinking of leaving Kafka.", "type": "open_question", "key": "idea.kafka", "scope": "private"},
        ALICE,
    )
    shared = child.ok("remember", {"content": "Kafka carries the order events.", "type": "decision"}, ALICE)
    assert secret["scope"] == "private"
    # Bob: not by listing, words, key, scope, context, nor by guessing ids.
    assert [e["id"] for e in child.ok("recall", {}, BOB)["entries"]] == [shared["id"]]
    assert child.ok("recall", {"query": "leaving"}, BOB)["entries"] == []
    assert child.ok("recall", {"key": "idea.kafka"}, BOB)["entries"] == []
    assert child.ok("recall", {"scope": "private"}, BOB)["entries"] == []
    context = child.ok("load_context", {}, BOB)
    assert "leaving" not in context["text"] and [e["id"] for e in context["entries"]] == [shared["id"]]
    never = 999_999
    for guess in range(1, 6):
        text = child.refused("forget", {"id": guess}, BOB) if guess != shared["id"] else None
        if text is not None:
            assert text == f"not found: no entry with id {guess} that you can see; memory.recall finds ids"
    assert child.refused("forget", {"id": never}, BOB) == (
        f"not found: no entry with id {never} that you can see; memory.recall finds ids"
    )
    assert child.refused("forget", {"scope": "private", "key": "idea.kafka"}, BOB).startswith("not found")
    # Alice still has it, whole.
    mine = child.ok("recall", {"scope": "private"}, ALICE)["entries"]
    assert [(e["id"], e["content"]) for e in mine] == [(secret["id"], "Thinking of leaving Kafka.")]
    assert "Thinking of leaving Kafka." in child.ok("load_context", {}, ALICE)["text"]
    scopes = child.ok("scopes", {}, BOB)["scopes"]
    assert [s["slug"] for s in scopes] == ["global", "billing", "web", "private"]
    assert scopes[-1]["name"] == "private (BOB/bob)"  # Bob's own, never Alice's


@pytest.mark.parametrize("forged", [{"author": "ALICE/alice"}, {"source": "local"}, {"author": "x", "source": "mcp"}])
def test_authorship_cannot_be_forged_by_arguments(child: MemoryChild, forged: dict[str, str]) -> None:
    text = child.refused("remember", {"content": "Bob wrote this.", "type": "status", **forged}, BOB)
    assert "author and source come from the channel" in text and "leave it out" in text
    assert child.ok("recall", {}, ALICE)["entries"] == []  # nothing written
    # Other verbs refuse them too, rather than ignore them.
    assert "refused" in child.refused("recall", {"author": "ALICE/alice"}, BOB)
    assert "unknown argument 'account': memory.remember takes content, type, key, scope" == child.refused(
        "remember", {"content": "x", "type": "status", "account": "ALICE"}, BOB
    )
    # Without the arguments the entry is Bob's, by the channel.
    entry = child.ok("remember", {"content": "Bob wrote this.", "type": "status"}, BOB)
    assert (entry["author"], entry["source"]) == ("BOB/bob", "mcp")


def test_a_call_without_a_caller_cannot_write(child: MemoryChild) -> None:
    assert "carries no caller" in child.refused("remember", {"content": "Who am I?", "type": "status"}, None)
    child.ok("remember", {"content": "Shared.", "type": "status"}, ALICE)
    assert [e["content"] for e in child.ok("recall", {}, None)["entries"]] == ["Shared."]
    # A caller the SDK cannot vouch for (malformed) counts as none.
    assert "carries no caller" in child.refused("remember", {"content": "x", "type": "status"}, {"account": "ALICE"})


def test_keys_upsert(child: MemoryChild) -> None:
    first = child.ok("remember", {"content": "Deploys on Tuesday.", "type": "convention", "key": "deploy.day"}, ALICE)
    second = child.ok("remember", {"content": "Deploys on Thursday.", "type": "decision", "key": "deploy.day"}, BOB)
    assert second["id"] == first["id"] and second["created_at"] == first["created_at"]
    assert second["updated_at"] > first["updated_at"] and second["author"] == "BOB/bob"
    [only] = child.ok("recall", {"key": "deploy.day"}, ALICE)["entries"]
    assert only["content"] == "Deploys on Thursday."


def test_full_text_search_finds_by_words(child: MemoryChild) -> None:
    child.ok("remember", {"content": "The ledger service owns balances.", "type": "decision"}, ALICE)
    hit = child.ok(
        "remember",
        {"content": "Refunds go through the payment provider's API.", "type": "convention", "scope": "billing"},
        BOB,
    )
    found = child.ok("recall", {"query": "refunds provider"}, ALICE)["entries"]
    assert [e["id"] for e in found] == [hit["id"]]
    assert child.ok("recall", {"query": "refunds ledger"}, ALICE)["entries"] == []
    assert "no words to search for" in child.refused("recall", {"query": "***"}, ALICE)


def test_archived_scope_refuses_writes(child: MemoryChild) -> None:
    kept = child.ok(
        "remember",
        {"content": "Cart keeps items 30 days.", "type": "constraint", "key": "cart.ttl", "scope": "web"},
        ALICE,
    )
    assert "may not archive project scopes" in child.refused("archive_scope", {"slug": "web"}, ALICE)
    assert child.ok("archive_scope", {"slug": "web"}, OPERATOR)["archived"] is True
    for verb, args in [
        ("remember", {"content": "New.", "type": "status", "scope": "web"}),
        ("remember", {"content": "Changed.", "type": "constraint", "key": "cart.ttl", "scope": "web"}),
        ("forget", {"id": kept["id"]}),
        ("forget", {"scope": "web", "key": "cart.ttl"}),
    ]:
        assert "'web' is archived, so it is read-only" in child.refused(verb, args, ALICE)
    assert child.ok("recall", {"scope": "web"}, BOB)["entries"][0]["content"] == "Cart keeps items 30 days."
    assert "exists (archived)" in child.refused("create_scope", {"slug": "web", "name": "Web"}, OPERATOR)
    made = child.ok("create_scope", {"slug": "web-2", "name": "Web shop 2"}, OPERATOR)
    assert made["kind"] == "project" and made["archived"] is False
    assert "may not create" in child.refused("create_scope", {"slug": "mine", "name": "Mine"}, BOB)


def test_refusals_say_what_would_be_right(child: MemoryChild) -> None:
    assert "'decision', 'convention', 'constraint', 'open_question', 'glossary' or 'status'" in child.refused(
        "remember", {"content": "x", "type": "rule"}, ALICE
    )
    assert "e.g. 'db.system-of-record'" in child.refused(
        "remember", {"content": "x", "type": "status", "key": "Bad Key"}, ALICE
    )
    assert "the scopes you can use are global, private (yours), billing, web" in child.refused(
        "remember", {"content": "x", "type": "status", "scope": "nowhere"}, ALICE
    )
    assert "say which entry to forget" in child.refused("forget", {}, ALICE)
    assert "budget_chars 0 is out of range" in child.refused("load_context", {"budget_chars": 0}, ALICE)


def test_data_survives_a_killed_child_and_a_restart(data_dir: Path) -> None:
    first = MemoryChild(data_dir)
    kept = first.ok("remember", {"content": "Survives restarts.", "type": "status", "key": "a.b"}, ALICE)
    private = first.ok("remember", {"content": "Mine, still.", "type": "status", "scope": "private"}, ALICE)
    os.kill(first.client.proc.pid, signal.SIGKILL)  # no clean shutdown: what was answered is committed
    first.client.proc.wait()
    second = MemoryChild(data_dir)
    try:
        assert [e["id"] for e in second.ok("recall", {}, ALICE)["entries"]] == [private["id"], kept["id"]]
        assert [e["id"] for e in second.ok("recall", {}, BOB)["entries"]] == [kept["id"]]
        assert second.ok("recall", {"query": "survives"}, BOB)["entries"][0]["id"] == kept["id"]
        again = second.ok("remember", {"content": "Survives restarts, twice.", "type": "status", "key": "a.b"}, BOB)
        assert again["id"] == kept["id"] and again["created_at"] == kept["created_at"]
    finally:
        second.close()


def test_an_impossible_policy_answers_every_call_with_it(data_dir: Path) -> None:
    child = MemoryChild(data_dir, MEMORY_DEFAULT_SCOPE="private")
    try:
        assert {t["name"] for t in child.client.list_tools()} == {f"memory.{v}" for v in VERBS}  # it starts
        for verb in ("remember", "recall"):
            args = {"content": "x", "type": "status"} if verb == "remember" else {}
            text = child.refused(verb, args, ALICE)
            assert text.startswith(
                "the memory cannot serve: MEMORY_DEFAULT_SCOPE: the default write scope cannot be 'private'"
            )
    finally:
        child.close()
    assert "ERROR memory: memory cannot serve" in child.client.proc.stderr.read().decode()  # type: ignore[union-attr]
    assert not (data_dir / "memory.sqlite3").exists()  # no store under a policy nobody meant


def raw_line(child: MemoryChild, verb: str, arguments: dict[str, Any], who: dict[str, Any]) -> bytes:
    """The child's answer as the line it wrote (what the node reads and bounds)."""
    proc = child.client.proc
    assert proc.stdin is not None and proc.stdout is not None
    ident = 10_000 + len(arguments)
    params = {"name": f"memory.{verb}", "arguments": arguments, "_meta": {"mesh/caller": who}}
    proc.stdin.write(
        json.dumps({"jsonrpc": "2.0", "id": ident, "method": "tools/call", "params": params}).encode() + b"\n"
    )
    proc.stdin.flush()
    while True:
        line = proc.stdout.readline()
        assert line, "the child closed its stdout"
        if json.loads(line).get("id") == ident:
            return line


def test_whatever_the_file_holds_every_answer_is_a_bounded_line(data_dir: Path) -> None:
    child = MemoryChild(data_dir)
    try:
        child.ok("remember", {"content": "Written by the module.", "type": "status"}, ALICE)
        # Rows no caller could write: a megabyte of control characters, an unknown type, a huge author.
        db = sqlite3.connect(data_dir / "memory.sqlite3")
        rows = [("rule", "x\x1c" * 500_000, "A" * 100_000)] + [("status", "a" + "\x1c" * 3998 + "b", "alice")] * 300
        for type_, content, author in rows:
            entry_id = db.execute(
                "INSERT INTO entry (scope_id, type, content, author, source, created_at, updated_at, version) "
                "VALUES (1, ?, ?, ?, 'bus', '2026-01-01T00:00:00Z', '2026-01-01T00:00:00Z', 1)",
                (type_, content, author),
            ).lastrowid
            db.execute(
                "INSERT INTO entry_version SELECT id, 1, 'import', updated_at, author, source, type, content, author, "
                "source, 0, NULL FROM entry WHERE id = ?",
                (entry_id,),
            )
        db.commit()
        db.close()
        from memory.model import MAX_REPLY_BYTES  # the source is on sys.path through tests.support

        for verb, arguments in [
            ("recall", {"limit": 200}),
            ("load_context", {}),
            ("load_context", {"budget_chars": 200_000}),
            ("history", {"id": 2}),
        ]:
            line = raw_line(child, verb, arguments, BOB)
            assert len(line) <= MAX_REPLY_BYTES, (verb, len(line))
            result = json.loads(line)["result"]
            assert result["isError"] is False, result["content"][0]["text"][:300]
        listed, pages, cursor = [], 0, None
        while True:  # every page a bounded line; the odd row (the oldest id) on the last one
            arguments = {"limit": 200, **({"cursor": cursor} if cursor else {})}
            line = raw_line(child, "recall", arguments, BOB)
            assert len(line) <= MAX_REPLY_BYTES
            page = json.loads(line)["result"]["structuredContent"]
            listed += page["entries"]
            pages += 1
            if (cursor := page["next_cursor"]) is None:
                break
        assert len(listed) == 302 and pages > 2
        odd = next(e for e in listed if e["type"] == "rule")
        assert odd["clipped"] is True and len(odd["content"]) == 4000 and len(odd["author"]) == 520
    finally:
        child.close()
