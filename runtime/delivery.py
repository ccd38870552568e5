"""Delivery, the node's side: artifacts in a JetStream object store, each node's membership in a KV bucket.

`meshctl bundle deliver` (runtime/meshctl/deliver.py) puts artifacts into the object store `mesh-bundles` and writes the
node's membership (modules, versions, seats, artifacts) under the key `node.<name>` of the KV
bucket `mesh-membership`. Each node watches its key; on a change it fetches what it lacks,
verifies every hash, unpacks, and starts, upgrades or stops modules without touching the
others. A redelivered identical version changes nothing.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Awaitable, Callable

import anyio
import msgspec
from nats.aio.client import Client
from nats.js.errors import BucketNotFoundError, NotFoundError

from manifests import LoadedModule, ManifestError, load_module
from toolchains.artifact import ArtifactError, read_meta, verify_and_unpack

from .placement import Placement

log = logging.getLogger("mesh.delivery")

OBJECT_BUCKET = "mesh-bundles"
KV_BUCKET = "mesh-membership"


class ArtifactRef(msgspec.Struct, frozen=True):
    object: str  # name in the object store
    sha256: str  # of the artifact file
    language: str
    kind: str


class ModuleRef(msgspec.Struct, frozen=True):
    version: str
    seats: list[str]
    bundles: dict[str, ArtifactRef]


class Membership(msgspec.Struct):
    modules: dict[str, ModuleRef] = {}


class DeliveryError(Exception):
    pass


def node_key(node: str) -> str:
    return f"node.{node}"


async def buckets(nc: Client) -> tuple[object, object]:
    js = nc.jetstream()
    try:
        obs = await js.object_store(OBJECT_BUCKET)
    except (BucketNotFoundError, NotFoundError):
        obs = await js.create_object_store(OBJECT_BUCKET)
    try:
        kv = await js.key_value(KV_BUCKET)
    except (BucketNotFoundError, NotFoundError):
        kv = await js.create_key_value(bucket=KV_BUCKET, history=5)
    return obs, kv


# --- the node's side ---------------------------------------------------------------------------
class Reconciler:
    """Watches one node's membership key and brings the node's modules in line with it."""

    def __init__(
        self,
        nc: Client,
        node: str,
        state_dir: Path,
        add: Callable[[Placement], Awaitable[None]],
        remove: Callable[[str], Awaitable[None]],
        report: Callable[[str, str | None], None],
    ) -> None:
        self.nc, self.node, self.state_dir = nc, node, state_dir
        self._add, self._remove, self._report = add, remove, report
        self.current: dict[str, ModuleRef] = {}

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
                if entry.operation in ("DEL", "PURGE") or not entry.value:
                    wanted = Membership()
                else:
                    try:
                        wanted = msgspec.json.decode(entry.value, type=Membership)
                    except (msgspec.DecodeError, msgspec.ValidationError) as e:
                        log.error("membership of node %s is not valid (%s); keeping what runs", self.node, e)
                        continue
                await self.reconcile(obs, wanted)
        finally:
            with anyio.CancelScope(shield=True):
                try:
                    await watcher.stop()
                except Exception:  # the connection may be gone already
                    pass

    async def reconcile(self, obs: object, wanted: Membership) -> None:
        for name in sorted(set(self.current) - set(wanted.modules)):
            log.info("membership: removing module %s", name)
            await self._remove(name)
            del self.current[name]
            self._report(name, None)
        for name, ref in sorted(wanted.modules.items()):
            if self.current.get(name) == ref:
                continue  # redelivered as it is: nothing changes
            try:
                placement = await self._fetch(obs, name, ref)
            except (DeliveryError, ArtifactError, ManifestError) as e:
                # The version that runs keeps running; the refusal is named.
                log.error("membership: module %s %s refused: %s", name, ref.version, e)
                self._report(name, f"{ref.version} refused: {e}")
                continue
            if name in self.current:
                log.info("membership: upgrading module %s %s -> %s", name, self.current[name].version, ref.version)
                await self._remove(name)
            else:
                log.info("membership: adding module %s %s", name, ref.version)
            await self._add(placement)
            self.current[name] = ref
            self._report(name, None)

    async def _fetch(self, obs: object, name: str, ref: ModuleRef) -> Placement:
        base = self.state_dir / "bundles" / name / ref.version
        dirs: dict[str, Path] = {}
        build_env: dict[str, dict[str, str]] = {}
        manifest = ""
        for bundle, bref in sorted(ref.bundles.items()):
            cache = self.state_dir / "artifacts" / f"{bref.sha256}.tar.gz"
            if not cache.is_file():
                try:
                    result = await obs.get(bref.object)  # type: ignore[attr-defined]
                except Exception as e:  # a missing object is a refusal of this version, not a crash
                    raise DeliveryError(f"artifact {bref.object} cannot be fetched: {e}") from e
                data = result.data or b""
                if hashlib.sha256(data).hexdigest() != bref.sha256:
                    raise DeliveryError(f"artifact {bref.object} does not match its sha256 {bref.sha256[:16]}...")
                cache.parent.mkdir(parents=True, exist_ok=True)
                tmp = cache.with_suffix(".part")
                tmp.write_bytes(data)
                tmp.rename(cache)
            dest = base / f"{bundle}-{bref.sha256[:12]}"
            verified = dest.with_name(dest.name + ".verified")
            if dest.is_dir() and verified.is_file():
                meta = read_meta(cache)
            else:
                meta = await anyio.to_thread.run_sync(verify_and_unpack, cache, dest)
                verified.write_text(bref.sha256)
            if meta.module != name or meta.bundle != bundle or meta.version != ref.version:
                raise DeliveryError(
                    f"artifact {bref.object} holds {meta.module}/{meta.bundle} {meta.version}, not {name}/{bundle} {ref.version}"
                )
            dirs[bundle] = dest
            build_env[bundle] = dict(meta.env)
            manifest = manifest or meta.manifest
        if not manifest:
            raise DeliveryError(f"the artifacts of {name} {ref.version} carry no module.toml")
        module_dir = base / "module"
        module_dir.mkdir(parents=True, exist_ok=True)
        (module_dir / "module.toml").write_text(manifest)
        loaded: LoadedModule = load_module(module_dir)
        if loaded.module.name != name:
            raise DeliveryError(f"the manifest delivered as {name} names module {loaded.module.name}")
        for b in loaded.module.tools_bundles():
            if b.name not in dirs:
                raise DeliveryError(f"bundle {b.name} of {name} {ref.version} was not delivered")
        return Placement(loaded, dirs, build_env, seats=list(ref.seats))
