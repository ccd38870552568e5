"""On the README's default set-up (a node on its embedded bus, which has accounts by default): no
client passes for anyone else, to a tool, to the memory or to the handoff desk, whatever it writes
in `Nats-Request-Info`, in `Mesh-Person` or in its arguments; a delegate (here a console made by
`meshctl caller add --delegate console`, and the bus's own face, `meshctl mcp`) passes the person
behind each call, and two people through one delegate are two authors with two private scopes.

Real node, real nats-server, the real memory (Python) and handoff (Go) bundles.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import stat
import subprocess
from pathlib import Path
from typing import Any, Iterator

import nats
import pytest
from mcp import Client as McpClient
from mcp.client.stdio import StdioServerParameters
from nats.aio.client import Client

from runtime.wire.identity import PERSON, Person, encode_person, os_user
from tests.support.callers import FORGED_ARGS, FORGED_HEADERS
from tests.support.mesh import FAST_CONFIG, MESHCTL, ROOT, NodeProcess, make_module, wait_state

pytestmark = pytest.mark.slow

CONFIG = (
    FAST_CONFIG.replace("init_timeout_s = 2", "init_timeout_s = 30")
    + """
[[nats.caller]]
account = "alice"
user = "alice"
password = "alice-pw"

[[nats.caller]]
account = "bob"
user = "bob"
password = "bob-pw"
"""
)
IDP = "https://idp.example/"
ANNA, BERT = Person(iss=IDP, sub="anna", name="Anna"), Person(iss=IDP, sub="bert", name="Bert")
ANNA_ID, BERT_ID = "person:https%3A%2F%2Fidp.example%2F/anna", "person:https%3A%2F%2Fidp.example%2F/bert"
QUESTION = {"projekt": "ledger", "frage": "Who owns the freeze?", "versucht": "the wiki", "benoetigt": "a name"}


class Stack:
    def __init__(self, node: NodeProcess, console: dict[str, Any]) -> None:
        self.node, self.console = node, console
        info = json.loads((node.state_dir / "bus.json").read_text())
        self.url = info["url"]
        self.mesh_password = (node.state_dir / "bus-mesh.password").read_text().strip()

    async def connect(self, user: str, password: str) -> Client:
        return await nats.connect(self.url, user=user, password=password, name=f"{user}-client")


def meshctl(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, MESH_STATE_DIR=str(state))
    return subprocess.run([*MESHCTL, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    base = tmp_path_factory.mktemp("identity-embedded")
    mods = base / "mods"
    make_module(mods, "who")
    for module in ("memory", "handoff"):
        shutil.copytree(ROOT / "bundles" / module, mods / module, ignore=shutil.ignore_patterns("__pycache__"))
    node = NodeProcess(base, mods, None, "ident-embedded", config=CONFIG)
    try:
        node.wait_log("serving on", timeout=600)  # handoff is built first (Go, SQLite: a minute cold)
        out = base / "console.caller.json"
        r = meshctl(node.state_dir, "caller", "add", "console", "--delegate", "console", "--out", str(out))
        assert r.returncode == 0, r.stderr
        stack = Stack(node, json.loads(out.read_text()))

        async def ready() -> None:
            ops = await stack.connect("mesh-node", stack.mesh_password)
            try:
                for bundle in ("who/tools", "memory/tools", "handoff/tools"):
                    await wait_state(ops, node.name, bundle, "ready", timeout=600)
            finally:
                await ops.close()

        asyncio.run(ready())
        yield stack
    finally:
        node.kill()


async def ask(nc: Client, subject: str, args: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
    """(code, body): 200 and the CallToolResult, or the runtime error's code and its one line."""
    msg = await nc.request(subject, json.dumps(args).encode(), timeout=30, headers=headers)
    code = (msg.headers or {}).get("Nats-Service-Error-Code")
    if code:
        return int(code), (msg.headers or {}).get("Nats-Service-Error", "")
    return 200, json.loads(msg.data)


