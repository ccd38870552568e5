"""Delivery: artifacts in a JetStream object store, each node's membership in a KV bucket.

`meshctl bundle deliver` puts artifacts into the object store `mesh-bundles` and writes the
node's membership (modules, versions, seats, artifacts) under the key `node.<name>` of the KV
bucket `mesh-membership`. Each node watches its key; on a change it fetches what it lacks,
verifies every hash, unpacks, and starts, upgrades or stops modules without touching the
others. A redelivered identical version changes nothing.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Awaitable, Callable

import anyio
import msgspec
from nats.aio.client import Client
from nats.js.errors import BucketNotFoundError, KeyNotFoundError, KeyWrongLastSequenceError, NotFoundError

from manifests import LoadedModule, ManifestError, load_module
from toolchains.artifact import ArtifactError, BundleMeta, read_meta, verify_and_unpack

if TYPE_CHECKING:
    from .node import Placement

log = logging.getLogger("mesh.delivery")

OBJECT_BUCKET = "mesh-bundles"
KV_BUCKET = "mesh-membership"


class BundleRef(msgspec.Struct, frozen=True):
    object: str  # name in the object store
    sha256: str  # of the artifact file
    language: str
    kind: str


class ModuleRef(msgspec.Struct, frozen=True):
    version: str
    seats: list[str]
    bundles: dict[str, BundleRef]


class Membership(msgspec.Struct):
    modules: dict[str, ModuleRef] = {}


class DeliveryError(Exception):
    pass


def node_key(node: str) -> str:
    return f"node.{node}"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


async def _buckets(nc: Client) -> tuple[object, object]:
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


async def _change_membership(kv: object, node: str, change: Callable[[Membership], None]) -> Membership:
    """Read-modify-write with the KV revision, so two operators never overwrite each other."""
    for _ in range(20):
        try:
            entry = await kv.get(node_key(node))  # type: ignore[attr-defined]
            current = msgspec.json.decode(entry.value, type=Membership) if entry.value else Membership()
            revision = entry.revision
        except KeyNotFoundError:
            current, revision = Membership(), None
        change(current)
        data = msgspec.json.encode(current)
        try:
            if revision is None:
                await kv.create(node_key(node), data)  # type: ignore[attr-defined]
            else:
                await kv.update(node_key(node), data, last=revision)  # type: ignore[attr-defined]
            return current
        except KeyWrongLastSequenceError:
            continue
        except Exception as e:  # create() races the same way: another writer was first
            if "wrong last sequence" in str(e).lower() or "key exists" in str(e).lower():
                continue
            raise
    raise DeliveryError(f"membership of node {node} kept changing under us; try again")


async def deliver(
    nc: Client, artifacts: list[Path], node: str, seats: list[str] | None, progress: Callable[[str], None]
) -> Membership:
    """Upload artifacts and set the node's membership: the artifacts' modules at their versions."""
    obs, kv = await _buckets(nc)
    modules: dict[str, tuple[BundleMeta, dict[str, BundleRef]]] = {}
    for path in artifacts:
        try:
            meta = read_meta(path)
        except ArtifactError as e:
            raise DeliveryError(str(e)) from e
        digest = _sha256(path)
        name = f"{meta.module}/{meta.bundle}/{meta.version}/{digest[:16]}.tar.gz"
        try:
            await obs.get_info(name)  # type: ignore[attr-defined]
            progress(f"{path.name}: already in the object store")
        except (NotFoundError, KeyNotFoundError):
            await obs.put(name, path.read_bytes())  # type: ignore[attr-defined]
            progress(f"{path.name}: uploaded ({path.stat().st_size} bytes)")
        first, refs = modules.setdefault(meta.module, (meta, {}))
        if first.version != meta.version:
            raise DeliveryError(f"{path}: module {meta.module} is given at versions {first.version} and {meta.version}")
        refs[meta.bundle] = BundleRef(object=name, sha256=digest, language=meta.language, kind=meta.kind)

    def change(m: Membership) -> None:
        for module, (meta, refs) in modules.items():
            declared = _declared_seats(meta)
            held = declared if seats is None else [s for s in seats if s in declared]
            old = m.modules.get(module)
            bundles = dict(old.bundles) if old is not None and old.version == meta.version else {}
            bundles.update(refs)
            m.modules[module] = ModuleRef(version=meta.version, seats=held, bundles=bundles)

    membership = await _change_membership(kv, node, change)
    for module in modules:
        ref = membership.modules[module]
        progress(f"node {node}: {module} {ref.version} ({', '.join(sorted(ref.bundles))}); seats: {', '.join(ref.seats) or 'none'}")
    return membership


async def remove(nc: Client, modules: list[str], node: str) -> Membership:
    _, kv = await _buckets(nc)
    missing: list[str] = []

    def change(m: Membership) -> None:
        missing.clear()
        for module in modules:
            if m.modules.pop(module, None) is None:
                missing.append(module)

    membership = await _change_membership(kv, node, change)
    if missing:
        raise DeliveryError(f"node {node} is not a member of {', '.join(missing)}; it has {', '.join(membership.modules) or 'none'}")
    return membership


def _declared_seats(meta: BundleMeta) -> list[str]:
    import tomllib

    try:
        data = tomllib.loads(meta.manifest) if meta.manifest else {}
    except tomllib.TOMLDecodeError:
        return []
    return [s.get("name") for s in data.get("seat", []) if isinstance(s, dict) and isinstance(s.get("name"), str)]


# --- the node's side ---------------------------------------------------------------------------
class Reconciler:
    """Watches one node's membership key and brings the node's modules in line with it."""

    def __init__(
        self,
        nc: Client,
        node: str,
        state_dir: Path,
        add: Callable[["Placement"], Awaitable[None]],
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
                _, kv = await _buckets(self.nc)
                watcher = await kv.watch(node_key(self.node))  # type: ignore[attr-defined]
                break
            except Exception as e:  # JetStream may be off or not yet reachable: say so once, try again
                if not said:
                    log.warning(
                        "membership: cannot watch %s in %s (%s: %s); delivered bundles wait until JetStream answers",
                        node_key(self.node), KV_BUCKET, type(e).__name__, e,
                    )
                    said = True
                await anyio.sleep(5)
        obs, _ = await _buckets(self.nc)
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

    async def _fetch(self, obs: object, name: str, ref: ModuleRef) -> "Placement":
        from .node import Placement

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
