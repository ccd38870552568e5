"""A node's control subjects: `mesh.node.<node>.status | restart | seat-move` (runtime/wire/control.py);
`callers` is runtime/node/callers.py.

The mesh account reaches them (an operator's meshctl, smoke, the tests); a console account also
imports `status` and `restart` (runtime/bus/accounts.py CONSOLE_EXPORTS), its restarts stamped by
the server: `RestartRights` lets one through only from a console delegate passing a person who is
an operator.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Callable, Mapping

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
from runtime.wire.identity import (
    PERSON,
    REQUEST_INFO,
    CallerError,
    Via,
    caller_from_info,
    os_person,
    person_from_header,
)
from runtime.wire.subjects import RESTART, SEAT_MOVE, STATUS, node_subject

log = logging.getLogger("mesh.node")


class RestartRights:
    """Who may restart a bundle. A request without the server's stamp came from inside the mesh
    account (an operator's meshctl): as before. A stamped one crossed the console import: it passes
    only from a listed console delegate naming a person who is an operator (`[console] operators`,
    or the node's own local person)."""

    def __init__(self, delegates: Callable[[], Mapping[tuple[str, str | None], Via]], operators: list[str]) -> None:
        self.delegates = delegates
        self.operators = {*operators, os_person().id}

    def refusal(self, headers: Mapping[str, str] | None) -> str | None:
        info = (headers or {}).get(REQUEST_INFO)
        if info is None:
            return None
        try:
            caller = caller_from_info(info)
            listed = self.delegates()
            via = listed.get((caller.account, caller.user)) or listed.get((caller.account, None))
            if via != "console":
                return f"caller {caller.id} is not a console delegate; restarts come from a console or the mesh account"
            given = (headers or {}).get(PERSON)
            if given is None:
                return "a console's restart names the person asking (Mesh-Person); this one named nobody"
            person = person_from_header(given)
        except CallerError as e:
            return str(e)
        if person.id not in self.operators:
            return f"{person.name or person.sub} ({person.id}) is not an operator; [console] operators in the node's config lists who may restart"
        return None


class Control:
    """Answers one node's control subjects while it serves."""

    def __init__(
        self,
        nc: Client,
        node: str,
        url: str,
        modules: ModuleHost,
        dispatcher: Dispatcher,
        rights: RestartRights | None = None,
    ) -> None:
        self.nc, self.node, self.url = nc, node, url
        self.modules, self.dispatcher = modules, dispatcher
        self.rights = rights or RestartRights(dict, [])
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
            seats=modules.seats.shown(),
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
        refusal = self.rights.refusal(msg.headers)
        if refusal is not None:
            log.warning("restart of %r refused: %s", wanted[:200], refusal)
            reply = RestartReply(ok=False, error=f"restart refused: {refusal}")
        else:
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