async def ok(nc: Client, subject: str, args: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
    code, body = await ask(nc, subject, args, headers)
    assert code == 200 and not body.get("isError"), (code, body)
    return body["structuredContent"]


def as_person(person: Person, **more: str) -> dict[str, str]:
    return {PERSON: encode_person(person), **more}


async def test_a_caller_forging_a_stamp_is_itself_to_the_tool_the_memory_and_the_desk(stack: Stack) -> None:
    alice, bob = await stack.connect("alice", "alice-pw"), await stack.connect("bob", "bob-pw")
    try:
        # The server replaced the stamp alice wrote (she claimed bob): the tool sees alice.
        seen = await ok(alice, "mesh.tool.who.meta", FORGED_ARGS, FORGED_HEADERS)
        assert seen["_meta"]["mesh/caller"] == {
            "account": "alice",
            "user": "alice",
            "name": "alice-client",
            "via": "bus",
        }
        # The memory: her private entry is hers, and bob does not see it.
        written = await ok(
            alice,
            "mesh.seat.memory.remember",
            {"content": "The ledger freeze is on the 4th.", "type": "status", "scope": "private"},
            FORGED_HEADERS,
        )
        assert (written["author"], written["source"]) == ("alice/alice", "bus")
        for nc, expected in ((bob, []), (alice, [written["id"]])):
            found = await ok(nc, "mesh.seat.memory.recall", {"scope": "private"})
            assert [e["id"] for e in found["entries"]] == expected
        # The desk: she is the opener, whatever she claimed.
        opened = await ok(alice, "mesh.seat.handoff.open", QUESTION, FORGED_HEADERS)
        assert opened["opener"] == "alice/alice", opened
        # A person from a caller that is not a delegate is refused, naming why; nothing is written.
        code, why = await ask(
            alice, "mesh.seat.memory.remember", {"content": "x", "type": "status"}, as_person(ANNA, **FORGED_HEADERS)
        )
        assert code == 400 and "Mesh-Person header is refused: caller alice/alice is not a delegate" in why, why
        code, why = await ask(alice, "mesh.seat.handoff.open", QUESTION, as_person(ANNA))
        assert code == 400 and "not a delegate" in why
        # Any other Mesh-* header that would name a caller is a bad request too.
        code, why = await ask(alice, "mesh.tool.who.meta", {}, {"Mesh-Caller": "bob/bob"})
        assert code == 400 and "unknown header 'Mesh-Caller'" in why
    finally:
        await alice.close()
        await bob.close()


async def test_two_people_through_one_delegate_are_two_authors_and_two_owners(stack: Stack) -> None:
    console = await stack.connect(stack.console["user"], stack.console["password"])
    try:
        seen = await ok(console, "mesh.tool.who.meta", {}, as_person(ANNA, **FORGED_HEADERS))
        assert seen["_meta"]["mesh/caller"] == {
            "account": "console",
            "user": "console",
            "name": "console-client",
            "via": "console",
            "person": {"iss": IDP, "sub": "anna", "name": "Anna"},
        }
        secret = await ok(
            console,
            "mesh.seat.memory.remember",
            {"content": "Anna's own note on the audit.", "type": "status", "scope": "private"},
            as_person(ANNA),
        )
        assert (secret["author"], secret["source"]) == (ANNA_ID, "console")
        mine = await ok(console, "mesh.seat.memory.recall", {"scope": "private"}, as_person(ANNA))
        theirs = await ok(console, "mesh.seat.memory.recall", {"scope": "private"}, as_person(BERT))
        assert [e["id"] for e in mine["entries"]] == [secret["id"]] and theirs["entries"] == []
        words = await ok(console, "mesh.seat.memory.recall", {"query": "audit"}, as_person(BERT))
        assert secret["id"] not in [e["id"] for e in words["entries"]]
        # The delegate's own call, without a person, is neither of them.
        nobody = await ok(console, "mesh.seat.memory.recall", {"scope": "private"})
        assert nobody["entries"] == []
        # The desk: Anna opens, Bert claims.
        opened = await ok(console, "mesh.seat.handoff.open", QUESTION, as_person(ANNA))
        claimed = await ok(console, "mesh.seat.handoff.claim", {"id": opened["id"]}, as_person(BERT))
        assert (opened["opener"], claimed["owner"]) == (ANNA_ID, BERT_ID), claimed
        # A person the delegate wrote wrong is named, not guessed.
        code, why = await ask(console, "mesh.tool.who.meta", {}, {PERSON: '{"iss": "x"}'})
        assert code == 400 and why.startswith("mesh.tool.who.meta: the Mesh-Person header is not a person"), why
    finally:
        await console.close()


async def test_meshctl_mcp_is_the_face_user_with_the_os_user_behind_it(stack: Stack) -> None:
    """Over stdio the face connects as the embedded bus's face user (never the mesh account) and
    passes the OS user who started it as the person; the memory records that person, source mcp."""
    env = {**os.environ, "MESH_STATE_DIR": str(stack.node.state_dir)}
    args = [*MESHCTL[1:], "mcp", "--only", "who_meta", "--only", "memory_*"]
    face = StdioServerParameters(command=MESHCTL[0], args=args, cwd=str(ROOT), env=env)
    me = {"iss": f"unix:{socket.gethostname()}", "sub": os_user(), "name": os_user()}
    async with McpClient(face, mode="legacy", cache=None) as c:
        result = await c.call_tool("who_meta", FORGED_ARGS)
        assert isinstance(result.structured_content, dict)
        seen = result.structured_content["_meta"]["mesh/caller"]
        assert seen == {"account": "faces", "user": "mesh-mcp", "name": "meshctl-mcp", "via": "mcp", "person": me}
        written = await c.call_tool("memory_remember", {"content": "Through the face.", "type": "status"})
        assert not written.is_error and isinstance(written.structured_content, dict), written
        person_id = f"person:{me['iss'].replace(':', '%3A')}/{me['sub']}"
        assert (written.structured_content["author"], written.structured_content["source"]) == (person_id, "mcp")


async def test_the_mesh_account_calls_nothing_and_the_stores_are_their_owners(stack: Stack) -> None:
    errors: list[str] = []

    async def on_error(e: Exception) -> None:
        errors.append(str(e))

    ops = await nats.connect(stack.url, user="mesh-node", password=stack.mesh_password, error_cb=on_error)
    try:
        await ops.publish("mesh.seat.memory.recall", b"{}", reply=ops.new_inbox(), headers=FORGED_HEADERS)
        await ops.flush()
        for _ in range(100):
            if errors:
                break
            await asyncio.sleep(0.05)
        assert errors and "permissions violation" in errors[0].lower(), errors
    finally:
        await ops.close()
    data = stack.node.state_dir / "data"
    stores = [p for p in data.rglob("*") if p.is_file()]
    assert any(p.name == "memory.sqlite3" for p in stores) and any(p.parent.name == "handoff" for p in stores)
    for path in [data, *[p for p in data.rglob("*") if p.is_dir()]]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
    for path in stores:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
