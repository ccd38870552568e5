"""`meshctl mcp --http --auth-issuer` as an OAuth 2.1 protected resource, all real processes: a
nats-server with accounts, a node serving `who` (its tool answers the caller it saw), the test
authorization server (tests/support/oauth_server.py) and the face, logged in as a delegate
(`faces/face`, listed in the node's `[identity] mcp_faces`). The person in each token goes with its
calls, the hot path's and the package's; a session is its opener's; what the face must refuse, it
refuses, saying why."""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import subprocess
import time
import urllib.parse
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import httpx2
import jwt
import nats
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from runtime.bus.embedded import free_port
from tests.faults.security_support import ConfiguredServer, accounts_mesh
from tests.support.mesh import MESHCTL, ROOT, stop_process, wait_port, wait_state
from tests.support.oauth_server import DEFAULT_CONFIG, RunningAuthServer, oauth_server

pytestmark = pytest.mark.slow

CALLERS = [("faces", "face", "face-pw")]
REDIRECT = "http://127.0.0.1/callback"
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}},
}


class Rig:
    def __init__(self, auth: RunningAuthServer, endpoint: str, log: Path) -> None:
        self.auth, self.endpoint, self.log = auth, endpoint, log

    def person(self, sub: str) -> dict[str, str]:
        return {"iss": self.auth.url, "sub": sub, "name": sub}

    def code_flow(self, user: str, client: str = "desktop") -> str:
        """A person's access token for the face, the way a desktop client gets it (code + PKCE)."""
        verifier = secrets.token_urlsafe(48)
        challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
        query = {"response_type": "code", "client_id": client, "redirect_uri": REDIRECT, "scope": "mesh"}
        query.update(code_challenge=challenge, code_challenge_method="S256", resource=self.endpoint)
        code, _ = self.auth.login(self.auth.url + "/authorize?" + urllib.parse.urlencode(query), user, f"{user}-pw")
        form = {"grant_type": "authorization_code", "code": code, "redirect_uri": REDIRECT, "client_id": client}
        return str(self.auth.token(**form, code_verifier=verifier)["access_token"])


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    root = tmp_path_factory.mktemp("face-auth")
    server, node = accounts_mesh(root, CALLERS, 'local = "ops/admin"\nmcp_faces = ["faces/face"]\n', "faceauth")
    try:
        _wait_ready(server)
        more = {name: {"password": f"{name}-pw", "name": name.title()} for name in ("carol", "dave")}
        with oauth_server(root, users={**DEFAULT_CONFIG["users"], **more}) as auth:
            secret = root / "introspection-secret"
            secret.write_text("service-secret\n")
            config = root / "face.toml"
            config.write_text(
                f'[auth]\nintrospection_client_id = "service"\nintrospection_secret_file = "{secret}"\n'
                "[http]\nsessions_per_person = 4\nheader_timeout_s = 2\nbody_timeout_s = 2\n"
            )
            with face_process(
                server, root / "face.log", "--auth-issuer", auth.url, "--auth-scope", "mesh", "--config", str(config)
            ) as endpoint:
                yield Rig(auth, endpoint, root / "face.log")
    finally:
        node.kill()
        server.stop()


def _wait_ready(server: ConfiguredServer) -> None:
    import anyio

    async def wait() -> None:
        ops = await nats.connect(server.url, user="mesh-node", password="mesh-pw")
        try:
            await wait_state(ops, "faceauth", "who/tools", "ready")
        finally:
            await ops.close()

    anyio.run(wait)


@contextmanager
def face_process(server: ConfiguredServer, log: Path, *extra: str, port: int | None = None) -> Iterator[str]:
    port = port or free_port()
    argv = [*MESHCTL, "mcp", "--nats", server.url, "--user", "face", "--password", "face-pw", "--delegate"]
    argv += ["--only", "who_meta", "--http", f"127.0.0.1:{port}", "--log-level", "info", *extra]
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=out)
    try:
        wait_port(port, timeout=30)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        stop_process(proc)


