"""Delivery, the node's side: artifacts in a JetStream object store, each node's membership in a KV bucket.

`meshctl bundle deliver` (runtime/meshctl/deliver.py) puts artifacts into the object store `mesh-bundles` and writes the
node's membership (modules, versions, seats, artifacts) under the key `node.<name>` of the KV
bucket `mesh-membership`. Each node watches its key; on a change it fetches what it lacks,
verifies every hash, unpacks, and starts, upgrades or stops modules without touching the
others. A redelivered identical version changes nothing.
"""

from __future__ import annotations

import logging
import os
import uuid
from pathlib import Path
from typing import IO, Awaitable, Callable

import anyio
import msgspec
from nats.aio.client import Client
from nats.js.errors import BucketNotFoundError, NotFoundError

from manifests import LoadedModule, ManifestError, load_module
from manifests.check import refuse_own_image
from manifests.load import name_problem, shown, version_problem
from manifests.model import KINDS, LANGUAGES, SEAT_NAME_RE
from runtime.hosting.placement import Placement
from runtime.hosting.steps import StepFailed
from toolchains.artifact import (
    ArtifactError,
    ArtifactLimits,
    is_sha256,
    platform_problem,
    read_meta,
    sha256_file,
    verify_and_unpack,
)
from toolchains.bytecode import compile_bytecode

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


class _RawMembership(msgspec.Struct):
    modules: dict[str, msgspec.Raw] = {}


def decode_membership(value: bytes) -> tuple[Membership, dict[str, bytes]]:
    """The entries that decode, and the raw bytes of each that does not: one malformed entry is
    that module's refusal, not the whole membership's. Raises msgspec errors when the value
    itself is not a membership."""
    raw = msgspec.json.decode(value, type=_RawMembership)
    wanted, broken = Membership(), dict[str, bytes]()
    for name, entry in raw.modules.items():
        try:
            wanted.modules[name] = msgspec.json.decode(entry, type=ModuleRef)
        except msgspec.ValidationError:
            broken[name] = bytes(entry)
    return wanted, broken


class DeliveryError(Exception):
    pass


def node_key(node: str) -> str:
    return f"node.{node}"


def object_name(module: str, bundle: str, version: str, sha256: str) -> str:
    """Where `meshctl bundle deliver` puts an artifact in the object store, and the only name a node fetches."""
    return f"{module}/{bundle}/{version}/{sha256[:16]}.tar.gz"


def ref_problems(module: str, ref: ModuleRef) -> list[str]:
    """Every field of one membership entry that breaks the manifest's rules; none may be used then.

    The fields come from the bus: each becomes part of a path, a subject or a log line only after
    this says it is a name, a version or a hash."""
    problems: list[str] = []
    if why := name_problem(module):
        return [f"module {why}"]  # the rest would be named under a name that is not one
    if why := version_problem(ref.version):
        problems.append(f"version {why}")
    if not ref.bundles:
        problems.append("bundles is empty; a delivered module names at least one artifact")
    for bundle, art in sorted(ref.bundles.items()):
        if why := name_problem(bundle, right='[a-z][a-z0-9-]{0,62}, e.g. "tools"'):
            problems.append(f"bundle key {why}")
            continue
        if not is_sha256(art.sha256):
            problems.append(f"bundles.{bundle}.sha256 is {shown(art.sha256)}; a sha256 is 64 lowercase hex digits")
        elif not problems and art.object != object_name(module, bundle, ref.version, art.sha256):
            expected = object_name(module, bundle, ref.version, art.sha256)
            problems.append(f"bundles.{bundle}.object is {shown(art.object)}; deliver names it {expected!r}")
        if art.language not in LANGUAGES:
            problems.append(f"bundles.{bundle}.language is {shown(art.language)}; one of {', '.join(LANGUAGES)}")
        if art.kind not in KINDS:
            problems.append(f"bundles.{bundle}.kind is {shown(art.kind)}; one of {', '.join(KINDS)}")
    for seat in ref.seats:
        if why := name_problem(seat, SEAT_NAME_RE, '[a-z][a-z0-9-]{0,62}, e.g. "memory"'):
            problems.append(f"seat {why}")
    return problems


def module_label(module: str) -> str:
    """A module's name as logs and status show it: itself when it is a name, else shortened and quoted."""
    return module if name_problem(module) is None else shown(module)


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


class _BoundedFile:
    """A file the object store's chunks are written into (in a worker thread), up to a limit."""

    def __init__(self, f: IO[bytes], limit: int) -> None:
        self.f, self.limit, self.written = f, limit, 0

    def write(self, data: bytes) -> int:
        self.written += len(data)
        if self.written > self.limit:
            raise DeliveryError(f"it is over {self.limit} bytes (max_artifact_bytes)")
        return self.f.write(data)


