"""The console in a real browser (Debian's Chromium, driven by Playwright) against a real node on its
embedded bus serving the first-party bundles (memory, handoff, hello-python) and a test bundle, with
`meshctl console` run as a process on its defaults: the embedded bus's console user, local login.

The screenshots in docs/console/ are taken here.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Iterator

import httpx2
import pytest

from runtime.client import MeshClient
from runtime.wire.identity import PERSON, Person, encode_person, os_person
from tests.support.console_stack import DOCS_SHOTS, ConsoleProcess, Stack, chromium, person_id
from tests.support.mesh import MESHCTL, ROOT, bundle_status, status, wait_for

pytestmark = pytest.mark.slow

ME = os_person()
ANNA = Person(iss="https://idp.example", sub="anna", name="Anna")
QUESTION = {"projekt": "web", "frage": "", "versucht": "read the budget sheet", "benoetigt": "yes or no"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    # HANDOFF_HUMANS as on the default set-up (@local): the console's local person is the node's
    # own (MESH_LOCAL_PERSON), so the Attention page's decision is the operator's with no setting.
    stack = Stack(tmp_path_factory.mktemp("console"))
    try:
        asyncio.run(stack.ready())
        # A project scope beside global (the memory's scope admins are @local: the operator's caller).
        asyncio.run(seat(stack, "mesh-local", "memory.create_scope", {"slug": "billing", "name": "Billing platform"}))
        yield stack
    finally:
        stack.stop()


@pytest.fixture(scope="module")
def console(stack: Stack) -> Iterator[ConsoleProcess]:
    console = ConsoleProcess(stack)
    try:
        yield console
    finally:
        console.stop()


async def seat(stack: Stack, user: str, verb: str, args: dict[str, Any], person: Person | None = None) -> Any:
    nc = await stack.connect(user)
    try:
        headers = {PERSON: encode_person(person)} if person else None
        msg = await nc.request(f"mesh.seat.{verb}", json.dumps(args).encode(), timeout=30, headers=headers)
        body = json.loads(msg.data)
        assert not body.get("isError"), body
        return body["structuredContent"]
    finally:
        await nc.close()


async def logged_in(browser: Any, console: ConsoleProcess) -> Any:
    page = await browser.new_page(viewport={"width": 1280, "height": 860})
    await page.goto(console.login)
    assert page.url == console.base_url + "/", page.url
    return page


async def test_the_mesh_page_shows_every_bundle_and_a_killed_one_within_2_s(
    stack: Stack, console: ConsoleProcess
) -> None:
    ops = await stack.connect("mesh-node")
    try:
        async with chromium() as browser:
            page = await logged_in(browser, console)
            for key in ("memory/tools", "handoff/tools", "hello-python/tools", "frail/tools"):
                row = page.locator(f'tr[data-bundle="{key}"]')
                assert await row.locator("td.state").inner_text() == "ready", key
            service = page.locator('tr[data-bundle="hello-service/daemon"]')
            assert await service.locator("td.state").inner_text() == "running"
            assert (await service.locator("td").nth(1).inner_text()).startswith("service")
            seats = await page.locator("table.seats").inner_text()
            assert "memory" in seats and "handoff" in seats and "held" in seats
            # Each seat's store id, and for the replicated memory seat its replica's sync and lag once
            # the holder renewed its lease with them (the page polls its fragment).
            shown = {s["seat"]: s for s in (await status(ops, stack.node.name))["seats"]}
            assert shown["memory"]["store"] and shown["memory"]["store"] in seats
            await page.wait_for_function(
                """() => /synced \\d+ s ago, lag [0-9.]+ s/.test(
                    document.querySelector('tr[data-seat="memory"]').textContent)""",
                timeout=30_000,
            )
            await page.screenshot(path=str(DOCS_SHOTS / "mesh.png"), full_page=True)
            before = await bundle_status(ops, stack.node.name, "frail/tools")
            row = page.locator('tr[data-bundle="frail/tools"]')
            t0 = time.monotonic()
            os.kill(before["pid"], signal.SIGKILL)
            # The page changes by itself (console.js polls the fragment): its restarts or its state.
            await page.wait_for_function(
                """([restarts]) => {
                    const row = document.querySelector('tr[data-bundle="frail/tools"]');
                    return row && (row.querySelector('td.restarts').textContent !== restarts ||
                                   row.querySelector('td.state').textContent !== 'ready');
                }""",
                arg=[str(before["restarts"])],
                timeout=2000,
            )
            took = time.monotonic() - t0
            print(f"\nkilled frail/tools' child: the page changed {took * 1000:.0f} ms later")
            assert took < 2.0
            await wait_for(
                lambda: row.locator("td.restarts").inner_text(),
                "the restart counted",
                ok=lambda t: t != str(before["restarts"]),
            )
    finally:
        await ops.close()


async def test_a_memory_entry_written_through_the_form_is_the_persons_via_console(
    stack: Stack, console: ConsoleProcess
) -> None:
    async with chromium() as browser:
        page = await logged_in(browser, console)
        await page.click("text=Memory")
        await page.fill('textarea[name="content"]', "Invoices are kept for ten years.")
        await page.select_option('select[name="type"]', "constraint")
        await page.select_option('select[name="scope"]', "billing")
        await page.fill('input[name="key"]', "invoices.retention")
        await page.click("form.remember button")
        flash = await page.locator("#flash").inner_text()
        assert flash.startswith("remembered as entry") and person_id() in flash, flash
        row = page.locator("table.entries tr", has_text="Invoices are kept for ten years.")
        assert await row.locator("td.author").inner_text() == person_id()
        assert await row.locator("td.source").inner_text() == "console"
        assert await page.locator("#person").inner_text() == ME.name
        await page.fill('input[name="q"]', "invoice")
        await page.click("form.search button")
        assert await page.locator("table.entries tr", has_text="ten years").count() == 1  # the seat's recall, stemmed
        await page.screenshot(path=str(DOCS_SHOTS / "memory.png"), full_page=True)
    # The memory's own record agrees: the person is the author, the console the source.
    found = await seat(stack, "mesh-local", "memory.recall", {"key": "invoices.retention", "scope": "billing"})
    assert [(e["author"], e["source"]) for e in found["entries"]] == [(person_id(), "console")]


async def test_a_private_entry_of_the_same_person_never_shows(stack: Stack, console: ConsoleProcess) -> None:
    secret = "My private note: the staging password is in the blue folder."
    written = await seat(
        stack, "mesh-console", "memory.remember", {"content": secret, "type": "status", "scope": "private"}, ME
    )
    assert written["author"] == person_id()
    async with chromium() as browser:
        page = await logged_in(browser, console)
        paths = [
            "/",
            "/memory",
            "/memory?scope=global",
            "/memory?scope=private",
            f"/memory?scope=global&q={'staging'}",
            f"/memory/entry?id={written['id']}",
            "/handoff",
            "/attention",
        ]
        for path in paths:
            await page.goto(console.base_url + path)
            html = await page.content()
            assert "staging password" not in html and "blue folder" not in html, path
            # Not even the scope's name: no link, option or heading names it.
            assert await page.locator("nav.scopes a", has_text="rivate").count() == 0, path
            assert await page.locator('select[name="scope"] option[value="private"]').count() == 0, path
        # Writing to it through the console is refused by the console itself.
        await page.goto(console.base_url + "/memory")
        csrf = await page.locator('form.remember input[name="csrf"]').get_attribute("value")
        r = await page.request.post(
            console.base_url + "/memory",
            form={"csrf": csrf, "content": "into private", "type": "status", "scope": "private"},
        )
        assert r.ok and "is not a shared scope" in await r.text()
    mine = await seat(stack, "mesh-console", "memory.recall", {"scope": "private"}, ME)
    assert [e["content"] for e in mine["entries"]] == [secret]  # nothing else was written there


async def test_attention_shows_escalated_not_blocked_and_a_decision_reaches_the_openers_wait(
    stack: Stack, console: ConsoleProcess
) -> None:
    escalated = await seat(
        stack, "mesh-local", "handoff.open", {**QUESTION, "frage": "May I renew the domain for 120 EUR?"}
    )
    await seat(stack, "mesh-local", "handoff.escalate", {"id": escalated["id"], "thema": "geld"})
    blocked = await seat(stack, "mesh-local", "handoff.open", {**QUESTION, "frage": "Which port does staging use?"})
    await seat(stack, "mesh-local", "handoff.withdraw", {"id": blocked["id"], "grund": "found it"})
    opener = await stack.connect("mesh-local")
    client = MeshClient(opener)
    try:
        wait = asyncio.create_task(
            client.call("mesh.seat.handoff.wait", {"id": escalated["id"], "timeout_s": 60}, timeout_s=70)
        )
        async with chromium() as browser:
            page = await logged_in(browser, console)
            await page.click("text=Attention")
            card = page.locator(f'section.attention[data-entry="{escalated["id"]}"]')
            assert await card.count() == 1
            assert await page.locator(f'section.attention[data-entry="{blocked["id"]}"]').count() == 0
            assert "Which port" not in await page.content()
            await page.screenshot(path=str(DOCS_SHOTS / "attention.png"), full_page=True)
            await card.locator('textarea[name="antwort"]').fill("Yes, for three years.")
            await card.locator("button").click()
            flash = await page.locator("#flash").inner_text()
            assert flash == f"{escalated['id']} decided by {person_id()}", flash
            reply = json.loads(await asyncio.wait_for(wait, 20))
            entry = reply["structuredContent"]["entry"]
            assert (entry["entscheidung"], entry["decided_by"]) == ("Yes, for three years.", person_id())
            # The desk: both show by state, with opener and age; an entry's log is readable.
            await page.click("text=Handoff")
            assert await page.locator(f'#state-escalated tr[data-entry="{escalated["id"]}"]').count() == 1
            assert await page.locator(f'#state-blocked tr[data-entry="{blocked["id"]}"]').count() == 1
            await page.screenshot(path=str(DOCS_SHOTS / "handoff.png"), full_page=True)
            await page.click(f'#state-escalated a:text("{escalated["id"]}")')
            log = await page.locator("table.log").inner_text()
            assert "escalated" in log and person_id() in log, log
    finally:
        await client.close()
        await opener.close()


async def test_hostile_text_is_shown_as_text(stack: Stack, console: ConsoleProcess) -> None:
    script = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'
    await seat(
        stack, "mesh-local", "memory.remember", {"content": f"note {script}", "type": "status", "scope": "global"}
    )
    opened = await seat(stack, "mesh-local", "handoff.open", {**QUESTION, "frage": f"May I? {script}"})
    await seat(stack, "mesh-local", "handoff.escalate", {"id": opened["id"], "thema": "aussenwirkung"})
    async with chromium() as browser:
        page = await logged_in(browser, console)
        for path, where in (
            ("/memory", "table.entries"),
            ("/attention", f'section[data-entry="{opened["id"]}"]'),
            ("/handoff", "#state-escalated"),
        ):
            await page.goto(console.base_url + path)
            assert script in await page.locator(where).inner_text(), path
            assert await page.evaluate("window.__pwned") is None, path
            assert await page.locator("img[src=x]").count() == 0


async def test_csrf_headers_hosts_and_the_restart_right(stack: Stack, console: ConsoleProcess) -> None:
    async with chromium() as browser:
        page = await logged_in(browser, console)
        # Without the session's token a form does nothing.
        r = await page.request.post(
            console.base_url + "/memory",
            form={"csrf": "forged", "content": "forged entry", "type": "status", "scope": "global"},
        )
        assert r.status == 403 and "CSRF token is not your session" in await r.text()
        r = await page.request.get(console.base_url + "/")
        headers = r.headers
        assert "script-src 'self'" in headers["content-security-policy"] and headers["x-frame-options"] == "DENY"
        cookie = next(c for c in await page.context.cookies() if c["name"] == "mesh_console")
        assert cookie["httpOnly"] and cookie["sameSite"] == "Lax" and not cookie["secure"]
        sid = cookie["value"]
        # The restart button: the local person is an operator of the node (the node checks it).
        await page.goto(console.base_url + "/")
        await page.locator('tr[data-bundle="hello-python/tools"] button.restart').click()
        flash = await page.locator("#flash").inner_text()
        assert flash.startswith("hello-python/tools on console-node is restarting"), flash
    found = await seat(stack, "mesh-local", "memory.recall", {"query": "forged", "scope": "global"})
    assert found["entries"] == []
    # Another person through the same console user is not an operator: the node refuses, not the page.
    nc = await stack.connect("mesh-console")
    try:
        msg = await nc.request(
            f"mesh.node.{stack.node.name}.restart",
            b'{"bundle": "hello-python/tools"}',
            timeout=5,
            headers={PERSON: encode_person(ANNA)},
        )
        reply = json.loads(msg.data)
        assert not reply["ok"] and "Anna (person:https%3A%2F%2Fidp.example/anna) is not an operator" in reply["error"]
        # And its status, read; the console account reaches nothing else of the node's.
        msg = await nc.request(f"mesh.node.{stack.node.name}.status", b"", timeout=5)
        assert json.loads(msg.data)["node"] == stack.node.name
        with pytest.raises(Exception, match="no responders"):
            await nc.request(f"mesh.node.{stack.node.name}.callers", b"{}", timeout=2)
    finally:
        await nc.close()
    async with httpx2.AsyncClient() as http:
        # A Host this console is not (a name rebound to 127.0.0.1) reads nothing.
        r = await http.get(console.base_url + "/login", headers={"host": "evil.example:80"})
        assert r.status_code == 421
        # Without the printed link's token nobody is logged in; a wrong one is refused.
        r = await http.get(console.base_url + "/", follow_redirects=True)
        assert r.url.path == "/login" and "Open the login link" in r.text and "mesh_console" not in r.cookies
        r = await http.get(console.base_url + "/login?token=guessed")
        assert r.status_code == 401 and "mesh_console" not in r.cookies
    async with httpx2.AsyncClient(cookies={"mesh_console": sid}) as http:
        # A form larger than 64 KiB is refused before it is read whole.
        r = await http.post(console.base_url + "/memory", content=b"a" * (65 * 1024))
        assert r.status_code == 413


async def test_every_page_reads_without_javascript(stack: Stack, console: ConsoleProcess) -> None:
    async with chromium() as browser:
        context = await browser.new_context(java_script_enabled=False)
        page = await context.new_page()
        await page.goto(console.login)
        assert await page.locator('tr[data-bundle="memory/tools"] td.state').inner_text() == "ready"
        for path, what in (
            ("/memory?scope=billing", "table.entries"),
            ("/handoff", "#holders"),
            ("/attention", "main h1"),
        ):
            await page.goto(console.base_url + path)
            assert await page.locator(what).count() == 1, path
        await context.close()


def test_a_console_without_an_issuer_listens_on_loopback_only(stack: Stack, tmp_path: Path) -> None:
    env = dict(os.environ, MESH_STATE_DIR=str(stack.node.state_dir))
    r = subprocess.run(
        [*MESHCTL, "console", "--http", "0.0.0.0:0"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2, r
    assert "listens on loopback only" in r.stderr and "--auth-issuer" in r.stderr, r.stderr


async def test_a_state_with_more_entries_than_a_page_pages_on(stack: Stack, console: ConsoleProcess) -> None:
    opened = [
        await seat(stack, "mesh-local", "handoff.open", {**QUESTION, "frage": f"Paged question {i}?"})
        for i in range(55)
    ]
    async with chromium() as browser:
        page = await logged_in(browser, console)
        await page.goto(console.base_url + "/handoff")
        first = await page.locator("#state-open tr[data-entry]").all_inner_texts()
        assert len(first) == 50
        await page.click("#state-open .more a")
        assert page.url.startswith(console.base_url + "/handoff?state=open&cursor=")
        rest = await page.locator("#state-open tr[data-entry]").all_inner_texts()
        shown = {line.split("\t")[0] for line in first + rest}
        assert {e["id"] for e in opened} <= shown and not set(first) & set(rest)
        assert await page.locator("#state-claimed").count() == 0  # one state's pages only
