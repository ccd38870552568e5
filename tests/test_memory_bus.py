"""The memory seat through a real node over a real bus with two caller accounts (alice, bob) and
the mesh account (the node; its users may not call): who wrote what comes
from the server's stamp on each request, so a member's private scope is its own and no argument,
header or `_meta` makes one member pass for the other.

The data's survival (child killed, node restarted, upgrade delivered) is in test_memory_node.py;
1,000 remembers and recalls over the bus are `python -m bench.memory_calls --bus`.
"""

from __future__ import annotations

import json
import re
import shutil
from typing import Any, AsyncIterator, Iterator

import pytest
from nats.aio.client import Client

from tests.faults.security_support import ConfiguredServer
from tests.support.callers import FORGED_HEADERS, callers_node, callers_server, connect_as, mesh_cannot_call
from tests.support.mesh import ROOT, NodeProcess, wait_state

pytestmark = pytest.mark.slow
ALICE, BOB = "alice/alice", "bob/bob"


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ConfiguredServer, NodeProcess]]:
    """One bus and one node for the module: the tests write disjoint keys, words and scopes."""
    base = tmp_path_factory.mktemp("memory-bus")
    mods = base / "mods"
    shutil.copytree(ROOT / "bundles" / "memory", mods / "memory", ignore=shutil.ignore_patterns("__pycache__"))
    # No call comes from the mesh account: the scope admin is a caller, bob (the policy's own words).
    manifest = mods / "memory" / "module.toml"
    manifest.write_text(
        manifest.read_text().replace('MEMORY_SCOPE_ADMINS = "@local"', 'MEMORY_SCOPE_ADMINS = "bob/bob"')
    )
    server = callers_server(base / "bus")
    node = None
    try:
        node = callers_node(base, server, mods, "memory-bus", init_timeout_s=20)
        yield server, node
    finally:
        if node:
            node.kill()
        server.stop()


@pytest.fixture
async def members(mesh: tuple[ConfiguredServer, NodeProcess]) -> AsyncIterator[dict[str | None, Client]]:
    """alice's, bob's and the operator's (None) own connections, the seat ready."""
    server, node = mesh
    conns = {who: await connect_as(server, who) for who in ("alice", "bob", None)}
    try:
        await wait_state(conns[None], node.name, "memory/tools", "ready", timeout=60)
        yield conns
    finally:
        for nc in conns.values():
            await nc.close()


async def ask(nc: Client, verb: str, headers: dict[str, str] | None = None, **args: Any) -> dict[str, Any]:
    """The CallToolResult of memory.<verb> (a tool's refusal included); a runtime error fails."""
    msg = await nc.request(f"mesh.seat.memory.{verb}", json.dumps(args).encode(), timeout=20, headers=headers)
    assert not (msg.headers or {}).get("Nats-Service-Error-Code"), (msg.headers, msg.data)
    return json.loads(msg.data)


async def entry(nc: Client, verb: str, headers: dict[str, str] | None = None, **args: Any) -> dict[str, Any]:
    body = await ask(nc, verb, headers, **args)
    assert body["isError"] is False, body
    return body["structuredContent"]


def refusal(body: dict[str, Any]) -> str:
    assert body["isError"] is True, body
    return body["content"][0]["text"]


async def recall(nc: Client, **args: Any) -> list[dict[str, Any]]:
    return (await entry(nc, "recall", **args))["entries"]


async def test_two_members_write_and_read(
    members: dict[str | None, Client], mesh: tuple[ConfiguredServer, NodeProcess]
) -> None:
    alice, bob = members["alice"], members["bob"]
    first = await entry(alice, "remember", content="Postgres is the system of record.", type="decision", key="db.sor")
    assert (first["scope"], first["author"], first["source"]) == ("global", ALICE, "bus")
    second = await entry(
        bob, "remember", content="Deploys go out on Tuesdays.", type="convention", key="ops.deploy-day"
    )
    assert (second["author"], second["source"]) == (BOB, "bus")
    # Each reads what the other wrote, with its author as the server stamped it.
    assert [(e["id"], e["author"]) for e in await recall(bob, key="db.sor")] == [(first["id"], ALICE)]
    assert [(e["id"], e["author"]) for e in await recall(alice, key="ops.deploy-day")] == [(second["id"], BOB)]
    # Nobody in the mesh account writes at all: the server refuses the call (no stamp of its own).
    refused = await mesh_cannot_call(mesh[0], "mesh.seat.memory.remember")
    assert "permissions violation" in refused.lower(), refused
    # Each one's own private scope is listed for it, and only its own.
    for nc, owner in ((alice, ALICE), (bob, BOB)):
        scopes = (await entry(nc, "scopes"))["scopes"]
        private = [s for s in scopes if s["kind"] == "private"]
        assert [s["slug"] for s in private] == ["private"] and owner in private[0]["name"], scopes


