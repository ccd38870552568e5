"""A service bundle the node runs itself: a plain process, supervised like a tools bundle minus MCP.

Where the host has no systemd the node is the service's supervisor (record 0188 point 3 says
the host runs it; here the node is that host). The child gets the same process group, parent-
death signal, reaper, cgroup of its own and restart policy as a tools child (launcher/supervise.py); it speaks no
protocol: up is "running", its stdout and stderr lines are its log, and a stop is SIGTERM to
its group, then SIGKILL after `stop_grace_s`.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Awaitable, Callable

import anyio

from .process import ChildSpec
from .reaper import Reaper
from .restart import RestartPolicy
from .status import BundleStatus, bundle_status
from .supervise import Supervised

log = logging.getLogger("mesh.bundle")


@dataclass(frozen=True)
class ServiceSpec:
    module: str
    name: str
    language: str
    child: ChildSpec
    restart: RestartPolicy = RestartPolicy()
    stop_grace_s: float = 2.0
    # Builds the bundle before its first start (compiled code served from source).
    prepare: Callable[[], Awaitable[ChildSpec]] | None = None

    @property
    def key(self) -> str:
        return f"{self.module}/{self.name}"


class ServiceRunner(Supervised):
    """One service process, started again when it ends, until stopped."""

    def __init__(self, spec: ServiceSpec, reaper: Reaper | None = None) -> None:
        super().__init__(spec.module, spec.name, spec.restart, spec.child, spec.prepare, reaper)
        self.spec = spec

    def status(self) -> BundleStatus:
        return bundle_status(
            self,
            self.spec.module,
            self.spec.name,
            self.spec.language,
            list(self.stderr_tail),
            kind="service",
            confinement=self.confinement,
        )

    async def _run_once(self) -> float | None:
        child = await self._spawn(self._stderr_line)  # stdout is log too: nobody reads it as protocol
        if child is None:
            return None
        child.close_stdin()  # the node writes nothing to a service: it reads end of file, as from /dev/null
        up_since = asyncio.get_running_loop().time()
        self._set_state("running")
        log.info(
            "service %s running: pid %d (supervised by the node); confinement: %s",
            self.key,
            child.pid,
            child.confinement,
        )
        try:
            async with anyio.create_task_group() as tg:
                self._watch(tg, child)  # until it exits, or a stop or an operator's restart
                await anyio.sleep_forever()
        finally:
            with anyio.CancelScope(shield=True):
                if child.running:
                    status = await child.stop(self.spec.stop_grace_s, ask_first=False)
                else:
                    status = await child.wait()
                ended_by_itself = not (self._stopping or self._restart_requested)
                self._forget_child(child, status)
                if ended_by_itself:
                    await self._last_words(child)  # why it ended, when it said so
        return up_since
