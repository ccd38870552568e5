"""The node: modules in, bundles supervised, subjects served, a clean stop.

The node always starts. A module that cannot be loaded and a bundle that cannot start are
named in an ERROR line and in status; every other bundle serves.
"""

from __future__ import annotations

import ctypes
import logging
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from launcher.bundle import BundleRunner, BundleStatus
from launcher.process import use_pidfd_child_watcher
from launcher.reaper import Reaper, kill_marked
from manifests import BundleManifest
from runtime.bus.accounts import EmbeddedAccounts
from runtime.bus.connect import BusError, BusInfo, EmbeddedServer, connect, redact, write_bus_info
from runtime.bus.service_api import Service
from runtime.calls.desk import CallDesk
from runtime.calls.dispatch import Dispatcher
from runtime.calls.routes import SEAT_PREFIX, TOOL_PREFIX, ModuleEntry, RouteTable
from runtime.config import NatsConfig, NodeConfig
from runtime.delivery.reconciler import Reconciler
from runtime.hosting.placement import Placement, data_dir, runner_spec
from runtime.hosting.services import Hosted, ServiceHost
from runtime.hosting.steps import StepFailed
from runtime.node.changes import ChangeNotice
from runtime.seats.seats import Seats, SeatStatus, shown_state, stateful_seats, wanted_seats
from runtime.wire.identity import CallerStamp, local_caller

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


class ModuleStatus(msgspec.Struct):
    name: str
    version: str
    source: str


class NodeStatus(msgspec.Struct):
    node: str
    url: str
    pid: int
    uptime_s: float
    modules: list[ModuleStatus]
    bundles: list[BundleStatus]
    seats: list[SeatStatus]
    problems: list[str]
    in_flight: int
    answered: int


