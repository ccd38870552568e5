"""What the host runs besides tools: a module's service bundles and, before them, its steps.

Service bundles (record 0188 point 3) run as systemd units where the node runs under systemd
and may write units (the unit from runtime/hosting/units.py, the generator `meshctl node units` uses),
else the node supervises them itself (launcher/service.py: the restart policy of a tools
bundle, minus MCP). The choice is made once, logged, and shown per bundle in status (`runs`).
Steps run once per version before the module's tools and services (runtime/hosting/steps.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Protocol

import anyio
import anyio.abc

from launcher.reaper import Reaper
from launcher.service import ServiceRunner, ServiceSpec
from launcher.status import BundleStatus, bundle_status
from launcher.supervise import describe_exit
from manifests import BundleManifest
from runtime.config import NodeConfig, ServicesConfig
from runtime.hosting.children import child_of
from runtime.hosting.placement import Placement, made_data_dir
from runtime.hosting.steps import run_steps
from runtime.hosting.units import build_services, service_unit, unit_name

log = logging.getLogger("mesh.hosting")

POLL_S = 2.0  # how often a unit's state is read for status


@dataclass(frozen=True)
class HostChoice:
    runs: str  # "systemd" | "node"
    reason: str


def choose_host(
    services: ServicesConfig, *, systemd_dir: str = "/run/systemd/system", environ: Mapping[str, str] | None = None
) -> HostChoice:
    """systemd when the node itself runs under it (systemd booted the machine: /run/systemd/system
    exists; and started the node: INVOCATION_ID is set, as systemd sets it for every unit),
    systemctl is there and the unit folder may be written; else the node. A node started by
    hand on a systemd machine keeps its services as its own children: it does not put units
    into the machine's configuration. `host` in [services] forces one."""
    env = os.environ if environ is None else environ
    if services.host == "node":
        return HostChoice("node", "[services] host = node")
    booted = os.path.isdir(systemd_dir)
    systemctl = shutil.which("systemctl")
    why = ""
    if not booted:
        why = "systemd does not run this machine (no /run/systemd/system)"
    elif services.host == "auto" and not env.get("INVOCATION_ID"):
        why = "the node was not started by systemd (no INVOCATION_ID)"
    elif not systemctl:
        why = "systemctl is not installed"
    elif not os.access(services.unit_dir, os.W_OK):
        why = f"{services.unit_dir} cannot be written by this node"
    if not why:
        return HostChoice("systemd", f"systemd runs this node; units go to {services.unit_dir}")
    if services.host == "systemd":
        return HostChoice("systemd", f"[services] host = systemd, but {why}: their units will fail, named")
    return HostChoice("node", why)


class Hosted(Protocol):
    """A running service bundle, whoever runs it."""

    key: str
    state: str
    finished: asyncio.Event

    async def run(self) -> None: ...
    async def stop(self) -> None: ...
    def request_restart(self) -> None: ...
    def status(self) -> BundleStatus: ...


