"""Delivery, the node's side: artifacts in a JetStream object store, each node's membership in a KV bucket.

`meshctl bundle deliver` (runtime/meshctl/deliver.py) puts artifacts into the object store `mesh-bundles` and writes the
node's membership (modules, versions, seats, artifacts) under the key `node.<name>` of the KV
bucket `mesh-membership`. Each node watches its key; on a change it fetches what it lacks,
verifies every hash, unpacks, and starts, upgrades or stops modules without touching the
others. A redelivered identical version changes nothing.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Protocol

import anyio
import msgspec
from nats.aio.client import Client

from manifests import ManifestError
from manifests.load import name_problem, shown, version_problem
from runtime.delivery.fetch import fetch
from runtime.hosting.placement import Placement
from runtime.hosting.steps import StepFailed
from runtime.wire.membership import (
    KV_BUCKET,
    DeliveryError,
    Membership,
    ModuleRef,
    buckets,
    decode_membership,
    module_label,
    node_key,
    ref_problems,
)
from toolchains.artifact import ArtifactError, ArtifactLimits

log = logging.getLogger("mesh.delivery")


class Members(Protocol):
    """What the reconciler asks of the node: the one owner of its modules (runtime/node/modules.py)."""

    async def add_module(self, placement: Placement) -> None:
        """Serve a module, or upgrade it in place."""

    async def remove_module(self, name: str) -> None:
        """Stop serving a module; the others are not touched."""

    def delivery_report(self, module: str, problem: str | None) -> None:
        """A delivered version refused (said in status), or no longer (None)."""


class Reconciler:
    """Watches one node's membership key and brings the node's modules in line with it.

    Every entry is checked (`ref_problems`) before any of it is used, and whatever goes wrong
    with one module is that module's refusal: an ERROR line once and a status problem, while the
    version that runs keeps running and the other modules are untouched."""

    def __init__(
        self,
        nc: Client,
        node: str,
        state_dir: Path,
        members: Members,
        limits: ArtifactLimits | None = None,
    ) -> None:
        self.nc, self.node, self.state_dir = nc, node, state_dir
        self.members = members
        self.limits = limits or ArtifactLimits()
        self.current: dict[str, ModuleRef] = {}
        # Versions refused, as they were asked for: the same entry again is not fetched or logged again.
        self.refused: dict[str, ModuleRef | bytes] = {}
        # (module, result) -> count, for /metrics: added, upgraded, removed, refused. A name that is
        # not one (a hostile entry) counts as "(invalid)", so a writer cannot grow the series.
        self.deliveries: dict[tuple[str, str], int] = {}

    async def run(self) -> None:
        """Owned by the node's task group; ends when cancelled."""
        said = False
        while True:
            try:
                _, kv = await buckets(self.nc)
                watcher = await kv.watch(node_key(self.node))  # type: ignore[attr-defined]
                break
            except Exception as e:  # JetStream may be off or not yet reachable: say so once, try again
                if not said:
                    log.warning(
                        "membership: cannot watch %s in %s (%s: %s); delivered bundles wait until JetStream answers",
                        node_key(self.node),
                        KV_BUCKET,
                        type(e).__name__,
                        e,
                    )
                    said = True
                await anyio.sleep(5)
        obs, _ = await buckets(self.nc)
        try:
            async for entry in watcher:
                if entry is None:  # the initial marker: nothing (more) stored yet
                    continue
                wanted, broken = Membership(), dict[str, bytes]()
                if entry.operation not in ("DEL", "PURGE") and entry.value:
                    try:
                        wanted, broken = decode_membership(entry.value)
                    except (msgspec.DecodeError, msgspec.ValidationError) as e:
                        log.error("membership of node %s is not valid (%s); keeping what runs", self.node, e)
                        continue
                await self.reconcile(obs, wanted, broken)
        finally:
            with anyio.CancelScope(shield=True):
                try:
                    await watcher.stop()
                except Exception:  # the connection may be gone already
                    pass

    async def reconcile(self, obs: object, wanted: Membership, broken: dict[str, bytes] | None = None) -> None:
        """Bring the node in line with `wanted`; `broken`: entries that did not decode (kept running, refused)."""
        broken = broken or {}
        for name in sorted(set(self.current) - set(wanted.modules) - set(broken)):
            log.info("membership: removing module %s", name)
            try:
                await self.members.remove_module(name)
            except Exception as e:  # a failed stop is named; the membership no longer holds the module
                log.error("membership: removing module %s failed: %s: %s", name, type(e).__name__, e)
            del self.current[name]
            self._count(name, "removed")
            self.members.delivery_report(name, None)
        for name in sorted(set(self.refused) - set(wanted.modules) - set(broken)):
            del self.refused[name]
            self.members.delivery_report(module_label(name), None)
        for name, raw in sorted(broken.items()):
            if self.refused.get(name) != raw:
                why = "it is not a membership entry (version, seats, bundles of object, sha256, language, kind)"
                self._refuse(name, raw, DeliveryError(f"{why}: {shown(raw.decode(errors='replace'))}"))
        for name, ref in sorted(wanted.modules.items()):
            if self.current.get(name) == ref:
                if self.refused.pop(name, None) is not None:  # back to the version that runs
                    self.members.delivery_report(name, None)
                continue  # redelivered as it is: nothing changes
            if self.refused.get(name) == ref:
                continue  # refused already, and named: the same entry is not tried again
            try:
                await self._apply(obs, name, ref)
            except Exception as e:  # one module's failure, whatever it is, is that module's refusal
                self._refuse(name, ref, e)

    def _refuse(self, name: str, ref: ModuleRef | bytes, e: Exception) -> None:
        known = (DeliveryError, ArtifactError, ManifestError, StepFailed)
        reason = str(e) if isinstance(e, known) else f"{type(e).__name__}: {e}"
        label = module_label(name)
        if isinstance(ref, bytes):
            version = "(entry)"
        else:
            version = ref.version if version_problem(ref.version) is None else shown(ref.version)
        # The version that runs keeps running; the refusal is named, once.
        log.error("membership: module %s %s refused: %s", label, version, reason)
        self.refused[name] = ref
        self._count(name, "refused")
        self.members.delivery_report(label, f"{version} refused: {reason}")

    async def _apply(self, obs: object, name: str, ref: ModuleRef) -> None:
        if problems := ref_problems(name, ref):
            raise DeliveryError("; ".join(problems))
        placement = await fetch(obs, name, ref, self.state_dir, self.limits)
        upgrade = name in self.current
        if upgrade:
            # In place: the new version starts, new calls wait for it, the old one answers what it holds.
            log.info("membership: upgrading module %s %s -> %s", name, self.current[name].version, ref.version)
        else:
            log.info("membership: adding module %s %s", name, ref.version)
        try:
            await self.members.add_module(placement)
        except BaseException:
            if not upgrade:  # what was started of it goes; an upgrade's old version is left as it is
                with anyio.CancelScope(shield=True):
                    try:
                        await self.members.remove_module(name)
                    except Exception as e:  # named; the refusal that follows says why it was added at all
                        log.error("membership: cleaning up module %s failed: %s", name, e)
            raise
        self.current[name] = ref
        self._count(name, "upgraded" if upgrade else "added")
        self.refused.pop(name, None)
        self.members.delivery_report(name, None)

    def _count(self, name: str, result: str) -> None:
        module = name if name_problem(name) is None else "(invalid)"
        self.deliveries[(module, result)] = self.deliveries.get((module, result), 0) + 1
