"""A node's control subjects: `mesh.node.<node>.status | restart | seat-move` (runtime/wire/control.py);
`callers` is runtime/node/callers.py.

Only the mesh account reaches them (the accounts export the call subjects alone): an operator's
meshctl, smoke, the tests.
"""

from __future__ import annotations

import logging
import os
import time

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from launcher.bundle import BundleRunner
from runtime.bus.catalog import where
from runtime.bus.connect import settle
from runtime.calls.dispatch import Dispatcher
from runtime.hosting.services import Hosted
from runtime.node.modules import ModuleHost
from runtime.wire.control import ModuleStatus, NodeStatus, RestartAsk, RestartReply
from runtime.wire.subjects import RESTART, SEAT_MOVE, STATUS, node_subject

log = logging.getLogger("mesh.node")


class Control:
    """Answers one node's control subjects while it serves."""

    def __init__(self, nc: Client, node: str, url: str, modules: ModuleHost, dispatcher: Dispatcher) -> None:
        self.nc, self.node, self.url = nc, node, url
        self.modules, self.dispatcher = modules, dispatcher
        self._started = time.monotonic()
        self._subs: list[Subscription] = []
        self.identity = ""  # whose word the callers' identity is (runtime/bus/trust.py), for status

    async def start(self) -> None:
        for verb, handler in ((STATUS, self._on_status), (RESTART, self._on_restart), (SEAT_MOVE, self._on_move)):
            self._subs.append(await self.nc.subscribe(node_subject(self.node, verb), cb=handler))
        await settle(self.nc)  # asked the moment the node says it serves

    async def stop(self) -> None:
        subs, self._subs = self._subs, []
        for sub in subs:
            await sub.unsubscribe()

    def status(self) -> NodeStatus:
        modules = self.modules
        at = where(self.nc)
        return NodeStatus(
            node=self.node,
            url=self.url,
            pid=os.getpid(),
            uptime_s=round(time.monotonic() - self._started, 3),
            modules=[
                ModuleStatus(m.name, m.version, modules.sources.get(m.name, "")) for m in modules.table.modules.values()
            ],
            bundles=modules.bundle_statuses(),
            seats=list(modules.seats.status.values()),
            problems=modules.all_problems(),
            in_flight=self.dispatcher.in_flight,
            answered=self.dispatcher.answered,
            identity=self.identity,
            cluster=at.cluster,
            server=at.server,
            sandbox=modules.sandbox,
        )

    async def _on_status(self, msg: Msg) -> None:
        if msg.reply:
            await msg.respond(msgspec.json.encode(self.status()))

    async def _on_move(self, msg: Msg) -> None:
        await self.modules.seats.on_move(msg)

    async def _on_restart(self, msg: Msg) -> None:
        try:
            wanted = msgspec.json.decode(msg.data or b"{}", type=RestartAsk).bundle
        except (msgspec.DecodeError, msgspec.ValidationError):
            wanted = ""
        reply = self.restart(wanted)
        if msg.reply:
            await msg.respond(msgspec.json.encode(reply))

    def restart(self, wanted: str) -> RestartReply:
        """Restart one bundle named `module/bundle`, or its module when it has one bundle (or bundle alone)."""
        runners: list[BundleRunner | Hosted] = [*self.modules.runners(), *self.modules.hosting.all()]
        matches = [
            b
            for b in runners
            if wanted in (b.key, b.key.split("/")[0])
            or (wanted and b.key.split("/")[1] == wanted and "/" not in wanted)
        ]
        if len(matches) != 1:
            known = ", ".join(b.key for b in runners) or "none"
            why = "is ambiguous" if matches else "is not on this node"
            return RestartReply(ok=False, error=f"bundle {wanted!r} {why}; bundles here: {known}")
        bundle = matches[0]
        was = bundle.state
        bundle.request_restart()
        log.warning("bundle %s restart requested by an operator (was %s)", bundle.key, was)
        return RestartReply(ok=True, bundle=bundle.key, was=was)
