"""Security: every way of authenticating to the bus, TLS, bus permissions, secrets kept from
children, and children run as another user. Real nats-server configured by a file, real nodes,
real children, real `meshctl`.
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client

from launcher.env import ALLOWLIST
from launcher.reaper import MARKER_VAR
from runtime.wire.callproto import CALL_ID
from runtime.wire.subjects import cancel_subject
from tests.support.mesh import NodeProcess, bundle_status, call, make_module, wait_for, wait_state

from .security_support import (
    ConfiguredServer,
    accounts_mesh,
    make_tls,
    meshctl,
    new_nkey,
    node_config,
    operator_chain,
    proc_status,
)


class Stack:
    """Servers and nodes started by one test, all ended after it."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.servers: list[ConfiguredServer] = []
        self.nodes: list[NodeProcess] = []
        self.clients: list[Client] = []

    def server(self, body: str, *, scheme: str = "nats") -> ConfiguredServer:
        server = ConfiguredServer(self.tmp_path / f"server{len(self.servers)}", body, scheme=scheme)
        self.servers.append(server)
        return server.start()

    def node(
        self,
        manifests: Path,
        config: str,
        *,
        env: dict[str, str] | None = None,
        workdir: Path | None = None,
        wait: bool = True,
    ) -> NodeProcess:
        # The URL comes from the config file alone: that is the path under test.
        node = NodeProcess(workdir or self.tmp_path, manifests, None, f"sec{len(self.nodes)}", config=config, env=env)
        self.nodes.append(node)
        if wait:
            node.wait_log("serving on", timeout=20)
        return node

    async def client(self, url: str, **auth: Any) -> tuple[Client, list[Exception]]:
        """A test client that keeps the errors the server sent it (permission violations)."""
        seen: list[Exception] = []

        async def on_error(e: Exception) -> None:
            seen.append(e)

        nc = await nats.connect(
            url, max_reconnect_attempts=2, reconnect_time_wait=0.2, connect_timeout=5, error_cb=on_error, **auth
        )
        self.clients.append(nc)
        return nc, seen

    async def close(self) -> None:
        for nc in self.clients:
            if not nc.is_closed:
                await nc.close()
        for node in self.nodes:
            node.kill()
        for server in self.servers:
            server.stop()


@pytest.fixture
async def stack(tmp_path: Path) -> Any:
    s = Stack(tmp_path)
    try:
        yield s
    finally:
        await s.close()


def assert_refused(result: Any, *words: str) -> None:
    """meshctl gave up at once with exit 2 and one clear line naming why: no traceback, no hang."""
    assert result.returncode == 2, f"exit {result.returncode}; stdout {result.stdout!r}; stderr {result.stderr!r}"
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stderr.startswith("meshctl: "), result.stderr
    for word in words:
        assert word in result.stderr.lower(), f"{word!r} not in {result.stderr!r}"


def assert_echo(result: Any, marker: str) -> None:
    assert result.returncode == 0, f"exit {result.returncode}; stderr {result.stderr!r}"
    assert marker in result.stdout, result.stdout


async def served_echo(nc: Client, node: NodeProcess) -> None:
    await wait_state(nc, node.name, "alpha/tools", "ready")
    code, result = await call(nc, "mesh.tool.alpha.echo", {"over": "auth"})
    assert code == 200 and result["structuredContent"] == {"over": "auth"}


def wait_log_any(node: NodeProcess, words: tuple[str, ...], timeout: float = 20) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        log = node.log()
        if any(w in log.lower() for w in words) or node.proc.poll() is not None:
            return log
        time.sleep(0.1)
    return node.log()


# --- 1. user and password ----------------------------------------------------------------------
async def test_user_password(tmp_path: Path, stack: Stack) -> None:
    srv = stack.server("authorization { user: node, password: s3cret }")
    make_module(tmp_path / "mods", "alpha")
    node = stack.node(tmp_path / "mods", node_config({"url": srv.url, "user": "node", "password": "s3cret"}))
    nc, _ = await stack.client(srv.url, user="node", password="s3cret")
    await served_echo(nc, node)

    base = ("call", "tool.alpha.echo", '{"who": "meshctl"}', "--nats", srv.url, "--timeout", "5")
    assert_echo(meshctl(*base, "--user", "node", "--password", "s3cret"), '"who": "meshctl"')
    assert_echo(meshctl(*base, "--user", "node", env={"MESH_NATS_PASSWORD": "s3cret"}), '"who": "meshctl"')
    status = meshctl("node", "status", "--nats", srv.url, "--name", node.name, "--user", "node", "--password", "s3cret")
    assert status.returncode == 0 and "alpha/tools" in status.stdout, status.stderr
    # Without credentials, or with wrong ones: refused at once, naming authorization.
    assert_refused(meshctl(*base), "authoriz")
    assert_refused(meshctl(*base, "--user", "node", "--password", "wrong"), "authoriz")