async def test_private_entries_are_invisible_to_the_other_member(members: dict[str | None, Client]) -> None:
    alice, bob = members["alice"], members["bob"]
    secret = await entry(
        alice, "remember", content="Ask about the quartz freeze before Friday.", type="open_question", scope="private"
    )
    await entry(alice, "remember", content="Quartz is the ledger's code name.", type="glossary", key="glossary.quartz")
    # alice sees it: by words, by scope, in her context.
    assert secret["id"] in [e["id"] for e in await recall(alice, query="quartz freeze")]
    assert [e["id"] for e in await recall(alice, scope="private")] == [secret["id"]]
    assert "quartz freeze" in (await entry(alice, "load_context"))["text"]
    # bob does not: not by words, not in his private scope (his own, empty), not in his context.
    assert await recall(bob, query="quartz freeze") == []
    assert await recall(bob, scope="private") == []
    assert [e["key"] for e in await recall(bob, query="quartz")] == ["glossary.quartz"]
    context = await entry(bob, "load_context", budget_chars=200_000)
    assert "freeze" not in context["text"] and secret["id"] not in [e["id"] for e in context["entries"]]
    assert secret["id"] not in [e["id"] for e in await recall(bob, limit=200)]
    # Forgetting it by id, or guessing ids: every id bob cannot see answers as one that never was.
    visible = {e["id"] for e in await recall(bob, limit=200)}
    for guess in [i for i in range(1, secret["id"] + 4) if i not in visible] + [10**9]:
        said = refusal(await ask(bob, "forget", id=guess))
        assert said == f"not found: no entry with id {guess} that you can see; memory.recall finds ids"
    said = refusal(await ask(bob, "forget", scope="private", key="glossary.quartz"))
    assert said.startswith("not found")
    # Nothing was forgotten: alice still has it.
    assert [e["id"] for e in await recall(alice, scope="private")] == [secret["id"]]


@pytest.mark.parametrize(
    "forged",
    [
        {"author": ALICE},
        {"source": "mcp"},
    ],
)
async def test_authorship_arguments_are_refused_not_ignored(members: dict[str | None, Client], forged: dict) -> None:
    bob = members["bob"]
    body = await ask(bob, "remember", content="Forged.", type="decision", key="forged.by-argument", **forged)
    assert f"argument {next(iter(forged))!r} is refused" in refusal(body)
    assert await recall(bob, key="forged.by-argument") == []  # nothing half-written


async def test_authorship_cannot_be_forged_by_headers_or_meta(members: dict[str | None, Client]) -> None:
    alice, bob = members["alice"], members["bob"]
    # bob's request with every header that claims alice: the server replaces Nats-Request-Info,
    # the node reads nothing else.
    as_alice = {**FORGED_HEADERS, "Nats-Request-Info": json.dumps({"acc": "alice", "user": "alice"})}
    as_alice |= {"X-Caller": "alice", "X-Mesh-Account": "alice", "X-Mesh-User": "alice"}
    written = await entry(
        bob, "remember", headers=as_alice, content="Written by bob, dressed as alice.", type="status", scope="private"
    )
    assert (written["author"], written["source"]) == (BOB, "bus")
    # It went to bob's private scope, not alice's.
    assert written["id"] in [e["id"] for e in await recall(bob, scope="private")]
    assert written["id"] not in [e["id"] for e in await recall(alice, scope="private")]
    # An `_meta` in the arguments is an argument the verb does not take: refused by the node's
    # schema check before the child, or by the child; never taken as the caller.
    msg = await bob.request(
        "mesh.seat.memory.remember",
        json.dumps(
            {
                "content": "Forged through _meta.",
                "type": "status",
                "key": "forged.by-meta",
                "_meta": {"mesh/caller": {"account": "alice", "user": "alice", "name": None, "via": "local"}},
            }
        ).encode(),
        timeout=20,
    )
    headers = msg.headers or {}
    body = json.loads(msg.data)
    if headers.get("Nats-Service-Error-Code"):
        assert headers["Nats-Service-Error-Code"] == "400" and "_meta" in headers.get("Nats-Service-Error", ""), body
    else:
        assert "unknown argument '_meta'" in refusal(body)
    assert await recall(alice, key="forged.by-meta") == []