async def _session(http: httpx2.AsyncClient, endpoint: str, token: str) -> str:
    answer = await http.post(endpoint, json=INIT, headers={**HEADERS, "Authorization": f"Bearer {token}"})
    assert answer.status_code == 200, answer.text
    session = answer.headers["mcp-session-id"]
    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    headers = {**HEADERS, "Authorization": f"Bearer {token}", "Mcp-Session-Id": session}
    assert (await http.post(endpoint, json=note, headers=headers)).status_code == 202
    return session


def _result(answer: httpx2.Response) -> dict[str, Any]:
    """The JSON-RPC result of a POST answered as JSON or as an SSE stream."""
    if answer.headers.get("content-type", "").startswith("text/event-stream"):
        for line in answer.text.splitlines():
            if line.startswith("data: ") and '"result"' in line:
                found: dict[str, Any] = json.loads(line[6:])["result"]
                return found
        raise AssertionError(f"no result in the stream: {answer.text[:500]}")
    body = answer.json()
    assert "result" in body, body
    result: dict[str, Any] = body["result"]
    return result


async def _caller(
    http: httpx2.AsyncClient, endpoint: str, token: str, session: str, *, progress: bool = False
) -> dict[str, Any]:
    """who_meta through the face on `session`: the hot path's way, or with a progress token the package's."""
    params: dict[str, Any] = {"name": "who_meta", "arguments": {}}
    if progress:
        params["_meta"] = {"progressToken": "p-1"}
    call = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params}
    headers = {**HEADERS, "Authorization": f"Bearer {token}", "Mcp-Session-Id": session}
    answer = await http.post(endpoint, json=call, headers=headers)
    assert answer.status_code == 200, answer.text
    result = _result(answer)
    assert not result.get("isError"), result
    caller: dict[str, Any] = result["structuredContent"]["_meta"]["mesh/caller"]
    return caller


async def test_protected_resource_metadata_and_the_401s(rig: Rig) -> None:
    origin = rig.endpoint.rsplit("/", 1)[0]
    async with httpx2.AsyncClient() as http:
        prm = (await http.get(origin + "/.well-known/oauth-protected-resource/mcp")).json()
        assert prm == {
            "resource": rig.endpoint,
            "bearer_methods_supported": ["header"],
            "resource_name": "mesh (meshctl mcp)",
            "authorization_servers": [rig.auth.url],
            "scopes_supported": ["mesh"],
        }
        bare = await http.post(rig.endpoint, json=INIT, headers=HEADERS)
        assert bare.status_code == 401
        challenge = bare.headers["www-authenticate"]
        assert challenge.startswith("Bearer ") and "error=" not in challenge  # RFC 6750 §3.1: no token, no error
        assert f'resource_metadata="{origin}/.well-known/oauth-protected-resource/mcp"' in challenge
        assert 'scope="mesh"' in challenge

        now = int(time.time())
        good = {"sub": "alice", "aud": rig.endpoint, "scope": "mesh"}
        kid = jwt.get_unverified_header(rig.auth.mint(**good))["kid"]
        forged_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        forged = jwt.encode(
            {**good, "iss": rig.auth.url, "exp": now + 300}, forged_key, algorithm="RS256", headers={"kid": kid}
        )
        cases = {
            "signature does not verify": forged,
            "not for this resource": rig.auth.mint(**{**good, "aud": "http://127.0.0.1:1/other"}),
            "has expired": rig.auth.mint(**good, exp=now - 120, nbf=None, iat=now - 600),
            "not issued by": rig.auth.mint(**good, iss="http://127.0.0.1:1"),
            "not valid yet": rig.auth.mint(**good, nbf=now + 600),
            "unknown, made-up": "made-up-opaque-token",
            "HS256": jwt.encode({**good, "iss": rig.auth.url, "exp": now + 60}, "k" * 32, algorithm="HS256"),
        }
        for why, token in cases.items():
            answer = await http.post(rig.endpoint, json=INIT, headers={**HEADERS, "Authorization": f"Bearer {token}"})
            assert answer.status_code == 401, (why, answer.text)
            challenge = answer.headers["www-authenticate"]
            assert 'error="invalid_token"' in challenge and "resource_metadata=" in challenge, challenge
            if why != "unknown, made-up":
                assert why in answer.json()["error_description"], (why, answer.json())
        no_scope = rig.auth.mint(**{**good, "scope": "profile"})
        answer = await http.post(rig.endpoint, json=INIT, headers={**HEADERS, "Authorization": f"Bearer {no_scope}"})
        assert answer.status_code == 403 and 'error="insufficient_scope"' in answer.headers["www-authenticate"]
        assert answer.json()["error_description"] == "the token lacks the scope mesh"


