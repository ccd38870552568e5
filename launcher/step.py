"""A step bundle's one run: a process that runs to completion (a schema migration, a data
import), bounded by a timeout, in the same process group, with the same parent-death signal
and reaper as every other child, its output kept as a tail for the error that names it.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import logging

import anyio
import msgspec

from .cgroup import kill as kill_cgroup
from .cgroup import remove as remove_cgroup
from .logbudget import LogBudget
from .process import ChildProcess, ChildSpec
from .reaper import Reaper, kill_marked
from .sandbox import SandboxUnavailable
from .supervise import STDERR_TAIL, describe_exit

log = logging.getLogger("mesh.step")
_STEP_SERIAL = itertools.count(1)


class StepOutcome(msgspec.Struct, frozen=True):
    ok: bool
    exit: str  # "exit code 0", "killed by SIGKILL", "timed out after 30 s", "did not start: ..."
    seconds: float
    output_tail: list[str]  # its last lines, stdout and stderr as they came
    confinement: str = ""  # what it ran with (launcher/sandbox.py describe)


async def run_step(
    module: str,
    bundle: str,
    child_spec: ChildSpec,
    timeout_s: float,
    *,
    reaper: Reaper | None = None,
    stop_grace_s: float = 2.0,
) -> StepOutcome:
    """Run the step once; never raises for anything the step does."""
    key = f"{module}/{bundle}"
    tail: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL)
    budget = LogBudget(key, "output lines")
    cgroups = reaper.cgroups if reaper is not None else None
    if cgroups is not None and child_spec.cgroup is None:
        # A cgroup of its own, like every child: what it started cannot outlive it.
        child_spec = dataclasses.replace(child_spec, cgroup=cgroups.for_bundle(f"{key}.step.{next(_STEP_SERIAL)}"))

    def line(data: bytes) -> None:
        text = data.decode("utf-8", "replace").rstrip("\r")
        tail.append(text)
        if budget.take():
            log.info("[%s] %s", key, text)

    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        child = await ChildProcess.spawn(child_spec, line, line)
    except SandboxUnavailable as e:
        return StepOutcome(False, f"did not start: {child_spec.argv[0]}: {e}", 0.0, [], f"refused: {e.reason}")
    except OSError as e:
        return StepOutcome(False, f"did not start: {child_spec.argv[0]}: {e.strerror or e}", 0.0, [])
    if reaper is not None:
        reaper.register(child.pid)
    child.close_stdin()  # a step reads nothing from the node
    timed_out = False
    try:
        with anyio.move_on_after(timeout_s):
            status = await child.wait()
        if child.running:
            timed_out = True
            status = await child.stop(stop_grace_s, ask_first=False)
        with anyio.move_on_after(0.5):
            await asyncio.shield(child.stderr_closed)  # its last words are read before they are named
    finally:
        with anyio.CancelScope(shield=True):
            if child.running:
                await child.stop(stop_grace_s, ask_first=False)
            child.close()
            if reaper is not None:
                reaper.unregister(child.pid)
                if child_spec.cgroup:
                    kill_cgroup(child_spec.cgroup)
                    remove_cgroup(child_spec.cgroup)  # if still busy, the node's stop removes it
                kill_marked(
                    reaper.marker, (f"MESH_MODULE={module}", f"MESH_BUNDLE={bundle}")
                )  # nothing it started outlives it
    seconds = round(loop.time() - started, 3)
    if timed_out:
        return StepOutcome(False, f"timed out after {timeout_s:g} s (killed)", seconds, list(tail), child.confinement)
    return StepOutcome(status == 0, describe_exit(status), seconds, list(tail), child.confinement)
