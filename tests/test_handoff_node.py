"""bundles/handoff behind a real node on a real nats-server, one account per caller: what issue 25
adds, each through the node and the bus. The bounds (the flood of 70 entries with a 1 MB `frage`,
refused, and the same flood already in a store of handoff 0.1, migrated and answered in bounded
pages), fenced writes (the node's child and a second process writing one entry; the old child of
an in-place upgrade whose clock stops when the new one starts), the priority stored and listed
first, handoff.watch (woken by a change another process makes), the human's decision reaching
the waiting opener, and release, withdraw, block on an open entry and the listing's filters.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import msgspec
import pytest

from tests.faults.security_support import ConfiguredServer
from tests.support.handoff import (
    LONG_BYTES,
    LONG_CHARS,
    MAX_PAGE_BYTES,
    MESH_USER,
    MODULE_DIR,
    NATS_MAX_PAYLOAD,
    PASSWORD,
    BusCaller,
    Seat,
    StdioDesk,
    accounts_server,
    build_stage,
    caller_id,
    cpu_seconds,
    node_store,
    start_node,
    url_of,
    write_v0_store,
)
from tests.support.mesh import MESHCTL, ROOT, client, status, wait_state
from tests.support.sdk import require
from toolchains.build import build_module
from toolchains.go import TOOLCHAIN
from toolchains.pack import pack
from toolchains.verify import verify_and_unpack

pytestmark = [pytest.mark.slow, pytest.mark.toolchain("go")]

A = {"account": "AGENT_A", "user": "a", "name": None, "via": "bus"}
B = {"account": "AGENT_B", "user": "b", "name": None, "via": "bus"}
C = {"account": "AGENT_C", "user": "c", "name": None, "via": "bus"}
QUESTION: dict[str, Any] = {
    "projekt": "line-7",
    "frage": "What is the scale_factor in the calibration file of line 7?",
    "versucht": "searched my workdir and the repo",
    "benoetigt": "the scale_factor as a number",
}


@pytest.fixture(scope="module")
def stage(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require(TOOLCHAIN)
    return build_stage(tmp_path_factory.mktemp("handoff-node"))


@pytest.fixture
def bus(tmp_path: Path) -> Iterator[ConfiguredServer]:
    require(TOOLCHAIN)
    server = accounts_server(tmp_path / "nats", [A, B, C])
    yield server
    server.stop()


async def child_status(server: ConfiguredServer, node: str) -> dict[str, Any]:
    nc = await client(url_of(server, None))
    try:
        return await wait_state(nc, node, "handoff/tools", "ready", timeout=60)
    finally:
        await nc.close()


def test_the_flood_is_refused_and_the_desk_keeps_answering(tmp_path: Path, bus: ConfiguredServer) -> None:
    """Issue 25's flood: 70 entries with a 1 MB frage. Each is refused, naming the field, the
    limit and what would be right; the child stays up and everybody else is answered."""
    node = start_node(tmp_path, bus, "flood", {})
    try:
        before = asyncio.run(child_status(bus, node.name))

        async def flood() -> tuple[float, list[str]]:
            a = await Seat.connect(bus, A)
            try:
                started = time.monotonic()
                texts = [
                    await a.refused("open", **{**QUESTION, "frage": "x" * 1_000_000}, timeout=30) for _ in range(70)
                ]
                return time.monotonic() - started, texts
            finally:
                await a.close()

        took, texts = asyncio.run(flood())
        print(f"70 opens with a 1 MB frage, all refused, in {took:.2f} s")
        assert all(t == texts[0] for t in texts)
        assert texts[0].startswith("frage has 1000000 bytes; shorten frage to at most 8000 characters and 16384 bytes")
        a, b, c = BusCaller(bus, A), BusCaller(bus, B), BusCaller(bus, C)
        control = a.refused("open", **{**QUESTION, "frage": "a" + "\x1c" * 3998 + "b"})
        assert "frage holds the control character U+001C at character 2" in control
        # At the limits exactly it is taken: 8000 characters, NFC counted (e + combining accent is one).
        at_limit = a.ok("open", **{**QUESTION, "frage": "e\u0301" * LONG_CHARS, "versucht": "😀" * (LONG_BYTES // 4)})
        assert at_limit["frage"] == "é" * LONG_CHARS and at_limit["id"] == "h-1"
        entry = b.ok("open", **QUESTION)
        listed, size = c.raw("list", {})
        assert [e["id"] for e in listed["structuredContent"]["entries"]] == ["h-1", entry["id"]]
        print(f"the list after the flood: {size} bytes")
        assert size < NATS_MAX_PAYLOAD
        after = asyncio.run(child_status(bus, node.name))
        assert (after["pid"], after["restarts"]) == (before["pid"], before["restarts"]), "the child went down"
    finally:
        node.terminate()


def test_a_store_flooded_before_the_limits_is_migrated_and_answered_in_bounded_pages(
    tmp_path: Path, bus: ConfiguredServer
) -> None:
    """The same flood already in a store of handoff 0.1 (which took it): the node's child migrates
    the store, and every answer stays bounded whatever the store holds; idle, it costs nothing."""
    write_v0_store(tmp_path / "state-flooded" / "data" / "handoff", flood=70)
    node = start_node(tmp_path, bus, "flooded", {})
    try:
        before = asyncio.run(child_status(bus, node.name))
        a, b = BusCaller(bus, A), BusCaller(bus, B)
        # 0.1's entries, as they were: the same ids, states, answers and logs.
        first = a.ok("get", id="h-1")
        assert first["state"] == "resolved" and first["antwort"] == "scale_factor = 2.5"
        assert [(line["who"], line["to"]) for line in first["log"]] == [
            ("ALICE/alice", "open"),
            ("BOB/bob", "claimed"),
            ("BOB/bob", "resolved"),
        ]
        assert a.ok("get", id="h-2")["rueckfrage_antwort"] == "yesterday 14:00"
        assert [e["id"] for e in a.ok("attention")["entries"]] == ["h-3"]
        # A flood entry is shown clipped; the store keeps it whole.
        flooded, size = a.raw("get", {"id": "h-6"})
        shown = flooded["structuredContent"]
        assert shown["clipped"] == ["frage"] and shown["frage"] == "x" * LONG_CHARS and size < NATS_MAX_PAYLOAD
        # Every page is bounded; paging sees each of the 75 entries once.
        seen: list[str] = []
        cursor = ""
        sizes = []
        while True:
            args: dict[str, Any] = {"limit": 100, **({"cursor": cursor} if cursor else {})}
            page, size = a.raw("list", args)
            sizes.append(size)
            body = page["structuredContent"]
            assert len(json.dumps(body)) < MAX_PAGE_BYTES + 64 * 1024 and size < NATS_MAX_PAYLOAD
            seen += [e["id"] for e in body["entries"]]
            if not (cursor := body.get("next_cursor", "")):
                break
        print(f"75 entries in {len(sizes)} pages of at most {max(sizes)} bytes")
        assert sorted(seen, key=lambda i: int(i[2:])) == [f"h-{n}" for n in range(1, 76)] and len(set(seen)) == 75
        watched, size = a.raw("watch", {"after": 0, "timeout_s": 1, "limit": 100})
        assert watched["structuredContent"]["entries"] and size < NATS_MAX_PAYLOAD
        # 0.1's open and claimed entries were opened long ago: the clock blocks them as unanswered.
        held = a.ok("get", id="h-4")
        assert held["state"] == "blocked" and held["log"][-1]["who"] == "handoff", held["log"]
        # The desk answers everyone, and ids go on after 0.1's.
        new = b.ok("open", **QUESTION)
        assert new["id"] == "h-76"
        assert a.ok("claim", id=new["id"])["owner"] == caller_id(A)
        after = asyncio.run(child_status(bus, node.name))
        assert (after["pid"], after["restarts"]) == (before["pid"], before["restarts"]), "the child went down"
        # Idle: nothing is near a limit but h-76's claim (10 minutes away); the child sleeps.
        used = cpu_seconds(after["pid"])
        time.sleep(5)
        idle = (cpu_seconds(after["pid"]) - used) / 5
        print(f"idle CPU of the child with the flood in its store: {idle:.4f} CPU-seconds per second")
        assert idle < 0.05, "the clock or the poller busies the child while idle"
    finally:
        node.terminate()


def test_two_processes_write_the_same_entry(tmp_path: Path, bus: ConfiguredServer, stage: Path) -> None:
    """The node's child (B's calls over the bus) and a second process on the same handoff.db (C's)
    claim and release the same entries as fast as they can, starting together: each write is
    applied over the version it read, or tried again on the fresh entry, so every success is in
    the log once, in order, and no claim is written over another."""
    node = start_node(tmp_path, bus, "fence", {})
    second = StdioDesk(stage, node_store(node))
    try:
        a = BusCaller(bus, A)
        entries = [a.ok("open", **QUESTION)["id"] for _ in range(5)]
        start = threading.Barrier(2)
        wins: dict[str, int] = {}

        async def over_the_bus() -> int:
            b = await Seat.connect(bus, B)
            won = 0
            try:
                start.wait(10)
                for _ in range(40):
                    for entry in entries:
                        if not (await b.call("claim", id=entry)).get("isError"):
                            await b.ok("release", id=entry)
                            won += 1
            finally:
                await b.close()
            return won

        def second_process() -> None:
            won = 0
            start.wait(10)
            for _ in range(40):
                for entry in entries:
                    if not second.call(C, "claim", id=entry).get("isError"):
                        second.ok(C, "release", id=entry)
                        won += 1
            wins["C"] = won

        thread = threading.Thread(target=second_process)
        thread.start()
        wins["B"] = asyncio.run(over_the_bus())
        thread.join(60)
        print(f"claims won: B {wins['B']} over the bus, C {wins['C']} in the second process")
        assert wins["B"] > 0 and wins["C"] > 0, "no contest: one side had every entry to itself"
        assert wins["B"] + wins["C"] == 50
        for entry in entries:
            got = a.ok("get", id=entry)
            assert got["claims"] == 10 and got["state"] == "open"
            assert got["log_lines"] == len(got["log"]) == 21 == got["version"]
            pairs = list(zip(got["log"][1::2], got["log"][2::2]))
            assert all((c["to"], r["to"], c["who"]) == ("claimed", "open", r["who"]) for c, r in pairs), (
                f"a claim was written over another: {got['log']}"
            )
            assert "claimed 10 times already" in BusCaller(bus, B).refused("claim", id=entry)
    finally:
        second.client.close()
        node.terminate()


def upgraded(artifact: Path, out: Path, version: str) -> Path:
    """The same bundle as a new version: unpacked, its version changed, packed by the project's packer."""
    stage = out / f"stage-{version}"
    meta = verify_and_unpack(artifact, stage)
    manifest = meta.manifest.replace(f'version = "{meta.version}"', f'version = "{version}"', 1)
    return pack(stage, msgspec.structs.replace(meta, version=version, manifest=manifest), out)


def test_the_old_child_of_an_upgrade_stops_its_clock(tmp_path: Path, bus: ConfiguredServer) -> None:
    """An in-place upgrade delivered by meshctl: the old child drains (a wait of A's in flight)
    while the new one serves. The new child took the clocks at its start, so a claim that runs out
    meanwhile expires once, by the new child; the old child's clock stops at its next tick. A's
    wait in the old child hears of a change the new child makes (the store poller)."""
    out = tmp_path / "out"
    cache = Path(os.environ.get("MESH_TOOLCHAIN_CACHE", ROOT / ".cache" / "toolchains"))
    [v1] = build_module(MODULE_DIR, out, cache_dir=cache, progress=lambda _: None)
    v2 = upgraded(v1, out, "0.2.99")
    empty = tmp_path / "none"
    empty.mkdir()
    env = {"HANDOFF_CLAIM_S": "1.5", "HANDOFF_UNANSWERED_S": "120"}
    node = start_node(tmp_path, bus, "upgrade", env, manifests=empty, drain_timeout_s=30)

    def deliver(artifact: Path) -> None:
        r = subprocess.run(
            [*MESHCTL, "bundle", "deliver", str(artifact), "--node", node.name, "--nats", bus.url]
            + ["--user", MESH_USER, "--password", PASSWORD],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0, r.stderr

    async def until_version(version: str) -> dict[str, Any]:
        nc = await client(url_of(bus, None))
        try:
            deadline = time.monotonic() + 90
            while version not in [m["version"] for m in (await status(nc, node.name))["modules"]]:
                assert time.monotonic() < deadline, f"handoff {version} never came up"
                await asyncio.sleep(0.1)
            return await wait_state(nc, node.name, "handoff/tools", "ready", timeout=60)
        finally:
            await nc.close()

    async def run() -> None:
        deliver(v1)
        old = await until_version("0.2.0")
        a, b = await Seat.connect(bus, A), await Seat.connect(bus, B)
        try:
            held = await a.ok("open", **QUESTION)
            waited = await a.ok("open", **QUESTION)
            # A waits in the old child: the old child drains until this returns.
            waiting = asyncio.ensure_future(a.call("wait", timeout=40, id=waited["id"], timeout_s=25))
            await asyncio.sleep(0.3)
            deliver(v2)
            new = await until_version("0.2.99")
            assert new["pid"] != old["pid"]
            assert not waiting.done(), "the old child stopped before its call was answered"
            await b.ok("claim", id=held["id"])  # in the new child; it runs out 1.5 s later
            deadline = time.monotonic() + 20
            while "a newer handoff process keeps the clocks of this store now" not in node.log():
                assert time.monotonic() < deadline, "the old child's clock did not stop"
                await asyncio.sleep(0.1)
            await asyncio.sleep(0.5)  # had the old clock written too, its expiry would be in by now
            got = await a.ok("get", id=held["id"])
            expiries = [line for line in got["log"] if line["who"] == "handoff"]
            assert got["state"] == "open" and got["claim_expiries"] == 1 and len(expiries) == 1, got["log"]
            await b.ok("claim", id=waited["id"])  # the new child writes; the old child's wait wakes
            woke = await asyncio.wait_for(waiting, 10)
            assert woke["structuredContent"]["changed"] is True
            assert woke["structuredContent"]["entry"]["owner"] == caller_id(B)
        finally:
            await a.close()
            await b.close()

    try:
        asyncio.run(run())
    finally:
        node.kill()  # a failure may leave A's wait in flight, which a graceful stop would drain


def test_priority_is_stored_and_blocking_entries_are_listed_first(
    tmp_path: Path, bus: ConfiguredServer, stage: Path
) -> None:
    node = start_node(tmp_path, bus, "priority", {})
    try:

        async def run() -> None:
            a, b = await Seat.connect(bus, A), await Seat.connect(bus, B)
            try:
                older = await a.ok("open", **QUESTION)
                wanted = await a.ok("open", **QUESTION)
                listed = await b.ok("list", state="open")
                assert [e["id"] for e in listed["entries"]] == [older["id"], wanted["id"]], "oldest first"
                waiting = asyncio.ensure_future(a.call("wait", timeout=30, id=wanted["id"], timeout_s=20))
                deadline = time.monotonic() + 5
                while (await b.ok("get", id=wanted["id"]))["priority"] != "blocking":
                    assert time.monotonic() < deadline, "the opener's wait did not make it blocking"
                    await asyncio.sleep(0.05)
                listed = await b.ok("list", state="open")
                assert [(e["id"], e["priority"]) for e in listed["entries"]] == [
                    (wanted["id"], "blocking"),
                    (older["id"], "background"),
                ]
                # Stored with the entry: another process on the same file reads it too.
                other = StdioDesk(stage, node_store(node))
                try:
                    assert other.ok(None, "get", id=wanted["id"])["priority"] == "blocking"
                finally:
                    other.client.close()
                await b.ok("claim", id=listed["entries"][0]["id"])
                woke = await asyncio.wait_for(waiting, 10)
                assert woke["structuredContent"]["changed"] is True
                assert (await b.ok("get", id=wanted["id"]))["priority"] == "background"
            finally:
                await a.close()
                await b.close()

        asyncio.run(run())
    finally:
        node.terminate()


def test_watch_hears_of_work_as_it_appears(tmp_path: Path, bus: ConfiguredServer, stage: Path) -> None:
    """handoff.watch is a long poll: it returns as soon as a matching entry appears or changes,
    also when another process on the same store made the change."""
    node = start_node(tmp_path, bus, "watch", {})
    try:

        async def run() -> None:
            a, b = await Seat.connect(bus, A), await Seat.connect(bus, B)
            try:
                watching = asyncio.ensure_future(b.call("watch", timeout=30, state="open", timeout_s=20))
                await asyncio.sleep(0.5)
                assert not watching.done(), "a watch on an empty desk returned"
                opened = time.monotonic()
                entry = await a.ok("open", **QUESTION)
                page = (await asyncio.wait_for(watching, 10))["structuredContent"]
                print(f"the watch returned {time.monotonic() - opened:.3f} s after the open")
                assert [e["id"] for e in page["entries"]] == [entry["id"]] and page["timed_out"] is False
                assert "log" not in page["entries"][0]
                await b.ok("claim", id=entry["id"])
                quiet = await b.ok("watch", state="open", after=page["after"], timeout_s=0.5)
                assert quiet["entries"] == [] and quiet["timed_out"] is True
                # A change by another process on the same file wakes a watch served by the node's child.
                watching = asyncio.ensure_future(
                    b.call("watch", timeout=30, state="open", after=quiet["after"], timeout_s=20)
                )
                await asyncio.sleep(0.3)
                other = StdioDesk(stage, node_store(node))
                try:
                    opened = time.monotonic()
                    foreign = other.ok(C, "open", **QUESTION)
                    page = (await asyncio.wait_for(watching, 10))["structuredContent"]
                    print(f"a change in another process woke the watch after {time.monotonic() - opened:.3f} s")
                    assert [e["id"] for e in page["entries"]] == [foreign["id"]]
                finally:
                    other.client.close()
                text = await b.refused("watch", after=page["after"] + 100, timeout_s=1)
                assert "is not a change of this store" in text
                text = await b.refused("watch", timeout_s=301)
                assert "timeout_s 301 is out of range" in text
            finally:
                await a.close()
                await b.close()

        asyncio.run(run())
    finally:
        node.terminate()


def test_the_human_decides_and_the_waiting_opener_hears_it(tmp_path: Path, bus: ConfiguredServer) -> None:
    """HANDOFF_HUMANS names who decides: `@local` (the node's local identity) and AGENT_C/c, here the
    one who decides (no call comes from the mesh account: its users may not publish calls). The
    opener's wait, already in flight on the escalated entry, returns with the decision; the entry
    stays escalated."""
    node = start_node(tmp_path, bus, "human", {"HANDOFF_HUMANS": "@local, AGENT_C/c"}, local="OPS/samuel")
    try:

        async def run() -> None:
            a, b = await Seat.connect(bus, A), await Seat.connect(bus, B)
            c = await Seat.connect(bus, C)
            human = c
            try:
                money = await a.ok("open", **QUESTION)
                await a.ok("escalate", id=money["id"], thema="geld")
                later = await a.ok("open", **QUESTION)
                await a.ok("escalate", id=later["id"], thema="irreversibel")
                waiting = asyncio.ensure_future(a.call("wait", timeout=30, id=money["id"], timeout_s=20))
                await asyncio.sleep(0.3)
                assert not waiting.done(), "a wait on an undecided escalated entry returned"
                text = await b.refused("decide", id=money["id"], antwort="yes")
                assert "not one of the humans" in text and "HANDOFF_HUMANS (here: @local,AGENT_C/c)" in text
                decided = await human.ok("decide", id=money["id"], antwort="yes, at most 200 EUR")
                assert decided["state"] == "escalated" and decided["decided_by"] == caller_id(C)
                woke = (await asyncio.wait_for(waiting, 10))["structuredContent"]
                assert woke["changed"] is True and woke["entry"]["entscheidung"] == "yes, at most 200 EUR"
                log = (await a.ok("get", id=money["id"]))["log"]
                assert (log[-1]["who"], log[-1]["from"], log[-1]["to"], log[-1]["why"]) == (
                    caller_id(C),
                    "escalated",
                    "escalated",
                    "decided: yes, at most 200 EUR",
                )
                assert "a decision is final" in await c.refused("decide", id=money["id"], antwort="no")
                attention = await human.ok("attention")
                assert [e["id"] for e in attention["entries"]] == [later["id"], money["id"]]
                assert attention["undecided"] == 1
                assert (await c.ok("decide", id=later["id"], antwort="no"))["decided_by"] == caller_id(C)
            finally:
                for seat in (a, b, c):
                    await seat.close()

        asyncio.run(run())
    finally:
        node.terminate()


def test_release_withdraw_block_and_the_listings_filters(tmp_path: Path, bus: ConfiguredServer) -> None:
    node = start_node(tmp_path, bus, "verbs", {})
    try:
        a, b, c = BusCaller(bus, A), BusCaller(bus, B), BusCaller(bus, C)
        first = a.ok("open", **QUESTION)
        b.ok("claim", id=first["id"])
        assert "held by AGENT_B/b, not by you (AGENT_C/c)" in c.refused("release", id=first["id"])
        released = b.ok("release", id=first["id"])
        assert released["state"] == "open" and released["owner"] == "" and released["claim_expiries"] == 0
        assert released["log"][-1]["why"] == "released by its owner; open again"
        # Block on an open entry: anyone but its opener, who withdraws instead.
        assert "handoff.withdraw" in a.refused("block", id=first["id"], grund="never mind")
        blocked = c.ok("block", id=first["id"], grund="nobody here has line 7's files")
        assert blocked["state"] == "blocked" and blocked["log"][-1]["who"] == caller_id(C)
        second = a.ok("open", **QUESTION)
        b.ok("claim", id=second["id"])
        assert "only its opener withdraws" in b.refused("withdraw", id=second["id"], grund="mine")
        withdrawn = a.ok("withdraw", id=second["id"], grund="found it in the wiki")
        assert withdrawn["state"] == "blocked" and withdrawn["grund"] == "found it in the wiki"
        assert withdrawn["log"][-1]["why"] == "withdrawn by its opener: found it in the wiki"
        assert a.ok("attention")["entries"] == []
        # The listing: filters, pages, no logs.
        third = c.ok("open", **{**QUESTION, "projekt": "web"})
        b.ok("claim", id=third["id"])
        assert [e["id"] for e in a.ok("list", owner=caller_id(B))["entries"]] == [second["id"], third["id"]]
        assert [e["id"] for e in a.ok("list", opener=caller_id(C))["entries"]] == [third["id"]]
        assert [e["id"] for e in a.ok("list", since=third["opened_at"])["entries"]] == [third["id"]]
        page = a.ok("list", limit=2)
        assert [e["id"] for e in page["entries"]] == [first["id"], second["id"]] and "log" not in page["entries"][0]
        rest = a.ok("list", limit=2, cursor=page["next_cursor"])
        assert [e["id"] for e in rest["entries"]] == [third["id"]] and "next_cursor" not in rest
        assert "limit 500 is out of range" in a.refused("list", limit=500)
        assert "is not a time" in a.refused("list", since="last week")
        holders = a.ok("holders")
        assert holders["holders"][0]["owner"] == caller_id(B)
        assert [e["id"] for e in holders["holders"][0]["entries"]] == [third["id"]]
        assert a.ok("get", id=third["id"])["log"][-1]["to"] == "claimed"
    finally:
        node.terminate()


def test_the_readme_session_names_every_verb() -> None:
    """The module README shows a captured session of each verb."""
    readme = (MODULE_DIR / "README.md").read_text()
    for verb in ("open", "list", "get", "claim", "release", "answer", "ask", "reply", "block", "withdraw"):
        assert f"seat.handoff.{verb} " in readme, verb
    for verb in ("escalate", "decide", "wait", "watch", "holders", "attention"):
        assert f"seat.handoff.{verb}" in readme, verb
