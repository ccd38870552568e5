"""The node: modules in, bundles supervised, subjects served, a clean stop.

The node always starts. A module that cannot be loaded and a bundle that cannot start are
named in an ERROR line and in status; every other bundle serves. `Node.run` is the whole life:
the embedded bus (when no URL is given), the children (started before the bus answers), then,
once it answers, the `Serving` parts, and the stop in their reverse order.

Process-wide set-up (non-dumpable, the pidfd child watcher) is `prepare_process`, called by
`meshctl node run`, so that a `Node` can also run inside a test's process.
"""

from __future__ import annotations

import ctypes
import logging
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.abc
import msgspec
from nats.aio.client import Client

from launcher.process import use_pidfd_child_watcher
from launcher.reaper import Reaper, kill_marked
from runtime.bus.accounts import EmbeddedAccounts
from runtime.bus.connect import BusError, connect, connect_lane, redact
from runtime.bus.embedded import EmbeddedServer
from runtime.bus.info import BusInfo, write_bus_info
from runtime.bus.service_api import ServiceApi
from runtime.bus.trust import BusTrust, ask_trust
from runtime.calls.desk import CallDesk
from runtime.calls.dispatch import Dispatcher
from runtime.calls.identity import CallerStamp
from runtime.calls.tracing import Tracing
from runtime.config import NatsConfig, NodeConfig
from runtime.delivery.reconciler import Reconciler
from runtime.hosting.confine import node_sandbox
from runtime.hosting.placement import Placement
from runtime.node.callers import Callers
from runtime.node.catalog import CatalogWriter
from runtime.node.changes import ChangeNotice
from runtime.node.control import Control, RestartRights
from runtime.node.metrics import MetricsServer, NodeParts, registry_of
from runtime.node.modules import ModuleHost, Wiring
from runtime.wire.control import NodeStatus
from runtime.wire.identity import Via, local_caller

log = logging.getLogger("mesh.node")

PR_SET_DUMPABLE = 4


def protect_environment() -> bool:
    """Make this process non-dumpable: its /proc files (environ, mem) become root's, so a child
    running as the node's own user cannot read the secrets the node was started with. Children
    are dumpable again after their exec. Running children as another user (`child_user`) adds
    the rest: they cannot signal, trace or read anything of the node's user."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0
    except (OSError, AttributeError):  # not Linux: nothing to set
        return False


def prepare_process() -> None:
    """What a node process sets once for itself (`meshctl node run`), never for a test's process;
    called in its running event loop."""
    if not protect_environment():
        log.warning("could not make the node non-dumpable: same-user processes may read its environment")
    use_pidfd_child_watcher()


@dataclass
class Serving:
    """The node's parts that live while its bus answers: made together, so none is ever missing."""

    nc: Client
    desk: CallDesk  # calls with Mesh-* headers: cancels, progress, objects
    dispatcher: Dispatcher
    service: ServiceApi
    notice: ChangeNotice  # mesh.events.tools: what this node serves changed
    control: Control
    callers: Callers  # the embedded bus's callers (meshctl caller)
    catalog: CatalogWriter  # this node's entries in the mesh-catalog bucket

    async def close(self) -> None:
        """After the children have stopped: the Service API goes, watchers hear the node leave."""
        await self.service.stop()
        await self.catalog.leaving()
        await self.notice.leaving()
        await self.desk.stop()
        await self.control.stop()
        if self.dispatcher.tracing is not None:
            await anyio.to_thread.run_sync(self.dispatcher.tracing.shutdown)  # what is left is exported
        await self.callers.stop()


