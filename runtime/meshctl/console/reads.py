"""What the console asks the bus, as the logged-in person: the nodes' status, the memory, the handoff desk.

The console's one connection is a console delegate's (the embedded bus's `CONSOLES/mesh-console`, or
an added `--delegate console` caller): every call to a seat names the person (`Mesh-Person`), so the
memory and the desk see the human and decide what that human may read and write; the console adds
no right of its own. The nodes' status and restarts come through the console account's imports
(runtime/bus/accounts.py CONSOLE_EXPORTS); the node checks a restart's person itself.

Every value that comes back is hostile text: the pages escape it (templates, autoescape), and what is
kept here is bounded (`clip`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import anyio
import msgspec
from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

from runtime.bus.catalog_watch import CatalogWatcher
from runtime.client import CallError, MeshClient
from runtime.wire.control import NodeStatus, RestartAsk, RestartReply
from runtime.wire.identity import PERSON, Person, encode_person
from runtime.wire.subjects import RESTART, STATUS, node_subject

log = logging.getLogger("mesh.console")

STATUS_TIMEOUT_S = 2.0
CALL_TIMEOUT_S = 10.0
STATUS_FRESH_S = 0.25  # pages polling at once share one round of status requests
MAX_NODES = 500  # nodes asked for status in one round; past it the page says how many it left out
MAX_TEXT = 4000  # characters of any one text the console keeps from the bus


def clip(value: object, limit: int = MAX_TEXT) -> str:
    """A value from the bus as bounded text ('' for what is not a scalar)."""
    if isinstance(value, bool) or value is None:
        return "" if value is None else str(value).lower()
    if isinstance(value, (str, int, float)):
        text = str(value)
        return text if len(text) <= limit else text[:limit] + " [...]"
    return ""


@dataclass
class NodeView:
    name: str
    status: NodeStatus | None = None
    problem: str = ""  # why there is no status


@dataclass
class MeshView:
    nodes: list[NodeView]
    left_out: int = 0
    catalogue: str = ""  # why the catalogue could not be read, when it could not
    at: float = field(default_factory=time.time)


@dataclass
class Answer:
    """A seat's answer: its structuredContent, or the refusal's text (a tool error or a runtime error)."""

    data: dict[str, Any]
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error


class MeshReads:
    """The console's reads and writes on one connection; the catalogue watcher runs in the console's task group."""

    def __init__(self, nc: Client) -> None:
        self.nc = nc
        self.client = MeshClient(nc)
        self.catalog = CatalogWatcher(nc)
        self.catalog_problem = ""
        self._mesh: MeshView | None = None
        self._lock = anyio.Lock()

    # --- the mesh: every node's status -------------------------------------------------------
    async def mesh(self) -> MeshView:
        """Every live node's status; asked again at most every STATUS_FRESH_S, whoever asks."""
        async with self._lock:
            if self._mesh is not None and time.monotonic() - self._mesh.at < STATUS_FRESH_S:
                return self._mesh
            names = sorted(n.node for n in self.catalog.nodes())
            views = [NodeView(n) for n in names[:MAX_NODES]]
            async with anyio.create_task_group() as tg:
                for view in views:
                    tg.start_soon(self._status, view)
            self._mesh = MeshView(views, max(0, len(names) - MAX_NODES), self.catalog_problem, at=time.monotonic())
            return self._mesh

    def forget_mesh(self) -> None:
        self._mesh = None

    async def _status(self, view: NodeView) -> None:
        try:
            msg = await self.nc.request(node_subject(view.name, STATUS), b"", timeout=STATUS_TIMEOUT_S)
            view.status = msgspec.json.decode(msg.data, type=NodeStatus)
        except NoRespondersError:
            view.problem = (
                "its status is not readable here: nobody answers, or this console's bus user is not in a "
                "console account (the embedded bus's CONSOLES/mesh-console is)"
            )
        except NatsTimeout:
            view.problem = f"no status within {STATUS_TIMEOUT_S:g} s"
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            view.problem = f"its status is not a node status: {clip(str(e), 200)}"

    async def restart(self, node: str, bundle: str, person: Person) -> RestartReply:
        """Ask the node to restart a bundle as `person`: the node decides whether that person may."""
        headers = {PERSON: encode_person(person)}
        body = msgspec.json.encode(RestartAsk(bundle=bundle))
        try:
            msg = await self.nc.request(node_subject(node, RESTART), body, timeout=STATUS_TIMEOUT_S, headers=headers)
            reply = msgspec.json.decode(msg.data, type=RestartReply)
        except NoRespondersError:
            return RestartReply(ok=False, error=f"nobody answers restarts of node {node!r} for this console")
        except NatsTimeout:
            return RestartReply(ok=False, error=f"node {node!r} did not answer within {STATUS_TIMEOUT_S:g} s")
        except (msgspec.DecodeError, msgspec.ValidationError):
            return RestartReply(ok=False, error=f"node {node!r} answered something that is not a restart reply")
        self.forget_mesh()
        return reply

    # --- seats, as the person ----------------------------------------------------------------
    async def seat(self, verb: str, arguments: dict[str, Any], person: Person) -> Answer:
        """`mesh.seat.<verb>` called for `person`; the answer's structuredContent, or why not."""
        try:
            raw = await self.client.call(f"mesh.seat.{verb}", arguments, timeout_s=CALL_TIMEOUT_S, person=person)
        except CallError as e:
            return Answer({}, clip(str(e), 1000) or f"{verb} failed")
        try:
            result = msgspec.json.decode(raw)
        except msgspec.DecodeError:
            return Answer({}, f"{verb} answered something that is not JSON")
        if not isinstance(result, dict):
            return Answer({}, f"{verb} answered something that is not a tool result")
        if result.get("isError"):
            texts = [clip(c.get("text"), 1000) for c in result.get("content") or [] if isinstance(c, dict)]
            return Answer({}, " ".join(t for t in texts if t) or f"{verb} refused")
        data = result.get("structuredContent")
        return Answer(data if isinstance(data, dict) else {})
