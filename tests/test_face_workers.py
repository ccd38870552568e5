"""`meshctl mcp --http --workers 2` as real processes on a real nats-server, with a bus responder
playing the node (its entries in the catalogue, and it answers the tool's subject): stateless 2026-07-28 calls on
new connections are served by both workers; a 2025-11-25 session works whichever worker a
connection lands on (the second passes that era to the first); the second worker ends with the
first, even one killed outright."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import anyio
import httpx2
import pytest

from runtime.bus.embedded import free_port
from tests.support.catalog_entries import write_node
from tests.support.mesh import MESHCTL, ROOT, NatsServer, client, stop_process, wait_port
from tests.unit.runtime.meshctl.test_face_hot import ENVELOPE, HEADERS, LEGACY, TOOLS, Node, _call, _modern_headers

pytestmark = pytest.mark.slow


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


async def test_two_workers_share_the_port_and_sessions_stay_on_the_first(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    nc = await client(nats_server.url)
    node = Node(nc)
    await node.start()

    await write_node(nc, TOOLS)
    port = free_port()
    log = tmp_path / "face.log"
    argv = [*MESHCTL, "mcp", "--nats", nats_server.url, "--http", f"127.0.0.1:{port}", "--workers", "2"]
    with open(log, "wb") as out:
        face = subprocess.Popen([*argv, "--log-level", "info"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=out)
    try:
        await anyio.to_thread.run_sync(wait_port, port, 30)
        with anyio.fail_after(60):
            while "worker 1 of 2" not in log.read_text():
                await anyio.sleep(0.1)
        started = log.read_text()
        # Each worker saw the node's tools, read from the catalogue.
        shown = f"({len(TOOLS)} tools)"  # every tool of the responder
        assert f"(worker 0 of 2) {shown}" in started and f"(worker 1 of 2) {shown}" in started, started
        url = f"http://127.0.0.1:{port}/mcp"
        close = {"Connection": "close"}  # a new connection per request: the kernel picks a worker each time
        async with httpx2.AsyncClient(timeout=30) as http:
            for i in range(40):
                answer = await http.post(
                    url,
                    json=_call(i, "m_echo", meta=ENVELOPE),
                    headers={**_modern_headers("tools/call", "m_echo"), **close},
                )
                assert answer.status_code == 200 and answer.json()["result"]["content"][0]["text"] == "hi", answer.text
            inboxes = {m.reply.rsplit(".", 1)[0] for m in node.calls}
            assert len(inboxes) == 2, inboxes  # each worker calls the bus on its own connection

            init = {
                "jsonrpc": "2.0",
                "id": 0,
                "method": "initialize",
                "params": {"protocolVersion": LEGACY, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
            }
            opened = await http.post(url, json=init, headers={**HEADERS, **close})
            assert opened.status_code == 200, opened.text
            session = {
                **HEADERS,
                **close,
                "Mcp-Session-Id": opened.headers["mcp-session-id"],
                "MCP-Protocol-Version": LEGACY,
            }
            done = await http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=session)
            assert done.status_code == 202
            before = len(node.calls)
            for i in range(30):
                answer = await http.post(url, json=_call(100 + i, "m_echo"), headers=session)
                assert answer.status_code == 200 and answer.json()["id"] == 100 + i, answer.text
            legacy_inboxes = {m.reply.rsplit(".", 1)[0] for m in node.calls[before:]}
            assert len(legacy_inboxes) == 1  # every call of the session made by the one worker that holds it
            listed = await http.post(url, json={"jsonrpc": "2.0", "id": 200, "method": "tools/list"}, headers=session)
            assert "m_echo" in listed.text
            assert (await http.delete(url, headers=session)).status_code == 200
        workers = _children(face.pid)
        assert len(workers) == 1
        face.send_signal(signal.SIGKILL)  # no goodbye from the first: the second ends by itself
        face.wait(10)
        deadline = time.monotonic() + 15
        while os.path.exists(f"/proc/{workers[0]}") and time.monotonic() < deadline:
            try:
                os.waitpid(workers[0], os.WNOHANG)
            except ChildProcessError:
                pass
            state = (
                Path(f"/proc/{workers[0]}/stat").read_text().split()[2]
                if os.path.exists(f"/proc/{workers[0]}")
                else "X"
            )
            if state == "Z":
                break
            await anyio.sleep(0.1)
        assert (
            not os.path.exists(f"/proc/{workers[0]}") or Path(f"/proc/{workers[0]}/stat").read_text().split()[2] == "Z"
        )
    finally:
        stop_process(face)
        await nc.close()
