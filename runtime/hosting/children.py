"""The child of any bundle, whatever its kind (tools, service, step): one environment contract.

The node's tools runners, its services, its steps and the unit generator all start from
`child_of`; `runner_spec` adds what a tools runner needs beside the child.
"""

from __future__ import annotations

import logging
from typing import Awaitable, Callable

from launcher.bundle import RunnerSpec
from launcher.env import EntryNotFound, child_env, resolve_argv
from launcher.process import ChildSpec
from launcher.reaper import MARKER_VAR
from manifests import BundleManifest
from manifests.imported import is_package_bundle
from runtime.config import NodeConfig
from runtime.hosting.confine import confinement_of
from runtime.hosting.from_source import preparer
from runtime.hosting.placement import RUN_FROM_SOURCE, Placement, data_dir
from runtime.hosting.secrets import SecretsError, bundle_secrets
from runtime.wire.identity import LOCAL_PERSON_VAR, os_person

log = logging.getLogger("mesh.node")


def child_of(
    placement: Placement, spec: BundleManifest, config: NodeConfig, run_id: str
) -> tuple[ChildSpec, Callable[[], Awaitable[ChildSpec]] | None]:
    """What the node runs for one bundle of a placement, whatever its kind: the child (argv,
    folder, environment, user, confinement) and, for compiled code served from source, the build that
    gives the child to run. One environment contract for tools, service and step bundles.

    `config` is the node's, finished (name and state folder set); `run_id` marks every child of
    this run of the node, so the reaper finds what a child leaves behind.
    """
    module = placement.loaded.module
    bundle_dir = placement.dirs[spec.name]
    # An imported package is built from its lock even in a language otherwise run from source.
    built_first = placement.from_source and (
        spec.language not in RUN_FROM_SOURCE or is_package_bundle(placement.loaded.source_dir(spec))
    )
    try:
        argv = resolve_argv(spec.entry, bundle_dir)
    except EntryNotFound as e:
        # Keep the unresolved path: the start fails, is retried and ends `failed`, named.
        if not built_first:  # a bundle built first finds its entry in the build
            log.error("bundle %s/%s: %s", module.name, spec.name, e)
        argv = [str(bundle_dir / spec.entry[0]), *spec.entry[1:]]
    env = child_env(
        node=config.name,
        module=module.name,
        bundle=spec.name,
        bundle_dir=bundle_dir,
        data_dir=data_dir(config.state_dir, module.name),
        manifest_env=spec.env,
        pass_env=spec.pass_env,
        build_env=placement.build_env.get(spec.name),
        child_user=config.child_user,
        secrets=_secrets(config, module.name, spec.name),
    )
    env[MARKER_VAR] = run_id
    # Who the node's own OS user is as a person: what a console on this machine passes for the
    # operator (a module that trusts the local caller may trust that person through a console).
    env[LOCAL_PERSON_VAR] = os_person().id
    # Confined by default, whatever the bundle: its folder, its data, a private TMPDIR, the system.
    confinement = confinement_of(spec, module.name, bundle_dir, argv, config)
    child = ChildSpec(
        argv=argv,
        cwd=str(bundle_dir),
        env=env,
        user=config.child_user,
        group=config.child_group,
        confinement=confinement,
    )
    prepare = preparer(placement.loaded, spec, config.state_dir, child, config.build_cache) if built_first else None
    return child, prepare


def runner_spec(placement: Placement, spec: BundleManifest, config: NodeConfig, run_id: str) -> RunnerSpec:
    """How the node runs one tools bundle of a placement: its child, timeouts and policies."""
    child, prepare = child_of(placement, spec, config, run_id)
    return RunnerSpec(
        module=placement.loaded.module.name,
        name=spec.name,
        language=spec.language,
        child=child,
        timeout_ms=spec.timeout_ms,
        max_in_flight=spec.max_in_flight,
        restart=config.restart,
        health=config.health,
        prepare=prepare,
    )


def _secrets(config: NodeConfig, module: str, bundle: str) -> dict[str, str]:
    if not config.secrets:
        return {}
    try:
        found = bundle_secrets(config.secrets, module, bundle)
    except SecretsError as e:
        log.error("bundle %s/%s: %s", module, bundle, e)
        return {}
    if found:  # names only: a value is never logged
        log.info("bundle %s/%s: secrets %s from %s", module, bundle, ", ".join(sorted(found)), config.secrets)
    return found