async def test_node_with_wrong_password_names_the_refusal(tmp_path: Path, stack: Stack) -> None:
    srv = stack.server("authorization { user: node, password: s3cret }")
    make_module(tmp_path / "mods", "alpha")
    node = stack.node(tmp_path / "mods", node_config({"url": srv.url, "user": "node", "password": "wrong"}), wait=False)
    log = wait_log_any(node, ("authoriz",))
    assert "authoriz" in log.lower(), log
    assert "serving on" not in log
    assert "Traceback" not in log, log


# --- 2. token ------------------------------------------------------------------------------------
async def test_token(tmp_path: Path, stack: Stack) -> None:
    srv = stack.server('authorization { token: "t0ken-for-the-mesh" }')
    make_module(tmp_path / "mods", "alpha")
    node = stack.node(tmp_path / "mods", node_config({"url": srv.url, "token": "t0ken-for-the-mesh"}))
    nc, _ = await stack.client(srv.url, token="t0ken-for-the-mesh")
    await served_echo(nc, node)

    base = ("call", "tool.alpha.echo", '{"who": "token"}', "--nats", srv.url, "--timeout", "5")
    assert_echo(meshctl(*base, "--token", "t0ken-for-the-mesh"), '"who": "token"')
    assert_echo(meshctl(*base, env={"MESH_NATS_TOKEN": "t0ken-for-the-mesh"}), '"who": "token"')
    assert_refused(meshctl(*base), "authoriz")
    assert_refused(meshctl(*base, "--token", "not-the-token"), "authoriz")


# --- 3. nkey -------------------------------------------------------------------------------------
async def test_nkey(tmp_path: Path, stack: Stack) -> None:
    import nkeys

    seed, public = new_nkey(nkeys.PREFIX_BYTE_USER)
    other_seed, _ = new_nkey(nkeys.PREFIX_BYTE_USER)
    seed_file, other_file = tmp_path / "node.nk", tmp_path / "other.nk"
    seed_file.write_text(seed + "\n")
    other_file.write_text(other_seed + "\n")
    seed_file.chmod(0o600)
    srv = stack.server(f"authorization {{ users = [ {{ nkey: {public} }} ] }}")
    make_module(tmp_path / "mods", "alpha")
    node = stack.node(tmp_path / "mods", node_config({"url": srv.url, "nkey_seed": str(seed_file)}))
    nc, _ = await stack.client(srv.url, nkeys_seed=str(seed_file))
    await served_echo(nc, node)

    base = ("call", "tool.alpha.echo", '{"who": "nkey"}', "--nats", srv.url, "--timeout", "5")
    assert_echo(meshctl(*base, "--nkey", str(seed_file)), '"who": "nkey"')
    assert_refused(meshctl(*base), "authoriz")
    assert_refused(meshctl(*base, "--nkey", str(other_file)), "authoriz")


# --- 4. creds file (decentralized JWT auth) ------------------------------------------------------
async def test_creds_file(tmp_path: Path, stack: Stack) -> None:
    chain = operator_chain(tmp_path / "jwt")
    stranger = operator_chain(tmp_path / "jwt-other")  # a user of an operator this server does not trust
    srv = stack.server(chain.server_config)
    make_module(tmp_path / "mods", "alpha")
    node = stack.node(tmp_path / "mods", node_config({"url": srv.url, "creds": str(chain.creds)}))
    nc, _ = await stack.client(srv.url, user_credentials=str(chain.creds))
    await served_echo(nc, node)

    base = ("call", "tool.alpha.echo", '{"who": "creds"}', "--nats", srv.url, "--timeout", "5")
    assert_echo(meshctl(*base, "--creds", str(chain.creds)), '"who": "creds"')
    assert_refused(meshctl(*base), "authoriz")
    assert_refused(meshctl(*base, "--creds", str(stranger.creds)), "authoriz")