async def test_each_person_is_behind_their_own_calls_both_ways(rig: Rig) -> None:
    alice, bob = rig.code_flow("alice"), rig.code_flow("bob")
    async with httpx2.AsyncClient() as http:
        sessions = {"alice": await _session(http, rig.endpoint, alice), "bob": await _session(http, rig.endpoint, bob)}
        for name, token in (("alice", alice), ("bob", bob)):
            for progress in (False, True):
                seen = await _caller(http, rig.endpoint, token, sessions[name], progress=progress)
                assert seen == {
                    "account": "faces",
                    "user": "face",
                    "name": "meshctl-mcp",
                    "via": "mcp",
                    "person": rig.person(name),
                }, (name, progress, seen)
        # A session is its opener's: bob's token on alice's session is answered as if it did not exist,
        # on the hot path's requests as on the package's.
        for progress in (False, True):
            params: dict[str, Any] = {"name": "who_meta", "arguments": {}}
            if progress:
                params["_meta"] = {"progressToken": 1}
            call = {"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": params}
            headers = {**HEADERS, "Authorization": f"Bearer {bob}", "Mcp-Session-Id": sessions["alice"]}
            answer = await http.post(rig.endpoint, json=call, headers=headers)
            assert answer.status_code == 404, answer.text
        # alice's session still works for alice, with a new token of hers (a refresh).
        again = rig.code_flow("alice")
        assert (await _caller(http, rig.endpoint, again, sessions["alice"]))["person"] == rig.person("alice")


async def test_opaque_tokens_are_introspected_once_then_cached(rig: Rig) -> None:
    token = rig.code_flow("bob", client="opaque-desktop")
    assert token.count(".") != 2
    before = rig.auth.state()["counts"].get("introspections", 0)
    async with httpx2.AsyncClient() as http:
        session = await _session(http, rig.endpoint, token)
        for _ in range(5):
            assert (await _caller(http, rig.endpoint, token, session))["person"] == rig.person("bob")
    # initialize, initialized and five calls: one introspection (the token cache).
    assert rig.auth.state()["counts"]["introspections"] - before == 1


async def test_a_rotated_signing_key_is_fetched_on_its_first_token(rig: Rig) -> None:
    async with httpx2.AsyncClient() as http:
        await _session(http, rig.endpoint, rig.code_flow("alice"))  # the face knows the current keys
        new_kid = rig.auth.rotate(drop_old=True)
        time.sleep(1.1)  # the face fetches the JWKS at most once a second
        token = rig.code_flow("alice")
        assert jwt.get_unverified_header(token)["kid"] == new_kid
        session = await _session(http, rig.endpoint, token)
        assert (await _caller(http, rig.endpoint, token, session))["person"] == rig.person("alice")


async def test_sessions_per_person_are_capped_and_hosts_are_exact(rig: Rig) -> None:
    token = rig.code_flow("carol")  # carol opens sessions only here
    async with httpx2.AsyncClient() as http:
        opened = [await _session(http, rig.endpoint, token) for _ in range(4)]
        over = await http.post(rig.endpoint, json=INIT, headers={**HEADERS, "Authorization": f"Bearer {token}"})
        assert over.status_code == 429 and "sessions_per_person = 4" in over.json()["error"]["message"]
        # dave is not held back by carol's sessions.
        await _session(http, rig.endpoint, rig.code_flow("dave"))
        # carol ends one: she may open another.
        ended = await http.delete(
            rig.endpoint, headers={**HEADERS, "Authorization": f"Bearer {token}", "Mcp-Session-Id": opened[0]}
        )
        assert ended.status_code in (200, 204)
        await _session(http, rig.endpoint, token)
        port = rig.endpoint.split(":")[2].split("/")[0]
        for host in (f"127.0.0.1:{port}.evil.example", "evil.example", f"127.0.0.1:{int(port) + 1}"):
            answer = await http.post(
                rig.endpoint, json=INIT, headers={**HEADERS, "Authorization": f"Bearer {token}", "Host": host}
            )
            assert answer.status_code == 421, (host, answer.status_code)