class Node:
    def __init__(self, config: NodeConfig, reaper: Reaper | None = None) -> None:
        """`reaper`: the watchdog of the node's children (default: one of its own, started by `run`)."""
        self.config = config
        self.name = config.name
        self.state_dir = Path(config.state_dir)
        self.problems: list[str] = []  # modules not loaded at start (the CLI names them)
        self.url = ""
        self.run_id = uuid.uuid4().hex[:16]
        self.reaper = reaper or Reaper(self.run_id)
        self.serving: Serving | None = None  # while the bus answers
        self.metrics: MetricsServer | None = None  # /metrics, when [metrics] listen says where
        self._accounts: EmbeddedAccounts | None = None  # the embedded bus's accounts (it always has them)
        self._embedded: EmbeddedServer | None = None
        self._stop = anyio.Event()
        self._ready = anyio.Event()

    # --- lifecycle ------------------------------------------------------------------------
    def request_stop(self) -> None:
        self._stop.set()

    async def wait_ready(self) -> None:
        await self._ready.wait()

    def status(self) -> NodeStatus | None:
        return self.serving.control.status() if self.serving is not None else None

    async def run(self, placements: list[Placement] | None = None) -> None:
        self._private_state()
        embedded: EmbeddedServer | None = None
        nats_cfg = self.config.nats
        if not nats_cfg.url:
            embedded, nats_cfg = await self._embedded_bus()
        else:
            self.url = redact(nats_cfg.url)  # status, logs and the banner never show credentials
            if nats_cfg.caller:
                log.warning(
                    "nats.caller is for the embedded bus; on %s, configure the callers' accounts on that server "
                    "(README, Who is calling)",
                    self.url,
                )
        try:
            await self.reaper.start()
            await self._serve(nats_cfg, placements or [])
        finally:
            # Shielded: a stop at once (a second SIGTERM, a cancelled task) still closes what it opened.
            with anyio.CancelScope(shield=True):
                serving = self.serving
                if serving is not None:
                    await serving.service.close_lanes()
                    if not serving.nc.is_closed:
                        with anyio.move_on_after(5):
                            try:
                                await serving.nc.drain()
                            except Exception:  # closing a broken connection: nothing left to save
                                pass
                        if not serving.nc.is_closed:
                            await serving.nc.close()
                await self.reaper.close()
                kill_marked(self.run_id)  # whatever a child left behind, even outside its group
                if embedded is not None:
                    await embedded.stop()
            log.info("node %s stopped", self.name)

    def _private_state(self) -> None:
        """The state folder is the node's user's alone (0700): bus passwords, the bus's store, the
        children's data. Children run as `child_user` must pass through it to their own folders
        (0711: they may enter, not list; what is inside keeps its own mode)."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        mode = 0o711 if self.config.child_user else 0o700
        try:
            os.chmod(self.state_dir, mode)
        except OSError as e:  # not the node's own folder (another user's): said, not fatal
            log.warning("could not make the state folder %s private (mode %o): %s", self.state_dir, mode, e.strerror)

    async def _embedded_bus(self) -> tuple[EmbeddedServer, NatsConfig]:
        # The embedded bus always has accounts: no connection without credentials, callers stamped.
        accounts = self._accounts = EmbeddedAccounts(self.state_dir, self.config.nats.caller)
        if accounts.problem:
            log.error("%s", accounts.problem)
            self.problems.append(accounts.problem)
        embedded = self._embedded = EmbeddedServer(
            self.state_dir, self.name, self.config.nats.embedded_port, accounts.server_config()
        )
        await embedded.start()
        self.url = embedded.url
        nats_cfg = msgspec.structs.replace(
            self.config.nats, url=embedded.url, user=accounts.mesh_user, password=accounts.mesh_password
        )
        log.info("%s", accounts.summary())
        log.info(
            "embedded NATS server (JetStream on) listening on %s, state in %s", embedded.url, self.state_dir / "nats"
        )
        return embedded, nats_cfg

    async def _connect(self, cfg: NatsConfig) -> Client | None:
        """The bus, once it answers (retried for ever, named by `connect`); None when a stop comes first."""
        found: list[Client] = []
        refused: list[BusError] = []
        async with anyio.create_task_group() as tg:

            async def attempt() -> None:
                try:
                    found.append(await connect(cfg, f"mesh-node:{self.name}"))
                except BusError as e:  # kept out of the task group: it must reach the CLI as itself
                    refused.append(e)
                tg.cancel_scope.cancel()

            async def stopped() -> None:
                await self._stop.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(attempt)
            tg.start_soon(stopped)
        if refused:
            raise refused[0]
        return found[0] if found else None

    async def _serve(self, nats_cfg: NatsConfig, placements: list[Placement]) -> None:
        refused: list[BusError] = []
        async with anyio.create_task_group() as bundles_tg:
            modules = ModuleHost(self.config, self.run_id, self.reaper, bundles_tg)
            modules.problems.extend(self.problems)
            modules.sandbox = await node_sandbox(self.config)  # said once: what every child is confined with
            # Steps first (once per version): a module whose step fails is named, and not served.
            placements = [p for p in placements if await modules.steps_pass(p)]
            # The children start before the bus is reached: a bus that is down delays calls, not starts.
            for placement in placements:
                modules.prestart(placement)
            try:
                try:
                    nc = await self._connect(nats_cfg)
                except BusError as e:  # raised past the task group, not inside it (an ExceptionGroup)
                    refused.append(e)
                    nc = None
                if nc is not None:
                    trust = await ask_trust(nc)
                    if trust.stamped:
                        log.info("caller identity: %s", trust.summary)
                    else:
                        log.warning("caller identity: %s", trust.summary)
                    write_bus_info(self.state_dir, self._bus_info())  # without credentials, 0600
                    await self._serve_bus(nc, nats_cfg, modules, placements, trust)
            finally:
                with anyio.CancelScope(shield=True):
                    await modules.stop_all()
        if refused:
            raise refused[0]
        if self.serving is not None:
            await self.serving.close()

    def _bus_info(self) -> BusInfo:
        """bus.json: where the bus is and, for the embedded one, which file holds which login."""
        accounts = self._accounts
        if accounts is None:
            return BusInfo(url=self.url, node=self.name, pid=os.getpid(), embedded=False)
        return BusInfo(
            url=self.url,
            node=self.name,
            pid=os.getpid(),
            embedded=True,
            user=accounts.mesh_user,
            password_file=str(accounts.mesh_password_file),
            caller_user=accounts.local.user,
            caller_password_file=str(accounts.local.password_file),
            face_user=accounts.face.user,
            face_password_file=str(accounts.face.password_file),
            console_user=accounts.console.user,
            console_password_file=str(accounts.console.password_file),
        )

    def _delegates(self) -> dict[tuple[str, str | None], Via]:
        """The config's delegates, and the embedded bus's own (its face, added delegates)."""
        listed = self.config.identity.listed()
        if self._accounts is not None:
            listed.update(self._accounts.delegates())
        return listed

    def _serving(self, nc: Client, nats_cfg: NatsConfig, modules: ModuleHost, trust: BusTrust) -> Serving:
        stamp = CallerStamp(
            local_caller(self.config.identity.local),
            self._delegates(),
            stamped=trust.stamped,
            operator=self._accounts.operator if self._accounts is not None else None,
        )
        desk = CallDesk(nc, self.config.calls, self.name, stamp)
        tracing = Tracing.from_environment(self.name)  # None unless OTEL_TRACES_EXPORTER asks for traces
        dispatcher = Dispatcher(nc, modules.table, self.name, desk, stamp, tracing)
        service = ServiceApi(
            nc,
            node=self.name,
            queue_group=self.config.queue_group,
            handler=dispatcher.start,
            endpoints=lambda: modules.table.routes.values(),
            metadata=lambda: {"node": self.name, "seats": ",".join(modules.seats.held())},
            # Each module's and seat's requests on a connection of their own: a flood at one of
            # them can cost the bus connection of that one only (runtime/bus/service_api.py).
            lane=lambda subject, on_error: connect_lane(nats_cfg, f"mesh-node:{self.name}:{subject}", on_error),
        )
        cat = self.config.catalog
        catalog = CatalogWriter(
            nc,
            self.name,
            service.id,
            self.run_id,
            modules,
            beat_s=cat.beat_s,
            beat_ttl_s=cat.beat_ttl_s(),
            replicas=cat.replicas,
            max_bytes=cat.max_bytes,
        )
        notice = ChangeNotice(nc, self.name, service.id, also=catalog.poke)
        rights = RestartRights(self._delegates, self.config.console.operators)
        control = Control(nc, self.name, self.url, modules, dispatcher, rights)
        control.identity = trust.summary
        bus = (self._accounts, self._embedded) if self._accounts is not None and self._embedded is not None else None
        callers = Callers(nc, self.name, self.url, bus, lambda _: stamp.set_delegates(self._delegates()))
        return Serving(nc, desk, dispatcher, service, notice, control, callers, catalog)

    async def _serve_bus(
        self, nc: Client, nats_cfg: NatsConfig, modules: ModuleHost, placements: list[Placement], trust: BusTrust
    ) -> None:
        serving = self.serving = self._serving(nc, nats_cfg, modules, trust)
        async with anyio.create_task_group() as watchers_tg:
            await serving.service.start()
            watchers_tg.start_soon(serving.notice.run)
            watchers_tg.start_soon(serving.catalog.run)
            await serving.desk.start(self.config.queue_group)
            modules.wire(Wiring(nc, serving.service, serving.desk, serving.notice, nats_cfg))
            await serving.control.start()
            await serving.callers.start()
            # Every child starts at once; the seats (one lease look each) follow.
            for placement in placements:
                await modules.add_module(placement, claim_seats=False)
            for placement in placements:
                await modules.claim_seats(placement, None)
            reconciler: Reconciler | None = None
            if self.config.membership:
                reconciler = Reconciler(nc, self.name, self.state_dir, modules, limits=self.config.delivery)
                watchers_tg.start_soon(reconciler.run)
            if self.config.metrics.listen:
                parts = NodeParts(modules, serving.dispatcher, serving.desk, lambda: reconciler)
                self.metrics = MetricsServer(self.config.metrics.listen, registry_of(parts))
                await watchers_tg.start(self.metrics.run)
            await serving.catalog.written_once(timeout=2.0)  # in the catalogue when it says it serves
            log.info(
                "node %s serving on %s: %d modules, %d tools bundles; call a tool with "
                "`meshctl call tool.<module>.<tool> '{...}'`",
                self.name,
                self.url,
                len(modules.table.modules),
                len(modules.runners()),
            )
            self._ready.set()
            serving.notice.poke(f"node {self.name} joined")
            await self._stop.wait()
            dispatcher = serving.dispatcher
            log.info("node %s stopping: no new calls; answering %d in flight", self.name, dispatcher.in_flight)
            await serving.service.drain()
            await serving.catalog.leaving()  # faces drop this node now, not when its children have stopped
            with anyio.move_on_after(self.config.drain_timeout_s):
                await dispatcher.wait_idle()
            await dispatcher.cancel_all()  # what is left is answered 503 "node stopping"
            await modules.seats.close()  # leases released: a successor need not wait for them to expire
            watchers_tg.cancel_scope.cancel()