# --- 5. TLS with client certificates -------------------------------------------------------------
async def test_tls_with_client_certificates(tmp_path: Path, stack: Stack) -> None:
    tls = make_tls(tmp_path / "tls")
    srv = stack.server(
        f'tls {{ cert_file: "{tls.server_cert}", key_file: "{tls.server_key}", ca_file: "{tls.ca}", verify: true, timeout: 2 }}',
        scheme="tls",
    )
    make_module(tmp_path / "mods", "alpha")
    node = stack.node(
        tmp_path / "mods",
        node_config(
            {"url": srv.url, "tls_ca": str(tls.ca), "tls_cert": str(tls.client_cert), "tls_key": str(tls.client_key)}
        ),
    )
    ctx = ssl.create_default_context(cafile=str(tls.ca))
    ctx.load_cert_chain(str(tls.client_cert), str(tls.client_key))
    nc, _ = await stack.client(srv.url, tls=ctx)
    await served_echo(nc, node)

    base = ("call", "tool.alpha.echo", '{"who": "tls"}', "--nats", srv.url, "--timeout", "5")
    client_cert = ("--tls-cert", str(tls.client_cert), "--tls-key", str(tls.client_key))
    assert_echo(meshctl(*base, "--tls-ca", str(tls.ca), *client_cert), '"who": "tls"')
    # The server's certificate is not trusted without the CA: named, not retried for ever.
    assert_refused(meshctl(*base, *client_cert), "certificate")
    # The server wants a client certificate.
    assert_refused(meshctl(*base, "--tls-ca", str(tls.ca)), "cannot connect")


# --- 6. bus permissions --------------------------------------------------------------------------
# What a node needs: its subjects, the Service API, replies to inboxes, JetStream (membership KV,
# object store, ordered consumers' flow control), and the server's word on its own account and
# permissions at start ($SYS.REQ.USER.INFO, runtime/bus/trust.py).
NODE_PERMISSIONS = (
    'publish: ["mesh.>", "$SRV.>", "_INBOX.>", "$JS.>", "$KV.>", "$O.>", "$SYS.REQ.USER.INFO"], '
    'subscribe: ["mesh.>", "$SRV.>", "_INBOX.>", "$KV.>", "$O.>"]'
)


async def test_permissions_keep_a_caller_to_its_subjects(tmp_path: Path, stack: Stack) -> None:
    srv = stack.server(
        "authorization { users = [\n"
        f"  {{ user: node, password: nodepw, permissions: {{ {NODE_PERMISSIONS} }} }}\n"
        '  { user: caller, password: callerpw, permissions: { publish: ["mesh.tool.alpha.echo"], subscribe: ["_INBOX.>"] } }\n'
        "] }"
    )
    make_module(tmp_path / "mods", "alpha")
    node = stack.node(tmp_path / "mods", node_config({"url": srv.url, "user": "node", "password": "nodepw"}))
    admin, _ = await stack.client(srv.url, user="node", password="nodepw")
    await served_echo(admin, node)
    caller, violations = await stack.client(srv.url, user="caller", password="callerpw")

    code, result = await call(caller, "mesh.tool.alpha.echo", {"allowed": True})
    assert code == 200 and result["structuredContent"] == {"allowed": True}
    before = await bundle_status(admin, node.name, "alpha/tools")

    for subject in ("mesh.tool.alpha.env", f"mesh.node.{node.name}.restart"):
        with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
            await caller.request(subject, b"{}", timeout=1.5)
        assert any("permissions violation" in str(e).lower() and subject in str(e) for e in violations), violations

    # Nothing reached the child or the node: same calls, same pid, no restart.
    after = await bundle_status(admin, node.name, "alpha/tools")
    assert (after["calls"], after["pid"], after["restarts"]) == (before["calls"], before["pid"], before["restarts"])
    # The caller's connection is still good for what it may do.
    code, _ = await call(caller, "mesh.tool.alpha.echo", {"still": "allowed"})
    assert code == 200
    # meshctl as the caller: refused subjects are an error, never an answer.
    refused = meshctl(
        "call",
        "tool.alpha.env",
        "{}",
        "--nats",
        srv.url,
        "--user",
        "caller",
        "--password",
        "callerpw",
        "--timeout",
        "2",
    )
    assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr
    # The server logged the caller's violations, and refused the node nothing: its list is enough.
    violations_logged = [line for line in srv.log().splitlines() if "Violation" in line]
    assert any('/user:caller"' in line for line in violations_logged), violations_logged
    assert not [line for line in violations_logged if '/user:node"' in line], violations_logged


# --- 7. secrets never reach a child --------------------------------------------------------------
SECRET_CASES = {
    # case: (server authorization, node [nats] table, node environment)
    "password-in-config": (
        "authorization { user: node, password: pw-in-config-7f3 }",
        {"user": "node", "password": "pw-in-config-7f3"},
        {},
    ),
    "password-in-env": (
        "authorization { user: node, password: pw-in-env-91c }",
        {"user": "node"},
        {"MESH_NATS_PASSWORD": "pw-in-env-91c"},
    ),
    "token-in-config": ('authorization { token: "tok-in-config-2b8" }', {"token": "tok-in-config-2b8"}, {}),
    "token-in-env": ('authorization { token: "tok-in-env-c44" }', {}, {"MESH_NATS_TOKEN": "tok-in-env-c44"}),
}


