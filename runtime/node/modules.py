"""The modules a node serves, with one owner: add, upgrade in place, remove; the one place routes change.

Runners tell it of their states, tool lists and children's progress (`RunnerEvents`), the seats
ask it to serve and unserve their subjects (`SeatsHost`), the reconciler brings it delivered
modules (`Members`): each through its seam, none by calling back into the node.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import anyio.abc
import msgspec
from nats.aio.client import Client

from launcher.bundle import BundleRunner, RunnerEvents
from launcher.reaper import Reaper
from launcher.session import Session
from launcher.status import BundleStatus
from manifests import BundleManifest
from runtime.bus.service_api import ServiceApi
from runtime.calls.desk import CallDesk
from runtime.calls.routes import ModuleEntry, RouteTable
from runtime.config import NatsConfig, NodeConfig
from runtime.hosting.children import runner_spec
from runtime.hosting.placement import Placement, made_data_dir
from runtime.hosting.services import ServiceHost
from runtime.hosting.steps import StepFailed
from runtime.node.changes import ChangeNotice
from runtime.seats.seats import Seats, shown_state, stateful_seats, wanted_seats
from runtime.wire.subjects import module_subjects, seat_subjects

log = logging.getLogger("mesh.node")


@dataclass(frozen=True)
class Wiring:
    """What the module host needs of the bus, all at once when it answers."""

    nc: Client
    service: ServiceApi  # the subscriptions requests come on
    desk: CallDesk  # where a child's progress goes to its caller
    notice: ChangeNotice  # mesh.events.tools
    bus: NatsConfig | None = None  # the bus as the node reached it (a replicated seat's Litestream too)


class ModuleHost(RunnerEvents):
    """Every module of one node: its tools runners, services, steps and seats."""

    def __init__(self, config: NodeConfig, run_id: str, reaper: Reaper, tg: anyio.abc.TaskGroup) -> None:
        self.config = config
        self.state_dir = Path(config.state_dir)
        self.run_id, self.reaper = run_id, reaper
        self.table = RouteTable(config.name)
        self.hosting = ServiceHost(config, run_id, reaper)  # service and step bundles
        self.seats = Seats(config.name, config, self.table, run_id, host=self)
        self.sources: dict[str, str] = {}
        self.problems: list[str] = []  # modules refused at start (a step failed)
        self.sandbox = ""  # what the children are confined with (runtime/hosting/confine.py), for status
        self.delivery_problems: dict[str, str] = {}
        self._prestarted: dict[str, list[BundleRunner]] = {}  # started before the bus answered
        # A stateful module's tools runners start only where its seats are held (no store elsewhere):
        # the placements to start them from, and the runners running.
        self._placements: dict[str, Placement] = {}
        self._running: set[BundleRunner] = set()
        self.table.started = self.started
        self._tg = tg  # the node's task group: every runner's `run` is owned by it
        self._wiring: Wiring | None = None  # none until the bus answers: nothing is served before

    def wire(self, wiring: Wiring) -> None:
        """The bus answers: subjects can be served, progress and changes told, seats claimed."""
        self._wiring = wiring
        self.seats.serve(wiring.nc, wiring.service.id, self._tg, wiring.bus)

    # --- runners' events (RunnerEvents) --------------------------------------------------------
    def state_changed(self, runner: BundleRunner) -> None:
        self.served_changed(f"bundle {runner.key} {runner.state}")

    def tools_changed(self, runner: BundleRunner) -> None:
        self.rebuild()
        self.state_changed(runner)

    def progress(self, runner: BundleRunner, params: msgspec.Raw) -> None:
        if self._wiring is not None:
            self._wiring.desk.progress(runner, params)

    def ask(self, runner: BundleRunner, session: Session, rid: int | str, method: str, params: msgspec.Raw) -> bool:
        return self._wiring is not None and self._wiring.desk.ask(runner, session, rid, method, params)

    # --- the seats' host (SeatsHost) -----------------------------------------------------------
    async def serve(self, subject: str) -> None:
        assert self._wiring is not None, "subjects are served only once the bus answers"
        await self._wiring.service.serve(subject)

    async def unserve(self, subject: str) -> None:
        if self._wiring is not None:
            await self._wiring.service.unserve(subject)

    def rebuild(self) -> None:
        self.table.rebuild()

    def served_changed(self, reason: str) -> None:
        if self._wiring is not None:
            self._wiring.notice.poke(reason)

    # --- modules -------------------------------------------------------------------------------
    async def steps_pass(self, placement: Placement) -> bool:
        """A module served from source at start: its steps ran (or had run); one that failed is named.
        A stateful module's steps wait until its seats are held here (`start_module`)."""
        if stateful_seats(placement):
            return True
        try:
            await self.hosting.run_steps(placement)
            return True
        except StepFailed as e:
            self.problems.append(str(e))
            return False

    def prestart(self, placement: Placement) -> None:
        """Start a module's tools children before the bus answers: a bus that is down delays calls, not starts."""
        module = placement.loaded.module
        if stateful_seats(placement):
            return  # its children start where its seats are held
        bundles = [self._runner(placement, spec) for spec in module.tools_bundles()]
        self._prestarted[module.name] = bundles
        for bundle in bundles:
            self._start_runner(bundle)

    async def add_module(self, placement: Placement, claim_seats: bool = True) -> None:
        """Serve a module; a module already served is upgraded in place, its calls ridden over.

        Its steps run first: StepFailed refuses the version before anything is touched."""
        module = placement.loaded.module
        stateful = bool(stateful_seats(placement))
        old = self.table.modules.get(module.name)
        # A stateful module held here is upgraded with its steps and children at once; elsewhere
        # they wait for the seats (`start_module`).
        start_now = not stateful or (old is not None and self._holds_all(old))
        if start_now:
            await self.hosting.run_steps(placement)
        self._placements[module.name] = placement
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
        for bundle in bundles if prestarted is None and start_now else []:
            self._start_runner(bundle)  # children start while the seats are looked at
        if claim_seats:
            await self.claim_seats(placement, old)
        await self.seats.own_tools(entry)
        self.rebuild()
        if old is not None:
            # The old version answers what it holds, then goes; new calls already wait for the new one.
            for bundle in old.bundles:
                await self._stop(bundle)
        await self.hosting.place(placement, self._tg)  # an old version's services stop first

    def _start_runner(self, bundle: BundleRunner) -> None:
        self._running.add(bundle)
        self._tg.start_soon(bundle.run)

    def started(self, bundle: object) -> bool:
        return bundle in self._running

    def _holds_all(self, entry: ModuleEntry) -> bool:
        return bool(entry.stateful) and all(seat in entry.seats for seat in entry.stateful)

    async def start_module(self, module: str) -> None:
        """A stateful module's seat is about to be held here: its steps, then its tools children, ready."""
        entry, placement = self.table.modules.get(module), self._placements.get(module)
        if entry is None or placement is None:
            return
        if any(b in self._running for b in entry.bundles):
            return  # already started (another of its seats)
        await self.hosting.run_steps(placement, always=True)  # the store may be new here: migrate it
        entry.bundles = [self._runner(placement, spec) for spec in placement.loaded.module.tools_bundles()]
        for bundle in entry.bundles:
            self._start_runner(bundle)
        with anyio.move_on_after(self.config.health.init_timeout_s * 2):
            while not all(b.state in ("ready", "failed") for b in entry.bundles):
                await anyio.sleep(0.02)
        self.rebuild()

    async def stop_module(self, module: str) -> None:
        """Its seat is not held here (lost, never got, stopped): its children stop now."""
        entry = self.table.modules.get(module)
        if entry is None:
            return
        running = [b for b in entry.bundles if b in self._running]
        for bundle in running:
            await bundle.stop()
        for bundle in running:
            with anyio.move_on_after(self.config.health.stop_grace_s + 5):
                await bundle.finished.wait()
            self._running.discard(bundle)
        self.rebuild()

    async def claim_seats(self, placement: Placement, old: ModuleEntry | None) -> None:
        entry = self.table.modules[placement.loaded.module.name]
        await self.seats.claim(placement, entry, old)
        self.rebuild()
        log.info(
            "module %s %s: %d tools bundles, seats held: %s",
            entry.name,
            entry.version,
            len(entry.bundles),
            entry.seats or "none",
        )

    async def remove_module(self, name: str) -> None:
        entry = self.table.modules.get(name)
        if entry is None:
            return
        await self.unserve(module_subjects(name))
        for seat in entry.seats:
            await self.unserve(seat_subjects(seat))
        self.seats.release(entry)
        await self.seats.close_keepers(name, keep=set())
        del self.table.modules[name]
        self.rebuild()
        for bundle in entry.bundles:
            await self._stop(bundle)
        self._placements.pop(name, None)
        await self.hosting.remove(name)
        self.sources.pop(name, None)

    def delivery_report(self, module: str, problem: str | None) -> None:
        if problem is None:
            self.delivery_problems.pop(module, None)
        else:
            self.delivery_problems[module] = problem

    def _runner(self, placement: Placement, spec: BundleManifest) -> BundleRunner:
        # Children run as another user: their data folder is theirs, nothing else of the node's. A
        # stateful module's folder is made by its seat's store, only where the seat is held.
        if not stateful_seats(placement):
            made_data_dir(self.state_dir, placement.loaded.module.name, self.config.child_user, self.config.child_group)
        return BundleRunner(runner_spec(placement, spec, self.config, self.run_id), events=self, reaper=self.reaper)

    async def _stop(self, bundle: BundleRunner) -> None:
        if bundle not in self._running:
            await bundle.stop()  # never started (a stateful module on standby): nothing to wait for
            return
        await bundle.drain(self.config.drain_timeout_s)
        await bundle.stop()
        await bundle.finished.wait()
        self._running.discard(bundle)

    # --- what it shows ---------------------------------------------------------------------------
    def runners(self) -> list[BundleRunner]:
        return [b for m in self.table.modules.values() for b in m.bundles]

    def bundle_statuses(self) -> list[BundleStatus]:
        """Every tools bundle (`ready` only once its seats are decided here: `shown_state`), then the services."""
        statuses = []
        for entry in self.table.modules.values():
            standing = self.seats.standing(entry)
            for bundle in entry.bundles:
                status = bundle.status()
                # Not started: a stateful module whose seat is not held here runs no child.
                status.state = shown_state(status.state if bundle in self._running else "ready", standing)
                statuses.append(status)
        return statuses + self.hosting.statuses()

    def all_problems(self) -> list[str]:
        return (
            list(self.problems)
            + [f"delivery of {m}: {p}" for m, p in self.delivery_problems.items()]
            + self.table.problems()
        )

    async def stop_all(self) -> None:
        """Every child stopped, the ones started before the bus answered too (a stop, shielded by the caller)."""
        for bundle in self.runners() + [b for bs in self._prestarted.values() for b in bs]:
            await bundle.stop()
        await self.hosting.stop_all()
