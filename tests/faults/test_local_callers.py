"""The README's default set-up (one node, its embedded bus, no config) with another OS user of the
same machine (uid 65534, nobody): without credentials it cannot connect to the bus or read the
node's state (bus passwords, the stores); with the caller file the operator hands it (`meshctl
caller add`) it is a caller of its own: never the operator, never able to write the delivery or
seat buckets, and gone again after `meshctl caller remove`.

The node runs as root here; the state folder sits in a folder everyone may enter (pytest's own
tmp_path is root's alone, which would hide what the node's own modes do).
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import nats
import pytest

from tests.support import mesh
from tests.support.mesh import FAST_CONFIG, MESHCTL, NodeProcess, make_module, wait_for, wait_state

# Run as nobody: what one OS user tries against another's node. It prints one JSON object.
PROBE = r"""
import asyncio, json, os, sys

import nats

state, url, caller_file, node = sys.argv[1:5]
found = {}


def attempt(what, fn):
    try:
        found[what] = ["ok", fn()]
    except Exception as e:
        found[what] = [type(e).__name__, str(e)[:300]]


attempt("list_state", lambda: sorted(os.listdir(state)))
attempt("read_mesh_password", lambda: open(os.path.join(state, "bus-mesh.password")).read())
attempt("read_bus_json", lambda: open(os.path.join(state, "bus.json")).read())
attempt("read_store", lambda: open(os.path.join(state, "data", "who", "store.json")).read())


async def bus():
    async def quiet(e):
        pass

    try:
        nc = await nats.connect(url, allow_reconnect=False, max_reconnect_attempts=0, error_cb=quiet)
        found["connect_without_credentials"] = ["ok", nc.connected_url.netloc]
        await nc.close()
    except Exception as e:
        found["connect_without_credentials"] = [type(e).__name__, str(e)[:300]]
    if caller_file == "-":
        return
    login = json.load(open(caller_file))
    errors = []

    async def on_error(e):
        errors.append(str(e))

    nc = await nats.connect(url, user=login["user"], password=login["password"], error_cb=on_error)
    try:
        await nc.request(f"mesh.node.{node}.status", b"", timeout=2)
        found["node_status"] = ["ok", "answered"]
    except Exception as e:
        found["node_status"] = [type(e).__name__, str(e)[:300]]
    js = nc.jetstream()
    for bucket in ("mesh-membership", "mesh-seat-leases", "mesh-seat-homes"):
        try:
            kv = await js.key_value(bucket)
            await kv.put(f"node.{node}", b'{"modules": []}')
            found["write_" + bucket] = ["ok", "written"]
        except Exception as e:
            found["write_" + bucket] = [type(e).__name__, str(e)[:300]]
    try:
        await js.create_key_value(bucket="mesh-membership")
        found["create_bucket"] = ["ok", "created"]
    except Exception as e:
        found["create_bucket"] = [type(e).__name__, str(e)[:300]]
    # Listening on everything of its own account while the operator calls: none of it arrives here.
    seen = []

    async def spy(msg):
        seen.append(msg.subject)

    await nc.subscribe(">", cb=spy)
    await nc.flush()
    if os.environ.get("PROBE_READY"):
        open(os.environ["PROBE_READY"], "w").close()
        for _ in range(600):  # until the test says the operator's calls are done (at most 60 s)
            if os.path.exists(os.environ["PROBE_STOP"]):
                break
            await asyncio.sleep(0.1)
    found["spied"] = ["ok", seen]
    found["errors"] = ["ok", errors]
    await nc.close()


asyncio.run(bus())
print(json.dumps(found))
"""


def as_nobody(root: Path) -> tuple[list[str], dict[str, str]]:
    """argv prefix and environment that run this checkout's Python code as nobody (skip where it cannot)."""
    nobody = pwd.getpwnam("nobody")
    prefix = ["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups"]
    site = next(p for p in sys.path if p.endswith("site-packages") and ".venv" in p)
    env = {"HOME": str(root / "nobody-home"), "PYTHONPATH": f"{mesh.ROOT}:{site}", "PATH": "/usr/bin:/bin"}
    (root / "nobody-home").mkdir(exist_ok=True)
    os.chown(root / "nobody-home", nobody.pw_uid, nobody.pw_gid)
    check = subprocess.run([*prefix, "/usr/bin/python3", "-c", "import nats, msgspec"], env=env, capture_output=True)
    if check.returncode:
        pytest.skip(f"`nobody` cannot run this checkout on /usr/bin/python3 here: {check.stderr[-300:]!r}")
    return prefix, env