@pytest.mark.parametrize("case", list(SECRET_CASES))
async def test_secrets_never_reach_a_child(tmp_path: Path, stack: Stack, case: str) -> None:
    auth, nats_table, secret_env = SECRET_CASES[case]
    secret = nats_table.get("password") or nats_table.get("token") or next(iter(secret_env.values()))
    srv = stack.server(auth)
    make_module(tmp_path / "mods", "alpha", env={"FROM_MANIFEST": "yes"})
    # A module may ask for variables of the node by name: only those reach it.
    asked = ["MESH_PASSED_ON", *secret_env]
    make_module(tmp_path / "mods", "opted", extra_bundle=f"pass_env = {list(asked)!r}".replace("'", '"'))
    node_env = {"MESH_SECRET_OTHER": "other-secret-5e1", "MESH_PASSED_ON": "visible", **secret_env}
    node = stack.node(tmp_path / "mods", node_config({"url": srv.url, **nats_table}), env=node_env)
    auth_args = {"user": "node", "password": secret} if "password" in case else {"token": secret}
    nc, _ = await stack.client(srv.url, **auth_args)
    await wait_state(nc, node.name, "alpha/tools", "ready")
    await wait_state(nc, node.name, "opted/tools", "ready")

    code, result = await call(nc, "mesh.tool.alpha.env", {})
    assert code == 200
    env: dict[str, str] = result["structuredContent"]
    leaked = {k: v for k, v in env.items() if secret in v or "other-secret-5e1" in v or k.startswith("MESH_NATS_")}
    assert not leaked, f"the child sees the node's secrets: {leaked}"
    expected = set(ALLOWLIST) | {
        "MESH_NODE",
        "MESH_MODULE",
        "MESH_BUNDLE",
        "MESH_BUNDLE_DIR",
        "MESH_DATA_DIR",
        "PYTHONUNBUFFERED",
        "MESH_LOCAL_PERSON",  # the node's OS user as a person id: a name, no secret
        MARKER_VAR,
        "FROM_MANIFEST",
    }
    assert set(env) <= expected, f"unexpected variables in the child: {sorted(set(env) - expected)}"
    assert env["FROM_MANIFEST"] == "yes" and env["MESH_MODULE"] == "alpha"

    code, result = await call(nc, "mesh.tool.opted.env", {})
    assert code == 200
    opted: dict[str, str] = result["structuredContent"]
    assert opted.get("MESH_PASSED_ON") == "visible"
    assert "MESH_SECRET_OTHER" not in opted
    for name, value in secret_env.items():  # named by pass_env: the manifest asked for it explicitly
        assert opted.get(name) == value
    if not secret_env:
        assert not [k for k, v in opted.items() if secret in v]


# --- 8. children as another user ---------------------------------------------------------------
SYSTEM_PYTHON = "/usr/bin/python3"


def runs_as(user: str, argv: list[str]) -> bool:
    try:
        return subprocess.run(argv, user=user, capture_output=True, timeout=20).returncode == 0
    except OSError:
        return False