class SystemdService:
    """A service bundle run by systemd: the node writes its unit, starts it, reads its state,
    stops it, and removes the unit with the module."""

    def __init__(self, placement: Placement, spec: BundleManifest, config: NodeConfig) -> None:
        module = placement.loaded.module
        self.placement, self.spec, self.config = placement, spec, config
        self.key = f"{module.name}/{spec.name}"
        self.unit = unit_name(module.name, spec.name)
        self.path = Path(config.services.unit_dir) / self.unit
        self.state = "starting"
        self.pid: int | None = None
        self.restarts = 0
        self.last_exit: str | None = None
        self.last_error: str | None = None
        self.remove_unit = True  # false on an upgrade that keeps a bundle of this name
        self.finished = asyncio.Event()
        self._stopping = False
        self._restart_wanted = False
        self._wake = asyncio.Event()  # stop or an operator's restart

    async def run(self) -> None:
        try:
            try:
                await self._install()
            except Exception as e:  # no build, no unit, systemctl refused: this service's failure, not the node's
                self.state, self.last_error = "failed", str(e)
                log.error("service %s: %s", self.key, e)
                while not self._stopping:
                    self._wake.clear()
                    await self._wake.wait()
                return
            while not self._stopping:
                if self._restart_wanted:
                    self._restart_wanted = False
                    await self._systemctl("restart", self.unit, check=False)
                await self._read_state()
                self._wake.clear()
                with anyio.move_on_after(POLL_S):
                    await self._wake.wait()
        finally:
            with anyio.CancelScope(shield=True):
                await self._systemctl("stop", self.unit, check=False)
                if self.remove_unit:
                    self.path.unlink(missing_ok=True)
                    await self._systemctl("daemon-reload", check=False)
                self.state, self.pid = "stopped", None
                self.finished.set()

    def unit_text(self) -> str:
        """The unit, as `meshctl node units` writes it; a compiled service from source is built
        first. Blocking: run() calls it in a worker thread."""
        placement = self.placement
        if placement.from_source:  # a delivered bundle is built already: its artifact is the build
            placement = build_services(placement, self.config.state_dir, log.info, self.config.build_cache)
        made_data_dir(
            self.config.state_dir, placement.loaded.module.name, self.config.child_user, self.config.child_group
        )
        return service_unit(
            placement,
            self.spec.name,
            node=self.config.name,
            state_dir=Path(self.config.state_dir),
            user=self.config.child_user,
        )

    async def _install(self) -> None:
        text = await anyio.to_thread.run_sync(self.unit_text)
        tmp = self.path.with_name(f".{self.unit}.tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(self.path)
        await self._systemctl("daemon-reload")
        await self._systemctl("restart", self.unit)  # restart: an upgrade's unit replaces the running one
        log.info("service %s: unit %s written and started (run by systemd)", self.key, self.path)

    async def _read_state(self) -> None:
        done = await self._systemctl(
            "show", self.unit, "-p", "ActiveState,SubState,MainPID,NRestarts,ExecMainStatus,ExecMainCode", check=False
        )
        props = dict(line.split("=", 1) for line in done.splitlines() if "=" in line)
        self.state = {"active": "running", "activating": "starting", "failed": "failed"}.get(
            props.get("ActiveState", ""), props.get("ActiveState", "unknown")
        )
        pid = int(props.get("MainPID", "0") or 0)
        self.pid = pid or None
        self.restarts = int(props.get("NRestarts", "0") or 0)
        # ExecMainCode is the siginfo code of the main process's last end: 1 exited, 2 killed,
        # 3 dumped core (ExecMainStatus then holds the signal); 0 while it has not ended yet.
        code, value = props.get("ExecMainCode", "0"), props.get("ExecMainStatus", "0")
        if code in ("1", "2", "3") and value.isdigit():
            self.last_exit = describe_exit(int(value) if code == "1" else -int(value))

    async def _systemctl(self, *args: str, check: bool = True) -> str:
        done = await anyio.run_process(["systemctl", *args], check=False)
        out = done.stdout.decode(errors="replace")
        if check and done.returncode != 0:
            raise RuntimeError(
                f"systemctl {' '.join(args)} failed (exit {done.returncode}): "
                f"{done.stderr.decode(errors='replace').strip()[-400:]}"
            )
        return out

    async def stop(self) -> None:
        self._stopping = True
        self._wake.set()

    def request_restart(self) -> None:
        self._restart_wanted = True  # done by run(), which owns the unit
        self._wake.set()

    def status(self) -> BundleStatus:
        module = self.placement.loaded.module.name
        # No stderr tail: it is in the journal (journalctl -u <unit>).
        return bundle_status(self, module, self.spec.name, self.spec.language, [], kind="service", runs="systemd")


class ServiceHost:
    """The service bundles of the node's modules, and the steps that come before them."""

    def __init__(self, config: NodeConfig, run_id: str, reaper: Reaper | None) -> None:
        self.config, self.run_id, self.reaper = config, run_id, reaper
        self.choice = choose_host(config.services)
        self.modules: dict[str, list[Hosted]] = {}
        self._said = False
        self._steps_done: set[tuple[str, str, tuple[str, ...]]] = set()  # placements whose steps passed in this run

    async def run_steps(self, placement: Placement, always: bool = False) -> list[str]:
        """The version's steps not yet run; StepFailed refuses the version (nothing was touched).

        Delivery runs them before it replaces the running version, and the node again when it
        places it: the second time is a no-op, without even a look at the records. `always`: a
        stateful module taking its seat here, whose store may come from another node, runs them again."""
        module = placement.loaded.module
        key = (module.name, module.version, tuple(str(placement.dirs[b.name]) for b in module.step_bundles()))
        if key in self._steps_done and not always:
            return []
        ran = await run_steps(placement, self.config, self.run_id, self.reaper, always=always)
        self._steps_done.add(key)
        return ran

    async def place(self, placement: Placement, tg: anyio.abc.TaskGroup) -> None:
        """Start the module's services; those of a version it replaces stop first."""
        module = placement.loaded.module
        specs = module.service_bundles()
        if specs and not self._said:
            log.info("service bundles run by %s: %s", self.choice.runs, self.choice.reason)
            self._said = True
        await self._stop_module(module.name, keep_units={s.name for s in specs})
        hosted = [self._hosted(placement, spec) for spec in specs]
        if hosted:
            self.modules[module.name] = hosted
        for h in hosted:
            tg.start_soon(h.run)

    def _hosted(self, placement: Placement, spec: BundleManifest) -> Hosted:
        if self.choice.runs == "systemd":
            return SystemdService(placement, spec, self.config)
        module = placement.loaded.module.name
        made_data_dir(self.config.state_dir, module, self.config.child_user, self.config.child_group)
        child, prepare = child_of(placement, spec, self.config, self.run_id)
        service = ServiceSpec(
            module, spec.name, spec.language, child, self.config.restart, self.config.health.stop_grace_s, prepare
        )
        return ServiceRunner(service, reaper=self.reaper)

    async def remove(self, module: str) -> None:
        await self._stop_module(module, keep_units=set())

    async def stop_all(self) -> None:
        for name in list(self.modules):
            await self._stop_module(name, keep_units=None)

    async def _stop_module(self, module: str, keep_units: set[str] | None) -> None:
        """Stop a module's services and wait until they are gone. A unit is removed unless its
        bundle is in `keep_units` (an upgrade) or the node is only stopping (None)."""
        for h in self.modules.get(module, []):  # listed in status until they are gone
            if isinstance(h, SystemdService):
                h.remove_unit = keep_units is not None and h.spec.name not in keep_units
            await h.stop()
            await h.finished.wait()
        self.modules.pop(module, None)

    def statuses(self) -> list[BundleStatus]:
        return [h.status() for hosted in self.modules.values() for h in hosted]

    def all(self) -> list[Hosted]:
        return [h for hosted in self.modules.values() for h in hosted]
