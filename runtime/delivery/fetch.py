"""One delivered module, fetched: its artifacts streamed from the object store into the node's
cache (never whole in memory), hashed, verified and unpacked, and its manifest loaded."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import IO

import anyio

from manifests import LoadedModule, load_module
from manifests.check import refuse_own_image
from runtime.hosting.placement import Placement
from runtime.wire.membership import ArtifactRef, DeliveryError, ModuleRef
from toolchains.artifact import ArtifactLimits, platform_problem, read_meta, sha256_file
from toolchains.bytecode import compile_bytecode
from toolchains.verify import verify_and_unpack


class _BoundedFile:
    """A file the object store's chunks are written into (in a worker thread), up to a limit."""

    def __init__(self, f: IO[bytes], limit: int) -> None:
        self.f, self.limit, self.written = f, limit, 0

    def write(self, data: bytes) -> int:
        self.written += len(data)
        if self.written > self.limit:
            raise DeliveryError(f"it is over {self.limit} bytes (max_artifact_bytes)")
        return self.f.write(data)


async def download(obs: object, ref: ArtifactRef, cache: Path, limits: ArtifactLimits) -> None:
    """The object, streamed into the cache (never whole in memory), hashed in a thread."""
    try:
        info = await obs.get_info(ref.object)  # type: ignore[attr-defined]
    except Exception as e:  # a missing object is a refusal of this version, not a crash
        raise DeliveryError(f"artifact {ref.object} cannot be fetched: {e}") from e
    limit = limits.max_artifact_bytes
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


async def fetch(obs: object, name: str, ref: ModuleRef, state_dir: Path, limits: ArtifactLimits) -> Placement:
    """Fetch, verify and unpack a checked entry (`ref_problems` found nothing), then load its manifest."""
    base = state_dir / "bundles" / name / ref.version
    dirs: dict[str, Path] = {}
    build_env: dict[str, dict[str, str]] = {}
    manifest = ""
    for bundle, bref in sorted(ref.bundles.items()):
        cache = state_dir / "artifacts" / f"{bref.sha256}.tar.gz"
        if not cache.is_file():
            await download(obs, bref, cache, limits)
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
            meta = await anyio.to_thread.run_sync(verify_and_unpack, cache, dest, limits)
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