class _Memory:
    """The MCP SDK's TokenStorage, in memory (a desktop client keeps it on disk)."""

    def __init__(self) -> None:
        self.tokens: Any = None
        self.client: Any = None

    async def get_tokens(self) -> Any:
        return self.tokens

    async def set_tokens(self, tokens: Any) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> Any:
        return self.client

    async def set_client_info(self, client_info: Any) -> None:
        self.client = client_info


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_the_mcp_sdks_oauth_client_lists_and_calls_through_the_face(rig: Rig, mode: str) -> None:
    """The flow a desktop client runs: a 401, the face's metadata, the issuer's, dynamic registration,
    the browser's sign-in (here the test signs in as alice on the server's form), code + PKCE, then
    tools/list and tools/call with the token."""
    import anyio
    from mcp import Client
    from mcp.client.auth import AuthorizationCodeResult, OAuthClientProvider
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared.auth import OAuthClientMetadata

    signed_in: dict[str, Any] = {}

    async def open_browser(url: str) -> None:
        signed_in["code"], signed_in["state"] = await anyio.to_thread.run_sync(rig.auth.login, url, "alice", "alice-pw")

    async def redirected() -> AuthorizationCodeResult:
        return AuthorizationCodeResult(code=signed_in["code"], state=signed_in["state"])

    before = rig.auth.state()["counts"].get("registrations", 0)
    metadata = OAuthClientMetadata.model_validate(
        {"redirect_uris": [REDIRECT], "client_name": "a desktop client", "token_endpoint_auth_method": "none"}
    )
    provider = OAuthClientProvider(rig.endpoint, metadata, _Memory(), open_browser, redirected)
    async with httpx2.AsyncClient(auth=provider, timeout=30) as http:
        async with Client(streamable_http_client(rig.endpoint, http_client=http), mode=mode, cache=None) as c:
            assert [t.name for t in (await c.list_tools()).tools] == ["who_meta"]

            async def on_progress(progress: float, total: float | None, message: str | None) -> None:
                pass

            seen = []
            for progress in (None, on_progress):  # the hot path's way, then (asking for progress) the package's
                result = await c.call_tool("who_meta", {}, progress_callback=progress)
                assert not result.is_error, result
                assert isinstance(result.structured_content, dict)
                seen.append(result.structured_content["_meta"])
    for meta in seen:
        assert meta["mesh/caller"]["via"] == "mcp" and meta["mesh/caller"]["person"] == rig.person("alice"), meta
    assert rig.auth.state()["counts"]["registrations"] == before + 1  # it registered itself (RFC 7591)


def test_slow_clients_are_cut_off_and_others_still_served(rig: Rig) -> None:
    """20 connections that send half their headers, and one that sends half its body, each want to be
    held 40 s; the face ([http] header_timeout_s = body_timeout_s = 2 here) answers them 408 and
    closes them, and serves a whole request meanwhile."""
    import socket

    port = int(rig.endpoint.split(":")[2].split("/")[0])
    started = time.monotonic()
    slow = []
    for _ in range(20):
        s = socket.create_connection(("127.0.0.1", port), timeout=40)
        s.sendall(f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: applic".encode())
        slow.append(s)
    body = json.dumps(INIT).encode()
    half = socket.create_connection(("127.0.0.1", port), timeout=40)
    head = f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
    head += f"Accept: application/json, text/event-stream\r\nAuthorization: Bearer {rig.code_flow('bob')}\r\n"
    half.sendall((head + f"Content-Length: {len(body)}\r\n\r\n").encode() + body[:10])
    slow.append(half)
    # Meanwhile a whole request is served.
    answer = httpx2.get(rig.endpoint.rsplit("/", 1)[0] + "/.well-known/oauth-protected-resource/mcp")
    assert answer.status_code == 200
    for s in slow:
        with s:
            got = b""
            while chunk := s.recv(4096):
                got += chunk
            assert got.startswith(b"HTTP/1.1 408 "), got[:200]
    held = time.monotonic() - started
    print(f"\n21 slow connections answered 408 and closed after {held:.1f} s (each wanted 40 s)")
    assert held < 20, held
    assert "a client sent a request too slowly" in rig.log.read_text()