async def test_children_run_as_another_user(world_readable_dir: Path, stack: Stack) -> None:
    if os.geteuid() != 0:
        pytest.skip(f"running children as another user needs root; these tests run as uid {os.geteuid()}")
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("there is no user `nobody` on this machine")
    if not runs_as("nobody", [SYSTEM_PYTHON, "-c", "pass"]):
        pytest.skip(f"`nobody` cannot run {SYSTEM_PYTHON}: the child needs an interpreter it may run")
    srv = stack.server("authorization { user: node, password: s3cret }")
    mods = world_readable_dir / "mods"
    # The node's own interpreter may sit where only root can enter (pyenv under /root). This
    # bundle ships a launcher that runs raw_child (stdlib only) on the system Python.
    folder = make_module(mods, "alpha")
    manifest = folder / "module.toml"
    manifest.write_text(manifest.read_text().replace('entry = ["python", "raw_child.py"]', 'entry = ["./run.sh"]'))
    (folder / "run.sh").write_text(f"#!/bin/sh\nexec {SYSTEM_PYTHON} raw_child.py\n")
    (folder / "run.sh").chmod(0o755)
    # This one runs on the node's interpreter, as Python bundles do.
    on_node_python = make_module(mods, "beta")
    for path in (mods, folder, on_node_python):
        path.chmod(0o755)
    config = node_config({"url": srv.url, "user": "node", "password": "s3cret"}, top={"child_user": "nobody"})
    node = stack.node(mods, config, workdir=world_readable_dir)
    nc, _ = await stack.client(srv.url, user="node", password="s3cret")
    await wait_state(nc, node.name, "alpha/tools", "ready")

    code, result = await call(nc, "mesh.tool.alpha.pid", {})
    assert code == 200
    st = proc_status(result["structuredContent"]["pid"])
    assert st["Uid"].split() == [str(nobody.pw_uid)] * 4, st["Uid"]
    # Its groups are nobody's, not the node's (root's).
    assert st["Gid"].split() == [str(nobody.pw_gid)] * 4, st["Gid"]
    assert "0" not in st["Groups"].split(), st["Groups"]

    # It writes its data folder, which is its own.
    code, result = await call(nc, "mesh.tool.alpha.remember", {"key": "k", "value": "v"})
    assert code == 200 and result["isError"] is False, result
    assert result["structuredContent"] == {"k": "v"}
    store = node.state_dir / "data" / "alpha" / "store.json"
    assert store.stat().st_uid == nobody.pw_uid
    code, result = await call(nc, "mesh.tool.alpha.remember", {})
    assert result["structuredContent"] == {"k": "v"}

    # A Python bundle runs on the node's interpreter: it serves when `nobody` may run that, and
    # otherwise it is named failed with the reason, while alpha keeps serving.
    if runs_as("nobody", [sys.executable, "-c", "pass"]):
        await wait_state(nc, node.name, "beta/tools", "ready")
    else:
        failed = await wait_state(nc, node.name, "beta/tools", "failed", timeout=20)
        assert "Permission denied" in (failed["last_error"] or ""), failed
        code, body = await call(nc, "mesh.tool.beta.echo", {})
        assert code == 503 and body["error"]["bundle"] == "beta/tools"
    code, _ = await call(nc, "mesh.tool.alpha.echo", {})
    assert code == 200


async def test_call_ids_are_scoped_by_the_callers_account(tmp_path: Path) -> None:
    """Issue 30 item 3: bob's call in flight under id X neither refuses alice's call with the same
    Mesh-Call-Id nor is cancelled by her cancel of X; each cancel reaches its own account's call."""
    server, node = accounts_mesh(tmp_path, [("alice", "alice", "alice-pw"), ("bob", "bob", "bob-pw")], "", "callids")
    try:
        ops = await nats.connect(server.url, user="mesh-node", password="mesh-pw")
        await wait_state(ops, node.name, "who/tools", "ready")
        alice = await nats.connect(server.url, user="alice", password="alice-pw")
        bob = await nats.connect(server.url, user="bob", password="bob-pw")
        call_id = "leaked-id-0123456789abcdef"
        bobs = asyncio.ensure_future(
            bob.request("mesh.tool.who.hold", b'{"seconds": 3}', timeout=10, headers={CALL_ID: call_id})
        )
        await wait_for(lambda: _in_flight(ops, node.name), "bob's call in flight", ok=lambda n: n == 1)

        # Alice's call with the same id is hers: served, not refused 400 "already in flight".
        reply = await alice.request("mesh.tool.who.echo", b'{"mine": 1}', timeout=10, headers={CALL_ID: call_id})
        assert not (reply.headers and "Nats-Service-Error-Code" in reply.headers), (reply.headers, reply.data)
        assert json.loads(reply.data)["structuredContent"] == {"mine": 1}

        # Her cancel of that id does not reach bob's call: it is answered when its hold ends.
        await alice.publish(cancel_subject(call_id), b'{"reason": "alice cancels her own id"}')
        await alice.flush()
        held = await bobs
        assert not (held.headers and "Nats-Service-Error-Code" in held.headers), (held.headers, held.data)
        assert json.loads(held.data)["content"][0]["text"] == "held"

        # Bob's own cancel of the same id does reach his next call.
        again = asyncio.ensure_future(
            bob.request("mesh.tool.who.hold", b'{"seconds": 30}', timeout=10, headers={CALL_ID: call_id})
        )
        await wait_for(lambda: _in_flight(ops, node.name), "bob's second call in flight", ok=lambda n: n == 1)
        await bob.publish(cancel_subject(call_id), b"")
        await bob.flush()
        await wait_for(lambda: _in_flight(ops, node.name), "bob's call cancelled", ok=lambda n: n == 0)
        again.cancel()
        for nc in (ops, alice, bob):
            await nc.close()
    finally:
        node.kill()
        server.stop()


async def _in_flight(nc: Client, node: str) -> int:
    return int((await bundle_status(nc, node, "who/tools"))["in_flight"])