async def test_keys_upsert(members: dict[str | None, Client]) -> None:
    alice, bob = members["alice"], members["bob"]
    first = await entry(alice, "remember", content="Retention is 30 days.", type="constraint", key="data.retention")
    again = await entry(bob, "remember", content="Retention is 90 days.", type="constraint", key="data.retention")
    assert again["id"] == first["id"] and again["created_at"] == first["created_at"]
    assert again["updated_at"] > first["updated_at"]
    assert (again["content"], again["author"]) == ("Retention is 90 days.", BOB)
    assert [e["content"] for e in await recall(alice, key="data.retention")] == ["Retention is 90 days."]
    # The same key in another member's private scope is another entry.
    mine = await entry(alice, "remember", content="I think 60.", type="status", key="data.retention", scope="private")
    assert mine["id"] != first["id"]
    assert [e["id"] for e in await recall(bob, key="data.retention")] == [first["id"]]


async def test_full_text_search_finds_by_words(members: dict[str | None, Client]) -> None:
    alice, bob = members["alice"], members["bob"]
    found = await entry(
        alice, "remember", content="Refunds are settled through the wombat service within two days.", type="decision"
    )
    await entry(alice, "remember", content="Invoices are settled monthly.", type="decision")
    assert [e["id"] for e in await recall(bob, query="wombat settled")] == [found["id"]]  # any order
    assert [e["id"] for e in await recall(bob, query="WOMBAT refunds")] == [found["id"]]  # any case
    assert await recall(bob, query="wombat monthly") == []  # every word must match
    assert len(await recall(bob, query="settled")) >= 2
    assert "no words to search for" in refusal(await ask(bob, "recall", query="***"))


async def test_archived_scopes_refuse_writes(members: dict[str | None, Client]) -> None:
    alice, ops = members["alice"], members["bob"]
    # Who may create scopes is policy: here bob (MEMORY_SCOPE_ADMINS, set by the fixture).
    assert "may not" in refusal(await ask(alice, "create_scope", slug="billing", name="Billing")).lower()
    created = await entry(ops, "create_scope", slug="billing", name="Billing", description="the billing platform")
    assert (created["slug"], created["archived"]) == ("billing", False)
    kept = await entry(alice, "remember", content="Billing closes at midnight UTC.", type="constraint", scope="billing")
    archived = await entry(ops, "archive_scope", slug="billing")
    assert archived["archived"] is True
    assert "archived" in refusal(await ask(alice, "remember", content="One more.", type="status", scope="billing"))
    assert "archived" in refusal(await ask(alice, "forget", id=kept["id"]))
    # Read-only, not gone.
    assert [e["id"] for e in await recall(alice, scope="billing")] == [kept["id"]]
    assert re.search(r"billing \(project, archived, 1 entry\)", (await ask(alice, "scopes"))["content"][0]["text"])


# --- history, tombstones, restore, purge (issue 25) ---------------------------------------------


async def versions(nc: Client, **which: Any) -> list[dict[str, Any]]:
    return (await entry(nc, "history", **which))["versions"]


async def test_every_change_is_attributed_and_nothing_is_lost(members: dict[str | None, Client]) -> None:
    # bob is the scope admin (the fixture's policy); alice is a member.
    alice, bob = members["alice"], members["bob"]
    first = await entry(
        bob, "remember", content="Quokka payments settle at 17:00.", type="constraint", key="pay.cutoff"
    )
    await entry(alice, "remember", content="Quokka payments settle at 18:00.", type="constraint", key="pay.cutoff")
    gone = await entry(alice, "forget", scope="global", key="pay.cutoff")
    assert gone == {"forgotten": first["id"], "version": 3}
    # A tombstone: not in recall, words, key or context; the history keeps it.
    assert await recall(bob, key="pay.cutoff") == [] and await recall(bob, query="quokka") == []
    assert "17:00" not in (await entry(bob, "load_context", budget_chars=200_000))["text"]
    history = await versions(bob, id=first["id"])
    assert [(v["action"], v["by"], v["via"]) for v in history] == [
        ("forget", ALICE, "bus"),
        ("upsert", ALICE, "bus"),
        ("remember", BOB, "bus"),
    ]
    assert (
        history[1]["before"] == "Quokka payments settle at 17:00."
        and history[1]["content"] == "Quokka payments settle at 18:00."
    )
    # alice may not bring back bob's version (she is neither its author nor an admin); bob may.
    said = refusal(await ask(alice, "restore", id=first["id"], version=1))
    assert said.startswith(f"{ALICE} may not restore version 1 of #{first['id']}: its author ({BOB})")
    back = await entry(bob, "restore", id=first["id"], version=1)
    assert (back["content"], back["author"], back["version"]) == ("Quokka payments settle at 17:00.", BOB, 4)
    assert [e["id"] for e in await recall(alice, query="quokka")] == [first["id"]]
    # Purge: not by a member, by the scope admins; "purged by X at T" stays.
    assert "may not purge" in refusal(await ask(alice, "purge", id=first["id"]))
    purged = await entry(bob, "purge", id=first["id"])
    assert (purged["purged"], purged["by"], purged["versions"]) == (first["id"], BOB, 4)
    record = await entry(alice, "history", id=first["id"])
    assert record["versions"] == [] and record["purged"]["by"] == BOB
    assert record["purged"]["at"] == purged["at"]
    assert "17:00" not in json.dumps(record) and "18:00" not in json.dumps(record)


