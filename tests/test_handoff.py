"""bundles/handoff, built by the Go toolchain and driven over real stdio as the node would drive
it: two callers (ALICE/alice and BOB/bob) in `_meta["mesh/caller"]`, the contract's points one by
one, and the module's own clocks with limits of a second or two and nobody calling.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from tests.support.call_contract import expected_id
from tests.support.mesh import MESHCTL, call, client, wait_state
from tests.support.sdk import build_context, facts_env, require
from tests.support.stdio_client import StdioClient
from toolchains.go import TOOLCHAIN

REPO = Path(__file__).resolve().parent.parent
MODULE_DIR = REPO / "bundles" / "handoff"

pytestmark = [pytest.mark.slow, pytest.mark.toolchain("go")]

ALICE = {"account": "ALICE", "user": "alice", "name": "agent-a", "via": "bus"}
BOB = {"account": "BOB", "user": "bob", "name": None, "via": "bus"}
CAROL = {"account": "CAROL", "user": None, "name": None, "via": "local"}
VERBS = {"open", "list", "get", "claim", "release", "answer", "ask", "reply", "block", "withdraw", "escalate", "decide"}
VERBS |= {"wait", "watch", "holders", "attention"}
TOPICS = ["geld", "aussenwirkung", "irreversibel", "zugangsdaten", "prioritaet_scope"]
QUESTION = {
    "projekt": "p",
    "frage": "Which port does the staging database listen on?",
    "versucht": "read the repo's docs and configs",
    "benoetigt": "the port number",
}


@pytest.fixture(scope="module")
def stage(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require(TOOLCHAIN)
    base = tmp_path_factory.mktemp("handoff")
    TOOLCHAIN.build(build_context(MODULE_DIR, base / "stage", base / "cache"))
    return base / "stage"


class Desk:
    """The handoff child over stdio; each call says who makes it, as the node would."""

    def __init__(self, stage: Path, data: Path, limits: dict[str, str]) -> None:
        env = facts_env("handoff", stage, data, **limits)
        self.client = StdioClient([str(stage / "bin" / "handoff")], cwd=stage, env=env)
        self.client.initialize()

    def call(self, who: dict[str, Any] | None, verb: str, **arguments: Any) -> dict[str, Any]:
        meta = {"mesh/caller": who} if who else None
        return self.client.call(f"handoff.{verb}", arguments, meta=meta)

    def ok(self, who: dict[str, Any] | None, verb: str, **arguments: Any) -> Any:
        result = self.call(who, verb, **arguments)
        assert not result.get("isError"), result["content"]
        return result["structuredContent"]

    def refused(self, who: dict[str, Any] | None, verb: str, **arguments: Any) -> str:
        result = self.call(who, verb, **arguments)
        assert result.get("isError") is True, result
        return result["content"][0]["text"]


@pytest.fixture
def make_desk(stage: Path, tmp_path: Path) -> Iterator[Callable[..., Desk]]:
    desks: list[Desk] = []

    def make(**limits: str) -> Desk:
        desk = Desk(stage, tmp_path / "data", limits)
        desks.append(desk)
        return desk

    yield make
    for desk in desks:
        desk.client.close()


@pytest.fixture
def desk(make_desk: Callable[..., Desk]) -> Desk:
    return make_desk()


def cid(caller: dict[str, Any]) -> str:
    return expected_id(caller)  # the SDKs' one rule (tests/support/call_contract.py)


def test_the_sixteen_verbs_are_listed(desk: Desk) -> None:
    tools = {t["name"]: t for t in desk.client.list_tools()}
    assert set(tools) == {f"handoff.{v}" for v in VERBS}
    assert sorted(tools["handoff.open"]["inputSchema"]["required"]) == ["benoetigt", "frage", "projekt", "versucht"]
    assert "owner" not in str(tools["handoff.claim"]["inputSchema"]), "the owner is never an argument"


def test_point1_an_entry_without_the_four_fields_is_refused(desk: Desk) -> None:
    text = desk.refused(ALICE, "open", **{**QUESTION, "versucht": "  ", "benoetigt": ""})
    assert "versucht, benoetigt empty or missing" in text and "all four" in text
    missing = {k: v for k, v in QUESTION.items() if k != "frage"}
    assert "frage" in desk.refused(ALICE, "open", **missing)
    assert desk.ok(None, "list")["entries"] == [], "a refused entry must not be stored"


def test_without_a_caller_nothing_is_opened_or_claimed(desk: Desk) -> None:
    text = desk.refused(None, "open", **QUESTION)
    assert "no caller identity" in text and "mesh/caller" in text
    entry = desk.ok(ALICE, "open", **QUESTION)
    assert "no caller identity" in desk.refused(None, "claim", id=entry["id"])
    assert desk.ok(None, "get", id=entry["id"])["state"] == "open", "reading needs no identity"


def test_point2_one_owner_from_the_claim_taken_from_the_caller(desk: Desk) -> None:
    entry = desk.ok(ALICE, "open", **QUESTION)
    assert entry["id"] == "h-1" and entry["state"] == "open" and entry["opener"] == cid(ALICE) and entry["owner"] == ""
    # B finds it by polling, not by a message from A.
    [found] = desk.ok(BOB, "list", state="open")["entries"]
    assert found["id"] == entry["id"]
    # An owner in the arguments is refused outright; the owner is the caller.
    assert "owner" in desk.refused(BOB, "claim", id=entry["id"], owner=cid(ALICE))
    claimed = desk.ok(BOB, "claim", id=entry["id"])
    assert claimed["state"] == "claimed" and claimed["owner"] == cid(BOB)
    assert "held by BOB/bob" in desk.refused(CAROL, "claim", id=entry["id"])
    assert "opened by you" in desk.refused(ALICE, "claim", id=desk.ok(ALICE, "open", **QUESTION)["id"])
    [held] = desk.ok(CAROL, "holders")["holders"]
    assert held["owner"] == cid(BOB) and [e["id"] for e in held["entries"]] == [entry["id"]]
    assert "not by you (local:CAROL)" in desk.refused(CAROL, "answer", id=entry["id"], antwort="5432?")
    answered = desk.ok(BOB, "answer", id=entry["id"], antwort="5433")
    assert answered["state"] == "resolved" and answered["antwort"] == "5433" and answered["id"] == entry["id"]
    assert desk.ok(CAROL, "holders") == {"holders": []}
    assert "resolved, which is final" in desk.refused(CAROL, "claim", id=entry["id"])
    assert 'no entry "h-9"' in desk.refused(BOB, "get", id="h-9")


def test_point3_one_follow_up_and_the_second_blocks(desk: Desk) -> None:
    entry = desk.ok(ALICE, "open", **QUESTION)
    desk.ok(BOB, "claim", id=entry["id"])
    assert "no follow-up question" in desk.refused(ALICE, "reply", id=entry["id"], antwort="early")
    asked = desk.ok(BOB, "ask", id=entry["id"], rueckfrage="staging in which region?")
    assert asked["state"] == "claimed" and asked["rueckfrage"] == "staging in which region?"
    assert "only the opener" in desk.refused(BOB, "reply", id=entry["id"], antwort="me")
    replied = desk.ok(ALICE, "reply", id=entry["id"], antwort="eu-west")
    assert replied["rueckfrage_antwort"] == "eu-west"
    blocked = desk.ok(BOB, "ask", id=entry["id"], rueckfrage="and which cluster?")
    assert blocked["state"] == "blocked" and "second follow-up" in blocked["log"][-1]["why"]
    assert desk.ok(ALICE, "attention")["entries"] == []


def test_point4_only_the_five_topics_escalate_and_only_escalated_reach_the_human(desk: Desk) -> None:
    parked = desk.ok(ALICE, "open", **QUESTION)
    desk.ok(BOB, "claim", id=parked["id"])
    desk.ok(BOB, "block", id=parked["id"], grund="nobody here can reach staging")
    held = desk.ok(ALICE, "open", **QUESTION)
    desk.ok(BOB, "claim", id=held["id"])
    assert "grund is empty" in desk.refused(BOB, "block", id=held["id"], grund=" ")
    assert "only the owner" in desk.refused(ALICE, "block", id=held["id"], grund="I give up")
    other = desk.ok(ALICE, "open", **QUESTION)
    text = desk.refused(ALICE, "escalate", id=other["id"], thema="dringend")
    assert '"dringend" reaches no human' in text and ", ".join(TOPICS) in text
    assert "neither the opener" in desk.refused(CAROL, "escalate", id=other["id"], thema="geld")
    escalated = [desk.ok(ALICE, "escalate", id=desk.ok(ALICE, "open", **QUESTION)["id"], thema=t) for t in TOPICS]
    assert all(e["state"] == "escalated" for e in escalated)
    attention = desk.ok(CAROL, "attention")["entries"]
    assert [e["id"] for e in attention] == [e["id"] for e in escalated]
    assert [e["thema"] for e in attention] == TOPICS
    assert parked["id"] not in {e["id"] for e in attention}
    assert desk.ok(CAROL, "get", id=parked["id"])["grund"] == "nobody here can reach staging", "blocked stays readable"
    assert "blocked, which is final" in desk.refused(ALICE, "escalate", id=parked["id"], thema="geld")
    assert 'state "done" is not a state' in desk.refused(CAROL, "list", state="done")
    assert [e["id"] for e in desk.ok(CAROL, "list", state="blocked")["entries"]] == [parked["id"]]


def test_point5_priority_is_blocking_while_the_opener_waits(desk: Desk) -> None:
    entry = desk.ok(ALICE, "open", **QUESTION)
    assert entry["priority"] == "background"
    assert "timeout_s" in desk.refused(ALICE, "wait", id=entry["id"], timeout_s=0)
    desk.client.send_call(900, "handoff.wait", {"id": entry["id"], "timeout_s": 10}, meta={"mesh/caller": ALICE})
    deadline = time.monotonic() + 5
    while desk.ok(BOB, "get", id=entry["id"])["priority"] != "blocking":
        assert time.monotonic() < deadline, "the opener's wait did not make the entry blocking"
        time.sleep(0.02)
    assert desk.ok(BOB, "list", state="open")["entries"][0]["priority"] == "blocking"
    # The claim wakes the wait; read both replies, in whichever order they come.
    desk.client.send_call(901, "handoff.claim", {"id": entry["id"]}, meta={"mesh/caller": BOB})
    replies = {r["id"]: r["result"] for r in desk.client.read_replies(2, timeout=5)}
    woke = replies[900]["structuredContent"]
    assert woke["changed"] is True and woke["entry"]["state"] == "claimed" and woke["entry"]["owner"] == cid(BOB)
    assert desk.ok(BOB, "get", id=entry["id"])["priority"] == "background", "nobody waits any more"
    # A wait that sees no change returns at its timeout, unchanged; a wait by another is not blocking.
    started = time.monotonic()
    quiet = desk.ok(CAROL, "wait", id=entry["id"], timeout_s=0.3)
    assert quiet["changed"] is False and quiet["entry"]["priority"] == "background"
    assert 0.25 < time.monotonic() - started < 3


def test_point6_the_full_log_is_readable(desk: Desk) -> None:
    entry = desk.ok(ALICE, "open", **QUESTION)
    desk.ok(BOB, "claim", id=entry["id"])
    desk.ok(BOB, "ask", id=entry["id"], rueckfrage="which region?")
    desk.ok(ALICE, "reply", id=entry["id"], antwort="eu-west")
    desk.ok(BOB, "answer", id=entry["id"], antwort="5433")
    log = desk.ok(CAROL, "get", id=entry["id"])["log"]
    assert [(line["who"], line["from"], line["to"]) for line in log] == [
        ("ALICE/alice", "", "open"),
        ("BOB/bob", "open", "claimed"),
        ("BOB/bob", "claimed", "claimed"),
        ("ALICE/alice", "claimed", "claimed"),
        ("BOB/bob", "claimed", "resolved"),
    ]
    assert [line["why"] for line in log] == [
        "opened",
        "claimed",
        "follow-up question: which region?",
        "reply to the follow-up: eu-west",
        "answered",
    ]
    stamps = [line["at"] for line in log]
    assert stamps == sorted(stamps) and all(s.endswith("Z") for s in stamps)


def test_clocks_run_when_nobody_calls(make_desk: Callable[..., Desk]) -> None:
    desk = make_desk(HANDOFF_CLAIM_S="1", HANDOFF_UNANSWERED_S="4")
    held = desk.ok(ALICE, "open", **QUESTION)
    quiet = desk.ok(ALICE, "open", **QUESTION)
    desk.ok(BOB, "claim", id=held["id"])
    opened = time.monotonic()
    time.sleep(1.4)  # nobody calls: the module's own ticker must act
    first = desk.ok(CAROL, "get", id=held["id"])
    assert first["state"] == "open" and first["owner"] == "" and first["claim_expiries"] == 1
    assert first["log"][-1]["who"] == "handoff" and "claim by BOB/bob ran out" in first["log"][-1]["why"]
    desk.ok(CAROL, "claim", id=held["id"])
    time.sleep(1.4)
    second = desk.ok(CAROL, "get", id=held["id"])
    assert second["state"] == "blocked" and "second claim ran out" in second["log"][-1]["why"]
    assert desk.ok(CAROL, "get", id=quiet["id"])["state"] == "open", "4 s have not passed yet"
    time.sleep(max(0.0, 4.4 - (time.monotonic() - opened)))
    late = desk.ok(CAROL, "get", id=quiet["id"])
    assert late["state"] == "blocked" and "unanswered 4s" in late["log"][-1]["why"]
    assert desk.ok(CAROL, "attention")["entries"] == [], "blocked by a clock reaches no human"


def test_entries_survive_a_restart(make_desk: Callable[..., Desk]) -> None:
    first = make_desk()
    entry = first.ok(ALICE, "open", **QUESTION)
    first.ok(BOB, "claim", id=entry["id"])
    assert first.client.close() == 0
    second = make_desk()
    again = second.ok(CAROL, "get", id=entry["id"])
    assert again["state"] == "claimed" and again["owner"] == cid(BOB) and len(again["log"]) == 2
    assert second.ok(ALICE, "open", **QUESTION)["id"] == "h-2"


def test_a_bad_limit_is_named(stage: Path, tmp_path: Path) -> None:
    env = facts_env("handoff", stage, tmp_path / "d", node="n", HANDOFF_CLAIM_S="ten minutes")
    client = StdioClient([str(stage / "bin" / "handoff")], cwd=stage, env=env)
    assert client.proc.wait(10) == 2
    assert client.proc.stderr is not None
    stderr = client.proc.stderr.read().decode()
    assert "HANDOFF_CLAIM_S" in stderr and "ten minutes" in stderr


def test_a_bad_humans_setting_is_named(stage: Path, tmp_path: Path) -> None:
    env = facts_env("handoff", stage, tmp_path / "d", node="n", HANDOFF_HUMANS="@local, ops team")
    client = StdioClient([str(stage / "bin" / "handoff")], cwd=stage, env=env)
    assert client.proc.wait(10) == 2
    assert client.proc.stderr is not None
    stderr = client.proc.stderr.read().decode()
    assert "HANDOFF_HUMANS" in stderr and "ops team" in stderr and "ACCOUNT/user" in stderr


def test_go_unit_tests() -> None:
    """`go test` of bundles/handoff/src: the state machine and the clocks on a fake clock."""
    require(TOOLCHAIN)
    proc = subprocess.run(
        ["go", "test", "-count=1", "./..."], cwd=MODULE_DIR / "src", capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ok" in proc.stdout


async def test_built_delivered_and_served(tmp_path: Path, node_factory: Any, nats_server: Any) -> None:
    """`meshctl bundle build` packs the bundle, `meshctl bundle deliver` puts it on a node that
    has no manifests of its own, and the node serves the seat on mesh.seat.handoff.*."""
    require(TOOLCHAIN)
    empty = tmp_path / "no-manifests"
    empty.mkdir()
    node = node_factory(empty)
    out = tmp_path / "out"
    built = subprocess.run(
        [*MESHCTL, "bundle", "build", str(MODULE_DIR), "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    [artifact] = out.glob("handoff-*.tar.gz")
    delivered = subprocess.run(
        [*MESHCTL, "bundle", "deliver", str(artifact), "--node", node.name, "--nats", nats_server.url],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert delivered.returncode == 0, delivered.stdout + delivered.stderr
    nc = await client(nats_server.url)
    try:
        ready = await wait_state(nc, node.name, "handoff/tools", "ready", timeout=60)
        assert sorted(ready["tools"]) == sorted(f"handoff.{v}" for v in VERBS)
        # `ready` means the seat's subjects answer here (its lease was looked at): no retry.
        code, listed = await call(nc, "mesh.seat.handoff.list", {"state": "open"})
        assert (code, listed["structuredContent"]["entries"]) == (200, [])
        code, refused = await call(nc, "mesh.seat.handoff.list", {"state": "done"})
        assert (
            code == 200
            and refused["isError"] is True
            and 'state "done" is not a state' in refused["content"][0]["text"]
        )
    finally:
        await nc.close()