# --- the node's side ---------------------------------------------------------------------------
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
        add: Callable[[Placement], Awaitable[None]],
        remove: Callable[[str], Awaitable[None]],
        report: Callable[[str, str | None], None],
        limits: ArtifactLimits | None = None,
    ) -> None:
        self.nc, self.node, self.state_dir = nc, node, state_dir
        self._add, self._remove, self._report = add, remove, report
        self.limits = limits or ArtifactLimits()
        self.current: dict[str, ModuleRef] = {}
        # Versions refused, as they were asked for: the same entry again is not fetched or logged again.
        self.refused: dict[str, ModuleRef | bytes] = {}

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
                await self._remove(name)
            except Exception as e:  # a failed stop is named; the membership no longer holds the module
                log.error("membership: removing module %s failed: %s: %s", name, type(e).__name__, e)
            del self.current[name]
            self._report(name, None)
        for name in sorted(set(self.refused) - set(wanted.modules) - set(broken)):
            del self.refused[name]
            self._report(module_label(name), None)
        for name, raw in sorted(broken.items()):
            if self.refused.get(name) != raw:
                why = "it is not a membership entry (version, seats, bundles of object, sha256, language, kind)"
                self._refuse(name, raw, DeliveryError(f"{why}: {shown(raw.decode(errors='replace'))}"))
        for name, ref in sorted(wanted.modules.items()):
            if self.current.get(name) == ref:
                if self.refused.pop(name, None) is not None:  # back to the version that runs
                    self._report(name, None)
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
        self._report(label, f"{version} refused: {reason}")

    async def _apply(self, obs: object, name: str, ref: ModuleRef) -> None:
        if problems := ref_problems(name, ref):
            raise DeliveryError("; ".join(problems))
        placement = await self._fetch(obs, name, ref)
        upgrade = name in self.current
        if upgrade:
            # In place: the new version starts, new calls wait for it, the old one answers what it holds.
            log.info("membership: upgrading module %s %s -> %s", name, self.current[name].version, ref.version)
        else:
            log.info("membership: adding module %s %s", name, ref.version)
        try:
            await self._add(placement)
        except BaseException:
            if not upgrade:  # what was started of it goes; an upgrade's old version is left as it is
                with anyio.CancelScope(shield=True):
                    try:
                        await self._remove(name)
                    except Exception as e:  # named; the refusal that follows says why it was added at all
                        log.error("membership: cleaning up module %s failed: %s", name, e)
            raise
        self.current[name] = ref
        self.refused.pop(name, None)
        self._report(name, None)

    async def _download(self, obs: object, ref: ArtifactRef, cache: Path) -> None:
        """The object, streamed into the cache (never whole in memory), hashed in a thread."""
        try:
            info = await obs.get_info(ref.object)  # type: ignore[attr-defined]
        except Exception as e:  # a missing object is a refusal of this version, not a crash
            raise DeliveryError(f"artifact {ref.object} cannot be fetched: {e}") from e
        limit = self.limits.max_artifact_bytes
        if info.is_link():
            raise DeliveryError(f"artifact {ref.object} is a link in the object store; deliver stores artifacts")
        if (info.size or 0) > limit:
            raise DeliveryError(
                f"artifact {ref.object} is {info.size} bytes; the node takes at most max_artifact_bytes = {limit}"
            )
        cache.parent.mkdir(parents=True, exist_ok=True)
        part = cache.with_name(f".{cache.name}.{uuid.uuid4().hex[:8]}.part")
        try:
            with open(part, "wb") as f:
                try:
                    await obs.get(ref.object, writeinto=_BoundedFile(f, limit))  # type: ignore[attr-defined]
                except DeliveryError as e:
                    raise DeliveryError(f"artifact {ref.object}: {e}") from None
                except Exception as e:  # the object went away or its chunks do not match its digest
                    raise DeliveryError(f"artifact {ref.object} cannot be fetched: {e}") from e
            digest = await anyio.to_thread.run_sync(sha256_file, part)
            if digest != ref.sha256:
                raise DeliveryError(f"artifact {ref.object} does not match its sha256 {ref.sha256[:16]}...")
            os.replace(part, cache)
        finally:
            part.unlink(missing_ok=True)

    async def _fetch(self, obs: object, name: str, ref: ModuleRef) -> Placement:
        """Fetch, verify and unpack a checked entry (`ref_problems` found nothing), then load its manifest."""
        base = self.state_dir / "bundles" / name / ref.version
        dirs: dict[str, Path] = {}
        build_env: dict[str, dict[str, str]] = {}
        manifest = ""
        for bundle, bref in sorted(ref.bundles.items()):
            cache = self.state_dir / "artifacts" / f"{bref.sha256}.tar.gz"
            if not cache.is_file():
                await self._download(obs, bref, cache)
            # bundle.json first: an artifact of another module or version is refused before it is unpacked.
            meta = await anyio.to_thread.run_sync(read_meta, cache)
            refused = platform_problem(meta)
            if refused is not None:
                raise DeliveryError(f"artifact {bref.object} ({meta.module}/{meta.bundle}) cannot run here: {refused}")
            if meta.module != name or meta.bundle != bundle or meta.version != ref.version:
                raise DeliveryError(
                    f"artifact {bref.object} holds {meta.module}/{meta.bundle} {meta.version}, not {name}/{bundle} {ref.version}"
                )
            dest = base / f"{bundle}-{bref.sha256[:12]}"
            verified = dest.with_name(dest.name + ".verified")
            if not (dest.is_dir() and verified.is_file()):
                meta = await anyio.to_thread.run_sync(verify_and_unpack, cache, dest, self.limits)
                if meta.language == "python":  # once here, not at every start of its children
                    # A stop does not wait for it: without `.verified` the folder is unpacked again next time.
                    await anyio.to_thread.run_sync(compile_bytecode, dest, abandon_on_cancel=True)
                verified.write_text(bref.sha256)
            dirs[bundle] = dest
            build_env[bundle] = dict(meta.env)
            manifest = manifest or meta.manifest
        if not manifest:
            raise DeliveryError(f"the artifacts of {name} {ref.version} carry no module.toml")
        module_dir = base / "module"
        module_dir.mkdir(parents=True, exist_ok=True)
        (module_dir / "module.toml").write_text(manifest)
        loaded: LoadedModule = load_module(module_dir)
        refuse_own_image(loaded)
        if loaded.module.name != name:
            raise DeliveryError(f"the manifest delivered as {name} names module {loaded.module.name}")
        for b in loaded.module.bundle:  # tools, service and step bundles alike
            if b.name not in dirs:
                raise DeliveryError(f"bundle {b.name} of {name} {ref.version} was not delivered")
        return Placement(loaded, dirs, build_env, seats=list(ref.seats))