class Node:
    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.name = config.name
        self.state_dir = Path(config.state_dir)
        self.table = RouteTable(self.name)
        self.problems: list[str] = []
        self.delivery_problems: dict[str, str] = {}
        self.sources: dict[str, str] = {}
        self.url = ""
        self.nc: Client | None = None
        self.dispatcher: Dispatcher | None = None
        self.desk: CallDesk | None = None  # calls with Mesh-* headers: cancels, progress, objects
        self.service: Service | None = None
        self.notice: ChangeNotice | None = None  # mesh.events.tools: what this node serves changed
        self.run_id = uuid.uuid4().hex[:16]
        self.reaper = Reaper(self.run_id)
        self.hosting = ServiceHost(config, self.run_id, self.reaper)  # service and step bundles
        self._subs: dict[str, Subscription] = {}
        self._control: list[Subscription] = []
        self.seats = Seats(
            self.name, config, self.table, self.run_id, self._subscribe, self._unsubscribe, self._served_changed
        )
        self._accounts: EmbeddedAccounts | None = None  # the embedded bus's caller accounts, when configured
        self._bundles_tg: anyio.abc.TaskGroup | None = None
        self._prestarted: dict[str, list[BundleRunner]] = {}  # started before the bus answered
        self._stop = anyio.Event()
        self._ready = anyio.Event()
        self._started = time.monotonic()

    # --- lifecycle ------------------------------------------------------------------------
    def request_stop(self) -> None:
        self._stop.set()

    async def wait_ready(self) -> None:
        await self._ready.wait()

    async def run(self, placements: list[Placement] | None = None) -> None:
        if not protect_environment():
            log.warning("could not make the node non-dumpable: same-user processes may read its environment")
        use_pidfd_child_watcher()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        embedded: EmbeddedServer | None = None
        if not self.config.nats.url:
            if self.config.nats.caller:
                self._accounts = EmbeddedAccounts(self.state_dir, self.config.nats.caller)
            accounts = self._accounts
            embedded = EmbeddedServer(
                self.state_dir,
                self.name,
                self.config.nats.embedded_port,
                accounts.server_config() if accounts else None,
            )
            await embedded.start()
            self.url = embedded.url
            nats_cfg = msgspec.structs.replace(self.config.nats, url=embedded.url)
            if accounts is not None:
                nats_cfg = msgspec.structs.replace(nats_cfg, user=accounts.mesh_user, password=accounts.mesh_password)
                log.info("%s", accounts.summary())
            log.info(
                "embedded NATS server (JetStream on) listening on %s, state in %s",
                embedded.url,
                self.state_dir / "nats",
            )
        else:
            nats_cfg = self.config.nats
            self.url = redact(self.config.nats.url)  # status, logs and the banner never show credentials
            if self.config.nats.caller:
                log.warning(
                    "nats.caller is for the embedded bus; on %s, configure the callers' accounts on that server "
                    "(README, Who is calling)",
                    self.url,
                )
        try:
            await self.reaper.start()
            await self._serve(nats_cfg, placements or [])
        finally:
            if self.nc is not None and not self.nc.is_closed:
                try:
                    await self.nc.drain()
                except Exception:  # closing a broken connection: nothing left to save
                    await self.nc.close()
            await self.reaper.close()
            kill_marked(self.run_id)  # whatever a child left behind, even outside its group
            if embedded is not None:
                await embedded.stop()
            log.info("node %s stopped", self.name)

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
            self._bundles_tg = bundles_tg
            # Steps first (once per version): a module whose step fails is named, and not served.
            placements = [p for p in placements if await self._steps_pass(p)]
            # The children start before the bus is reached: a bus that is down delays calls, not starts.
            for placement in placements:
                self._prestart(placement)
            try:
                try:
                    self.nc = await self._connect(nats_cfg)
                except BusError as e:  # raised past the task group, not inside it (an ExceptionGroup)
                    refused.append(e)
                if self.nc is not None:
                    embedded = not self.config.nats.url
                    accounts = self._accounts
                    info = BusInfo(
                        url=self.url,
                        node=self.name,
                        pid=os.getpid(),
                        embedded=embedded,
                        user=accounts.mesh_user if accounts else None,
                        password_file=str(accounts.mesh_password_file) if accounts else None,
                    )
                    write_bus_info(self.state_dir, info)  # without credentials, 0600
                    await self._serve_bus(placements)
            finally:
                with anyio.CancelScope(shield=True):
                    for bundle in [b for m in self.table.modules.values() for b in m.bundles] + [
                        b for bs in self._prestarted.values() for b in bs
                    ]:
                        await bundle.stop()
                    await self.hosting.stop_all()
        if refused:
            raise refused[0]
        if self.nc is not None and self.service is not None:
            await self.service.stop()
            if self.notice is not None:
                await self.notice.leaving()
            if self.desk is not None:
                await self.desk.stop()
            for sub in self._control:
                await sub.unsubscribe()

    def _prestart(self, placement: Placement) -> None:
        module = placement.loaded.module
        bundles = [self._runner(placement, spec) for spec in module.tools_bundles()]
        self._prestarted[module.name] = bundles
        assert self._bundles_tg is not None
        for bundle in bundles:
            self._bundles_tg.start_soon(bundle.run)

    async def _serve_bus(self, placements: list[Placement]) -> None:
        assert self.nc is not None
        self.desk = CallDesk(self.nc, self.config.calls)
        self.dispatcher = Dispatcher(
            self.nc,
            self.table,
            self.name,
            self.desk,
            CallerStamp(local_caller(self.config.identity.local), frozenset(self.config.identity.mcp_faces)),
        )
        self.service = Service(
            self.nc,
            node=self.name,
            queue_group=self.config.queue_group,
            endpoints=lambda: list(self.table.routes.values()),
            metadata=self._metadata,
        )
        self.notice = ChangeNotice(self.nc, self.name, self.service.id)
        async with anyio.create_task_group() as watchers_tg:
            await self.service.start()
            watchers_tg.start_soon(self.notice.run)
            await self.desk.start(self.config.queue_group)
            assert self._bundles_tg is not None
            self.seats.serve(self.nc, self.service.id, self._bundles_tg)
            await self._start_control()
            # Every child starts at once; the seats (one lease look each) follow.
            for placement in placements:
                await self.add_module(placement, claim_seats=False)
            for placement in placements:
                await self._claim_seats(placement, None)
            if self.config.membership:
                reconciler = Reconciler(
                    self.nc,
                    self.name,
                    self.state_dir,
                    self.add_module,
                    self.remove_module,
                    self._delivery_report,
                    limits=self.config.delivery,
                )
                watchers_tg.start_soon(reconciler.run)
            log.info(
                "node %s serving on %s: %d modules, %d tools bundles; call a tool with "
                "`meshctl call tool.<module>.<tool> '{...}'`",
                self.name,
                self.url,
                len(self.table.modules),
                sum(len(m.bundles) for m in self.table.modules.values()),
            )
            self._ready.set()
            self.notice.poke(f"node {self.name} joined")
            await self._stop.wait()
            log.info("node %s stopping: no new calls; answering %d in flight", self.name, self.dispatcher.in_flight)
            await self._drain_subscriptions()
            with anyio.move_on_after(self.config.drain_timeout_s):
                await self.dispatcher.wait_idle()
            await self.dispatcher.cancel_all()  # what is left is answered 503 "node stopping"
            await self.seats.close()  # leases released: a successor need not wait for them to expire
            watchers_tg.cancel_scope.cancel()

    # --- modules --------------------------------------------------------------------------
    async def add_module(self, placement: Placement, claim_seats: bool = True) -> None:
        """Serve a module; a module already served is upgraded in place, its calls ridden over.

        Its steps run first: StepFailed refuses the version before anything is touched."""
        await self.hosting.run_steps(placement)
        module = placement.loaded.module
        old = self.table.modules.get(module.name)
        prestarted = self._prestarted.pop(module.name, None)
        bundles = prestarted or [self._runner(placement, spec) for spec in module.tools_bundles()]
        entry = ModuleEntry(
            module.name,
            module.version,
            bundles,
            declared_seats=module.seat_names(),
            stateful=stateful_seats(placement),
            wanted_seats=wanted_seats(placement),
        )
        if old is not None:
            self.seats.release(old)
        self.table.modules[module.name] = entry
        self.sources[module.name] = str(placement.loaded.root)
        assert self._bundles_tg is not None, "add_module is called while the node serves"
        for bundle in bundles if prestarted is None else []:
            self._bundles_tg.start_soon(bundle.run)  # children start while the seats are looked at
        if claim_seats:
            await self._claim_seats(placement, old)
        await self.seats.own_tools(entry)
        self.table.rebuild()
        if old is not None:
            # The old version answers what it holds, then goes; new calls already wait for the new one.
            for bundle in old.bundles:
                await bundle.drain(self.config.drain_timeout_s)
                await bundle.stop()
                await bundle.finished.wait()
        await self.hosting.place(placement, self._bundles_tg)  # an old version's services stop first

    async def _steps_pass(self, placement: Placement) -> bool:
        """A module served from source at start: its steps ran (or had run); one that failed is named."""
        try:
            await self.hosting.run_steps(placement)
            return True
        except StepFailed as e:
            self.problems.append(str(e))
            return False

    async def _claim_seats(self, placement: Placement, old: ModuleEntry | None) -> None:
        entry = self.table.modules[placement.loaded.module.name]
        await self.seats.claim(placement, entry, old)
        self.table.rebuild()
        log.info(
            "module %s %s: %d tools bundles, seats held: %s",
            entry.name,
            entry.version,
            len(entry.bundles),
            entry.seats or "none",
        )

    def _runner(self, placement: Placement, spec: BundleManifest) -> BundleRunner:
        folder = data_dir(self.state_dir, placement.loaded.module.name)
        folder.mkdir(parents=True, exist_ok=True)
        if self.config.child_user:
            # Children run as another user: their data folder is theirs, nothing else of the node's.
            shutil.chown(folder, self.config.child_user, self.config.child_group)
        return BundleRunner(
            runner_spec(placement, spec, self.config, self.run_id),
            on_tools=self._tools_changed,
            reaper=self.reaper,
            on_progress=self._progress,
            on_state=self._bundle_state,
        )

    async def remove_module(self, name: str) -> None:
        entry = self.table.modules.get(name)
        if entry is None:
            return
        await self._unsubscribe(f"{TOOL_PREFIX}{name}.>")
        for seat in entry.seats:
            await self._unsubscribe(f"{SEAT_PREFIX}{seat}.>")
        self.seats.release(entry)
        await self.seats.close_keepers(name, keep=set())
        del self.table.modules[name]
        self.table.rebuild()
        for bundle in entry.bundles:
            await bundle.drain(self.config.drain_timeout_s)
            await bundle.stop()
            await bundle.finished.wait()
        await self.hosting.remove(name)
        self.sources.pop(name, None)

    def _delivery_report(self, module: str, problem: str | None) -> None:
        if problem is None:
            self.delivery_problems.pop(module, None)
        else:
            self.delivery_problems[module] = problem

    def _progress(self, bundle: BundleRunner, params: msgspec.Raw) -> None:
        if self.desk is not None:
            self.desk.progress(bundle, params)

    def _tools_changed(self, bundle: BundleRunner) -> None:
        self.table.rebuild()
        self._bundle_state(bundle)

    def _bundle_state(self, bundle: BundleRunner) -> None:
        self._served_changed(f"bundle {bundle.key} {bundle.state}")

    def _served_changed(self, reason: str) -> None:
        if self.notice is not None:
            self.notice.poke(reason)

    # --- subscriptions --------------------------------------------------------------------
    async def _subscribe(self, subject: str) -> None:
        assert self.nc is not None
        if subject in self._subs:
            return
        self._subs[subject] = await self.nc.subscribe(subject, queue=self.config.queue_group, cb=self._on_request)

    async def _unsubscribe(self, subject: str) -> None:
        sub = self._subs.pop(subject, None)
        if sub is not None:
            await sub.drain()

    async def _on_request(self, msg: Msg) -> None:
        # Each call is a task owned by the dispatcher: one slow tool blocks no other.
        self.dispatcher.start(msg)  # type: ignore[union-attr]

    async def _drain_subscriptions(self) -> None:
        for subject in list(self._subs):
            try:
                await self._unsubscribe(subject)
            except Exception as e:  # a broken connection cannot drain; the calls it held are gone with it
                log.warning("could not drain %s: %s", subject, e)

    # --- control: status and restart, over the bus ----------------------------------------
    async def _start_control(self) -> None:
        assert self.nc is not None
        base = f"mesh.node.{self.name}"
        self._control.append(await self.nc.subscribe(f"{base}.status", cb=self._on_status))
        self._control.append(await self.nc.subscribe(f"{base}.restart", cb=self._on_restart))
        self._control.append(await self.nc.subscribe(f"{base}.seat-move", cb=self.seats.on_move))

    def status(self) -> NodeStatus:
        bundles = [s for m in self.table.modules.values() for s in self._tools_statuses(m)] + self.hosting.statuses()
        return NodeStatus(
            node=self.name,
            url=self.url,
            pid=os.getpid(),
            uptime_s=round(time.monotonic() - self._started, 3),
            modules=[
                ModuleStatus(m.name, m.version, self.sources.get(m.name, "")) for m in self.table.modules.values()
            ],
            bundles=bundles,
            seats=list(self.seats.status.values()),
            problems=list(self.problems)
            + [f"delivery of {m}: {p}" for m, p in self.delivery_problems.items()]
            + self.table.problems(),
            in_flight=self.dispatcher.in_flight if self.dispatcher else 0,
            answered=self.dispatcher.answered if self.dispatcher else 0,
        )

    def _tools_statuses(self, entry: ModuleEntry) -> list[BundleStatus]:
        """Its tools bundles, `ready` only once its seats are decided here (runtime/seats/seats.py, shown_state)."""
        standing = self.seats.standing(entry)
        statuses = [b.status() for b in entry.bundles]
        for status in statuses:
            status.state = shown_state(status.state, standing)
        return statuses

    async def _on_status(self, msg: Msg) -> None:
        if msg.reply:
            await msg.respond(msgspec.json.encode(self.status()))

    async def _on_restart(self, msg: Msg) -> None:
        try:
            wanted = msgspec.json.decode(msg.data or b"{}").get("bundle", "")
        except (msgspec.DecodeError, AttributeError):
            wanted = ""
        runners: list[BundleRunner | Hosted] = [b for m in self.table.modules.values() for b in m.bundles]
        runners += self.hosting.all()
        matches = [
            b
            for b in runners
            if wanted in (b.key, b.key.split("/")[0])
            or (wanted and b.key.split("/")[1] == wanted and "/" not in wanted)
        ]
        if len(matches) != 1:
            known = [b.key for b in runners]
            reply: dict[str, Any] = {
                "ok": False,
                "error": f"bundle {wanted!r} "
                + ("is ambiguous" if matches else "is not on this node")
                + f"; bundles here: {', '.join(known) or 'none'}",
            }
        else:
            bundle = matches[0]
            was = bundle.state
            bundle.request_restart()
            log.warning("bundle %s restart requested by an operator (was %s)", bundle.key, was)
            reply = {"ok": True, "bundle": bundle.key, "was": was}
        if msg.reply:
            await msg.respond(msgspec.json.encode(reply))

    def _metadata(self) -> dict[str, str]:
        return {"node": self.name, "seats": ",".join(self.seats.held())}
