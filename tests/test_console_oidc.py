"""The console's OpenID Connect login in a real browser (Debian's Chromium, Playwright) against a real
authorization server run in the test (tests/support/oauth_server.py, the MCP face's auth tests' kind)
and a real node on its embedded bus: the authorization code flow with PKCE, the person the token's
subject (and so the memory's author and the node's restart check), a refused CSRF token, a forged
callback, and an expired session."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, Iterator

import pytest

from runtime.bus.embedded import free_port
from runtime.wire.identity import Person
from tests.support.console_stack import ConsoleProcess, Stack, chromium
from tests.support.oauth_server import RunningAuthServer, oauth_server

pytestmark = pytest.mark.slow


class Issuer:
    """The authorization server, with the console registered as a public client at two ports."""

    def __init__(self, auth: RunningAuthServer, ports: list[int]) -> None:
        self.auth, self.url, self.ports = auth, auth.url, ports

    def person_id(self, sub: str) -> str:
        return Person(iss=self.url, sub=sub).id


@pytest.fixture(scope="module")
def issuer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Issuer]:
    ports = [free_port(), free_port()]
    clients = {"console": {"redirect_uris": [f"http://127.0.0.1:{p}/auth/callback" for p in ports], "public": True}}
    with oauth_server(tmp_path_factory.mktemp("oauth"), clients=clients) as auth:
        yield Issuer(auth, ports)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, issuer: Issuer) -> Iterator[Stack]:
    stack = Stack(tmp_path_factory.mktemp("console-oidc"), operators=[issuer.person_id("bob")])
    try:
        asyncio.run(stack.ready())
        yield stack
    finally:
        stack.stop()


def start(stack: Stack, issuer: Issuer, port: int, *more: str) -> ConsoleProcess:
    args = ("--auth-issuer", issuer.url, "--auth-client-id", "console", *more)
    return ConsoleProcess(stack, *args, port=port)


async def sign_in(page: Any, console: ConsoleProcess, user: str, password: str) -> None:
    await page.goto(console.base_url + "/memory")
    assert page.url.startswith(console.login_issuer + "/authorize?"), page.url  # sent to the issuer
    assert "code_challenge_method=S256" in page.url and "nonce=" in page.url and "state=" in page.url
    await page.fill('input[name="username"]', user)
    await page.fill('input[name="password"]', password)
    await page.click('button[type="submit"]')
    await page.wait_for_url(console.base_url + "/memory")  # back where the person was going


async def test_a_person_logs_in_through_the_issuer_and_is_the_tokens_subject(stack: Stack, issuer: Issuer) -> None:
    console = start(stack, issuer, issuer.ports[0])
    try:
        async with chromium() as browser:
            page = await browser.new_page()
            await sign_in(page, console, "alice", "alice-pw")
            assert await page.locator("#person").inner_text() == "Alice Liddell"
            cookie = next(c for c in await page.context.cookies() if c["name"] == "mesh_console")
            assert cookie["httpOnly"] and cookie["sameSite"] == "Lax"
            await page.fill('textarea[name="content"]', "Releases go out on Tuesdays.")
            await page.click("form.remember button")
            row = page.locator("table.entries tr", has_text="Releases go out on Tuesdays.")
            assert await row.locator("td.author").inner_text() == issuer.person_id("alice")
            assert await row.locator("td.source").inner_text() == "console"
            # A form with another token does nothing.
            r = await page.request.post(
                console.base_url + "/memory", form={"csrf": "not-hers", "content": "forged", "type": "status"}
            )
            assert r.status == 403 and "CSRF token is not your session" in await r.text()
            # Alice is no operator of the node: the node refuses her restart, the page says why.
            await page.goto(console.base_url + "/")
            await page.locator('tr[data-bundle="hello-python/tools"] button.restart').click()
            flash = await page.locator("#flash").inner_text()
            assert "not restarted" in flash and f"({issuer.person_id('alice')}) is not an operator" in flash, flash
            # Bob is (the node's [console] operators lists him).
            bob = await browser.new_page()
            await sign_in(bob, console, "bob", "bob-pw")
            await bob.goto(console.base_url + "/")
            await bob.locator('tr[data-bundle="hello-python/tools"] button.restart').click()
            flash = await bob.locator("#flash").inner_text()
            assert flash.startswith("hello-python/tools on console-node is restarting"), flash
            # A callback with a state the console never made is refused, and logs nobody in.
            fresh = await browser.new_page()
            await fresh.goto(console.base_url + "/auth/callback?code=x&state=forged")
            assert "state is unknown" in await fresh.locator("#why").inner_text()
            assert not [c for c in await fresh.context.cookies() if c["name"] == "mesh_console"]
            # A wrong password never reaches the console.
            await fresh.goto(console.base_url + "/")
            await fresh.fill('input[name="username"]', "alice")
            await fresh.fill('input[name="password"]', "wrong")
            await fresh.click('button[type="submit"]')
            assert fresh.url.startswith(issuer.url)
    finally:
        console.stop()


async def test_an_expired_session_logs_in_again_and_its_forms_do_nothing(stack: Stack, issuer: Issuer) -> None:
    console = start(stack, issuer, issuer.ports[1], "--session-s", "3")
    try:
        async with chromium() as browser:
            page = await browser.new_page()
            await sign_in(page, console, "alice", "alice-pw")
            await page.fill('textarea[name="content"]', "Written after the session ended.")
            await asyncio.sleep(3.5)
            await page.click("form.remember button")
            assert "Your session has ended" in await page.locator("#why").inner_text()
            await page.goto(console.base_url + "/memory")
            assert page.url.startswith(issuer.url + "/authorize?"), page.url  # a page asks for the login again
        nc = await stack.connect("mesh-local")
        try:
            msg = await nc.request(
                "mesh.seat.memory.recall", json.dumps({"query": "session ended"}).encode(), timeout=10
            )
            assert json.loads(msg.data)["structuredContent"]["entries"] == []
        finally:
            await nc.close()
    finally:
        console.stop()


def test_the_issuer_must_be_https_or_loopback(stack: Stack, tmp_path: Path) -> None:
    import os
    import subprocess

    from tests.support.mesh import MESHCTL, ROOT

    env = dict(os.environ, MESH_STATE_DIR=str(stack.node.state_dir))
    argv = [
        *MESHCTL,
        "console",
        "--http",
        "127.0.0.1:0",
        "--auth-issuer",
        "http://idp.example",
        "--auth-client-id",
        "c",
    ]
    r = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "give the issuer's https:// URL" in r.stderr, r.stderr
