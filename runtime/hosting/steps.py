"""Step bundles: run once per version of their module, before its tools and services start.

A step (a schema migration, a data import) runs to completion with the environment of any
other child of the module (MESH_DATA_DIR included) and the manifest's `timeout_ms` as its
bound. Exit 0 lets the version proceed and is recorded in the node's state folder
(`<state>/steps/<module>/<bundle>@<version>.json`), so a node restart does not run it again
for the same version and the same bundle bytes. Anything else refuses the version, naming the
step, its exit and the tail of its output; the version that ran before keeps serving.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import msgspec

from launcher.reaper import Reaper
from launcher.step import run_step
from manifests import BundleManifest
from runtime.config import NodeConfig
from runtime.hosting.children import child_of
from runtime.hosting.placement import Placement, made_data_dir

log = logging.getLogger("mesh.step")

TAIL_SHOWN = 5  # output lines named in the refusal; status and the log keep the whole tail


class StepFailed(Exception):
    """A step of a module's version did not succeed: the version is refused."""

    def __init__(self, module: str, version: str, bundle: str, exit: str, tail: list[str]) -> None:
        self.module, self.version, self.bundle, self.exit, self.tail = module, version, bundle, exit, tail
        said = " | ".join(line.strip() for line in tail[-TAIL_SHOWN:] if line.strip()) or "nothing"
        super().__init__(
            f"step {module}/{bundle} of {module} {version} failed: {exit}; its last output: {said}; "
            f"the version is not started (fix the step, then deliver a new version or restart the node)"
        )


class StepRecord(msgspec.Struct, frozen=True):
    module: str
    bundle: str
    version: str
    folder: str  # the bundle folder it ran from: a new artifact of the same version runs again
    finished_at: float
    seconds: float


def record_path(state_dir: Path | str, module: str, bundle: str, version: str) -> Path:
    # Module and bundle are [a-z][a-z0-9-]*; a version is [0-9A-Za-z.+_-]+: no separator in the name.
    return Path(state_dir) / "steps" / module / f"{bundle}@{version}.json"


def _done(path: Path, folder: str) -> bool:
    try:
        record = msgspec.json.decode(path.read_bytes(), type=StepRecord)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return False
    return record.folder == folder


async def run_steps(
    placement: Placement, config: NodeConfig, run_id: str, reaper: Reaper | None, always: bool = False
) -> list[str]:
    """Run the placement's steps that have not succeeded for this version (`always`: every one);
    the ones run, in manifest order. StepFailed at the first that fails (the later ones do not run)."""
    module = placement.loaded.module
    ran: list[str] = []
    for spec in module.step_bundles():
        folder = str(placement.dirs[spec.name])
        record = record_path(config.state_dir, module.name, spec.name, module.version)
        if not always and _done(record, folder):
            log.info("step %s/%s of %s %s ran already; not again", module.name, spec.name, module.name, module.version)
            continue
        await _run_one(placement, spec, config, run_id, reaper, record, folder)
        ran.append(spec.name)
    return ran


async def _run_one(
    placement: Placement,
    spec: BundleManifest,
    config: NodeConfig,
    run_id: str,
    reaper: Reaper | None,
    record: Path,
    folder: str,
) -> None:
    module = placement.loaded.module
    made_data_dir(config.state_dir, module.name, config.child_user, config.child_group)
    child, prepare = child_of(placement, spec, config, run_id)
    if prepare is not None:
        try:
            child = await prepare()
        except Exception as e:  # a build's failure refuses the version like the step's own
            raise StepFailed(module.name, module.version, spec.name, f"could not be built: {e}", []) from e
    timeout_s = spec.timeout_ms / 1000
    log.info(
        "step %s/%s of %s %s: running (at most %g s)", module.name, spec.name, module.name, module.version, timeout_s
    )
    outcome = await run_step(
        module.name, spec.name, child, timeout_s, reaper=reaper, stop_grace_s=config.health.stop_grace_s
    )
    if not outcome.ok:
        failed = StepFailed(module.name, module.version, spec.name, outcome.exit, outcome.output_tail)
        log.error("%s", failed)
        raise failed
    record.parent.mkdir(parents=True, exist_ok=True)
    tmp = record.with_name(record.name + ".tmp")
    done = StepRecord(module.name, spec.name, module.version, folder, time.time(), outcome.seconds)
    tmp.write_bytes(msgspec.json.encode(done))
    tmp.replace(record)  # a crash mid-write leaves no record: the step runs again, as it must
    log.info(
        "step %s/%s of %s %s: done in %.2f s", module.name, spec.name, module.name, module.version, outcome.seconds
    )