def probe(root: Path, state: Path, url: str, caller_file: str, node: str, listen: bool = False) -> dict[str, Any]:
    prefix, env = as_nobody(root)
    script = root / "probe.py"
    script.write_text(PROBE)
    script.chmod(0o644)
    r = subprocess.run(
        [*prefix, "/usr/bin/python3", str(script), str(state), url, caller_file, node],
        env={
            **env,
            **(
                {"PROBE_READY": str(root / "nobody-home" / "probe.ready"), "PROBE_STOP": str(root / "probe.stop")}
                if listen
                else {}
            ),
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def meshctl_as(root: Path, *args: str, nobody: bool, state: Path) -> subprocess.CompletedProcess[str]:
    if nobody:
        prefix, env = as_nobody(root)
        argv, env = [*prefix, "/usr/bin/python3", "-m", "runtime.meshctl", *args], env
    else:
        argv, env = [*MESHCTL, *args], dict(os.environ, MESH_STATE_DIR=str(state))
    return subprocess.run(argv, cwd=mesh.ROOT, env=env, capture_output=True, text=True, timeout=60)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def test_another_os_user_gets_nothing_but_what_the_operator_hands_it(world_readable_dir: Path) -> None:
    root = world_readable_dir
    make_module(root / "mods", "who")
    node = NodeProcess(root, root / "mods", None, "shared-host", config=FAST_CONFIG)
    try:
        node.wait_log("serving on")
        state = node.state_dir
        info = json.loads((state / "bus.json").read_text())
        url = info["url"]
        # The operator (the node's own user) writes something into the module's store, as a call.
        r = meshctl_as(
            root, "call", "tool.who.remember", '{"key": "plan", "value": "secret"}', nobody=False, state=state
        )
        for _ in range(50):
            if r.returncode == 0:
                break
            r = meshctl_as(
                root, "call", "tool.who.remember", '{"key": "plan", "value": "secret"}', nobody=False, state=state
            )
        assert r.returncode == 0, r.stderr
        store = state / "data" / "who" / "store.json"
        # The modes themselves: the state folder, the data folders, what a child writes, every secret.
        assert mode(state) == 0o700 and mode(state / "data") == 0o700 and mode(store.parent) == 0o700
        assert mode(store) == 0o600, oct(mode(store))  # the child's umask 077
        for secret in ("bus.json", "bus-mesh.password", "bus-local.password", "bus-mcp.password", "nats-server.conf"):
            assert mode(state / secret) == 0o600, secret

        # Another OS user with nothing: refused by the bus, and by every file.
        seen = probe(root, state, url, "-", node.name)
        print("\nnobody, without credentials:", json.dumps(seen, indent=1))
        assert seen["connect_without_credentials"][0] != "ok" and "authorization" in json.dumps(seen).lower()
        for what in ("list_state", "read_mesh_password", "read_bus_json", "read_store"):
            assert seen[what][0] == "PermissionError", (what, seen[what])
        # meshctl of that user finds no node of its own, and says what would do.
        r = meshctl_as(root, "call", "tool.who.meta", nobody=True, state=state)
        assert r.returncode == 2 and "caller file" in r.stderr, r.stderr
        r = meshctl_as(root, "call", "tool.who.meta", "--state-dir", str(state), nobody=True, state=state)
        assert r.returncode == 2 and "cannot read" in r.stderr and "caller add" in r.stderr, r.stderr

        # The operator hands it a caller of its own.
        handed = root / "carol.caller.json"
        r = meshctl_as(
            root, "caller", "add", "carol", "--out", str(handed), "--owner", "nobody", nobody=False, state=state
        )
        assert r.returncode == 0, r.stderr
        assert mode(handed) == 0o600 and handed.stat().st_uid == pwd.getpwnam("nobody").pw_uid
        listed = json.loads(meshctl_as(root, "caller", "list", "--json", nobody=False, state=state).stdout)
        assert {(c["account"], c["user"], c["kind"]) for c in listed} >= {
            ("carol", "carol", "added"),
            ("LOCAL", "mesh-local", "operator"),
            ("faces", "mesh-mcp", "face"),
        }
        r = meshctl_as(
            root, "call", "tool.who.meta", "{}", "--json", "--caller-file", str(handed), nobody=True, state=state
        )
        assert r.returncode == 0, r.stderr
        who = json.loads(r.stdout)["structuredContent"]["_meta"]["mesh/caller"]
        assert who == {"account": "carol", "user": "carol", "name": "meshctl", "via": "bus"}, who
        # The operator's own call is still the operator's (the local identity), after the reload too.
        r = meshctl_as(root, "call", "tool.who.meta", "{}", "--json", nobody=False, state=state)
        assert r.returncode == 0, r.stderr
        operator = json.loads(r.stdout)["structuredContent"]["_meta"]["mesh/caller"]
        assert operator["via"] == "local" and operator != who

        # As that caller: no bucket written or made, no node control subject, nothing of the mesh
        # account's traffic seen, while the operator calls meanwhile.
        spying = asyncio.create_task(asyncio.to_thread(probe, root, state, url, str(handed), node.name, True))
        await wait_for(
            lambda: (root / "nobody-home" / "probe.ready").exists() or spying.done(), "carol's probe listening", 30
        )
        for _ in range(3):
            r = meshctl_as(root, "call", "tool.who.echo", '{"x": 1}', nobody=False, state=state)
            assert r.returncode == 0, r.stderr
        (root / "probe.stop").touch()
        seen = await spying
        print("nobody, as caller carol:", json.dumps(seen, indent=1))
        for bucket in ("mesh-membership", "mesh-seat-leases", "mesh-seat-homes"):
            assert seen["write_" + bucket][0] != "ok", seen["write_" + bucket]
        assert seen["create_bucket"][0] != "ok"
        assert seen["node_status"][0] == "NoRespondersError"
        assert seen["spied"][1] == [], seen["spied"]  # carol's own account: none of the mesh's calls
        ops = await nats.connect(url, user=info["user"], password=(state / "bus-mesh.password").read_text().strip())
        try:
            kv = await ops.jetstream().key_value("mesh-membership")
            with pytest.raises(nats.js.errors.KeyNotFoundError):
                await kv.get(f"node.{node.name}")  # nothing was written in the operator's bucket either
        except nats.js.errors.BucketNotFoundError:
            pass  # never made: nothing delivered, and carol could not make it
        finally:
            await ops.close()

        # Removed: the caller file no longer opens the bus.
        r = meshctl_as(root, "caller", "remove", "carol", nobody=False, state=state)
        assert r.returncode == 0, r.stderr
        r = meshctl_as(root, "call", "tool.who.meta", "--caller-file", str(handed), nobody=True, state=state)
        assert r.returncode == 2 and "authoriz" in r.stderr.lower(), r.stderr
        assert "bus caller carol/carol removed" in node.log()
    finally:
        node.kill()


async def test_a_caller_is_never_the_operator_even_named_so(world_readable_dir: Path) -> None:
    """The names of the embedded bus's own users are refused to `caller add`; the node's own user
    list stays as it was."""
    root = world_readable_dir
    make_module(root / "mods", "who")
    node = NodeProcess(root, root / "mods", None, "names", config=FAST_CONFIG)
    try:
        node.wait_log("serving on")
        state = node.state_dir
        for args, words in (
            (["mesh-local"], "mesh's own"),
            (["x", "--account", "LOCAL"], "mesh's own"),
            (["x", "--account", "mesh"], "mesh's own"),
            (["bad name"], "not a name"),
        ):
            r = meshctl_as(root, "caller", "add", *args, "--out", str(root / "x.json"), nobody=False, state=state)
            assert r.returncode == 1 and words in r.stderr, (args, r.stderr)
            assert not (root / "x.json").exists()
        r = meshctl_as(root, "caller", "remove", "mesh-mcp", nobody=False, state=state)
        assert r.returncode == 1 and "embedded bus itself" in r.stderr, r.stderr
        nc = await nats.connect(
            json.loads((state / "bus.json").read_text())["url"],
            user="mesh-node",
            password=(state / "bus-mesh.password").read_text().strip(),
        )
        try:
            await wait_state(nc, node.name, "who/tools", "ready")
            status = json.loads((await nc.request(f"mesh.node.{node.name}.status", b"", timeout=5)).data)
            assert status["identity"].startswith("server-stamped"), status["identity"]
        finally:
            await nc.close()
        await wait_for(lambda: "caller identity: server-stamped" in node.log(), "the node said whose word callers are")
    finally:
        node.kill()
