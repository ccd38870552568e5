"""The node says on the bus when what it serves changed: `mesh.events.tools`, no reply.

A bundle started, stopped, failed or was upgraded, a module came or went, the node joined or
is leaving: each pokes the notice, and one message per burst (coalesced over `COALESCE_S`)
tells whoever watches (the MCP face, `meshctl mcp`) to look again with `$SRV.INFO`. The body
says which node and why, for logs; a watcher never trusts it for more than "look again".
"""

from __future__ import annotations

import logging
from typing import Callable

import anyio
import msgspec
from nats.aio.client import Client

from runtime.wire.events import ChangeEvent
from runtime.wire.subjects import CHANGES_SUBJECT

log = logging.getLogger("mesh.changes")

COALESCE_S = 0.05  # a module's bundles start together: one message for the lot
MAX_REASONS = 8  # reasons kept per message; past it the message says how many more


class ChangeNotice:
    """Coalesces pokes from synchronous callbacks into messages sent by `run`, a task of the node."""

    def __init__(self, nc: Client, node: str, service_id: str, also: Callable[[str], None] | None = None) -> None:
        self.nc, self.node, self.service_id = nc, node, service_id
        self.also = also  # told of every poke too: the node's catalogue writer (runtime/node/catalog.py)
        self._reasons: list[str] = []
        self._dropped = 0
        self._poked = anyio.Event()

    def poke(self, reason: str) -> None:
        if len(self._reasons) < MAX_REASONS:
            self._reasons.append(reason)
        else:
            self._dropped += 1
        self._poked.set()
        if self.also is not None:
            self.also(reason)

    async def run(self) -> None:
        while True:
            await self._poked.wait()
            await anyio.sleep(COALESCE_S)
            self._poked = anyio.Event()
            await self._publish(leaving=False)

    async def leaving(self) -> None:
        """The last word of a stopping node: watchers drop it from their lists at once."""
        self._reasons.append(f"node {self.node} stopping")
        await self._publish(leaving=True)
        try:
            await self.nc.flush(1)
        except Exception:  # the bus is gone: watchers notice the node's silence instead
            pass

    async def _publish(self, leaving: bool) -> None:
        reasons, self._reasons = self._reasons, []
        if self._dropped:
            reasons.append(f"and {self._dropped} more")
            self._dropped = 0
        body = msgspec.json.encode(ChangeEvent(self.node, self.service_id, reasons, leaving))
        try:
            await self.nc.publish(CHANGES_SUBJECT, body)
        except Exception as e:  # a closed connection: nothing to tell anyone on it
            log.debug("could not publish %s: %s", CHANGES_SUBJECT, e)