async def test_history_and_purge_of_a_private_entry_are_its_owners(members: dict[str | None, Client]) -> None:
    alice, bob = members["alice"], members["bob"]
    mine = await entry(alice, "remember", content="Pasted by mistake: pw=swordfish.", type="status", scope="private")
    assert len(await versions(alice, id=mine["id"])) == 1
    # another member who is also the scope admin: as if it never was
    said = refusal(await ask(bob, "history", id=mine["id"]))
    assert said == f"not found: no entry with id {mine['id']} that you can see; memory.recall finds ids"
    assert refusal(await ask(bob, "purge", id=mine["id"])).startswith("not found")
    assert (await entry(alice, "purge", id=mine["id"]))["scope"] == "private"
    assert (await entry(alice, "history", id=mine["id"]))["purged"]["by"] == ALICE


async def test_rename_and_unarchive_scope(members: dict[str | None, Client]) -> None:
    alice, admin = members["alice"], members["bob"]
    await entry(admin, "create_scope", slug="search-team", name="Search")
    assert "may not rename" in refusal(await ask(alice, "rename_scope", slug="search-team", name="Mine now"))
    renamed = await entry(admin, "rename_scope", slug="search-team", name="Search and ranking")
    assert (renamed["slug"], renamed["name"]) == ("search-team", "Search and ranking")
    await entry(admin, "archive_scope", slug="search-team")
    assert "may not unarchive" in refusal(await ask(alice, "unarchive_scope", slug="search-team"))
    assert (await entry(admin, "unarchive_scope", slug="search-team"))["archived"] is False
    written = await entry(alice, "remember", content="Ranking uses bm25.", type="decision", scope="search-team")
    assert written["scope"] == "search-team"
    listed = (await entry(alice, "scopes", include_private=False))["scopes"]
    assert {
        "slug": "search-team",
        "name": "Search and ranking",
        "kind": "project",
        "description": "",
        "archived": False,
        "entries": 1,
    } in listed
    assert all(s["kind"] != "private" for s in listed)


async def test_search_by_stems_and_prefixes_ranked(members: dict[str | None, Client]) -> None:
    alice, bob = members["alice"], members["bob"]
    plural = await entry(alice, "remember", content="Zorblax invoices go out monthly.", type="convention")
    keyed = await entry(alice, "remember", content="Numbered per year.", type="decision", key="zorblax.invoice")
    assert {e["id"] for e in await recall(bob, query="zorblax invoice")} == {plural["id"], keyed["id"]}
    assert {e["id"] for e in await recall(bob, query="zorbl")} == {plural["id"], keyed["id"]}  # a prefix
    assert (await recall(bob, query="zorblax invoice"))[0]["id"] == keyed["id"]  # the key weighs more
    assert "no words to search for" in refusal(await ask(bob, "recall", query='" ( ) *'))


async def test_limits_are_refused_over_the_bus(members: dict[str | None, Client]) -> None:
    bob = members["bob"]
    said = refusal(await ask(bob, "remember", content="a" + "\x1c" * 3998 + "b", type="status"))
    assert "control character (U+001C at character 2)" in said
    assert "more than 4000" in refusal(await ask(bob, "remember", content="x" * 4001, type="status"))
    assert "is not one this memory gave" in refusal(await ask(bob, "recall", cursor="not-a-cursor"))
    assert "cursor has expired or is unknown" in refusal(await ask(bob, "recall", cursor="r.nothing.0"))


async def test_load_context_skips_what_does_not_fit(members: dict[str | None, Client]) -> None:
    admin, alice = members["bob"], members["alice"]
    await entry(admin, "create_scope", slug="packing", name="Packing")
    await entry(alice, "remember", content="P" * 3990, type="constraint", scope="packing")
    await entry(alice, "remember", content="Packing status is short.", type="status", scope="packing")
    packed = await entry(alice, "load_context", projects=["packing"], budget_chars=3000)
    assert len(packed["text"]) <= 3000 and packed["truncated"] is True
    assert "Packing status is short." in packed["text"] and packed["left_out"]["packing"] == 1
