"""`meshctl bundle deliver` and `remove`: artifacts into the object store, a node's membership into KV.

The wire (bucket names, `Membership`) and the node's side are in runtime/delivery/reconciler.py.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Callable

import anyio
import msgspec
from nats.aio.client import Client
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError, NotFoundError

from manifests import ManifestError
from manifests.check import check_text
from runtime.wire.membership import ArtifactRef, DeliveryError, Membership, ModuleRef, buckets, node_key, object_name
from toolchains.artifact import ArtifactError, ArtifactMeta, read_meta, sha256_file


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
    obs, kv = await buckets(nc)
    modules: dict[str, tuple[ArtifactMeta, dict[str, ArtifactRef]]] = {}
    for path in artifacts:
        try:
            meta = read_meta(path)
        except ArtifactError as e:
            raise DeliveryError(str(e)) from e
        # Record 0188 where code enters the mesh: the manifest the artifact carries is checked here too.
        if problems := check_text(meta.manifest, f"{path}: module.toml", path.parent.resolve()):
            raise ManifestError(problems)
        digest = await anyio.to_thread.run_sync(sha256_file, path)
        name = object_name(meta.module, meta.bundle, meta.version, digest)
        try:
            await obs.get_info(name)  # type: ignore[attr-defined]
            progress(f"{path.name}: already in the object store")
        except (NotFoundError, KeyNotFoundError):
            with open(path, "rb") as f:  # streamed in chunks, never whole in memory
                await obs.put(name, f)  # type: ignore[attr-defined]
            progress(f"{path.name}: uploaded ({path.stat().st_size} bytes)")
        first, refs = modules.setdefault(meta.module, (meta, {}))
        if first.version != meta.version:
            raise DeliveryError(f"{path}: module {meta.module} is given at versions {first.version} and {meta.version}")
        refs[meta.bundle] = ArtifactRef(object=name, sha256=digest, language=meta.language, kind=meta.kind)

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
        progress(
            f"node {node}: {module} {ref.version} ({', '.join(sorted(ref.bundles))}); seats: {', '.join(ref.seats) or 'none'}"
        )
    return membership


async def remove(nc: Client, modules: list[str], node: str) -> Membership:
    _, kv = await buckets(nc)
    missing: list[str] = []

    def change(m: Membership) -> None:
        missing.clear()
        for module in modules:
            if m.modules.pop(module, None) is None:
                missing.append(module)

    membership = await _change_membership(kv, node, change)
    if missing:
        raise DeliveryError(
            f"node {node} is not a member of {', '.join(missing)}; it has {', '.join(membership.modules) or 'none'}"
        )
    return membership


def _declared_seats(meta: ArtifactMeta) -> list[str]:
    try:
        data = tomllib.loads(meta.manifest) if meta.manifest else {}
    except tomllib.TOMLDecodeError:
        return []
    return [s["name"] for s in data.get("seat", []) if isinstance(s, dict) and isinstance(s.get("name"), str)]
