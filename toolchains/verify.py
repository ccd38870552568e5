"""The verifier: what a node runs before it launches anything from an artifact (the security boundary).

It trusts nothing in the archive: every member must be a regular file or a symlink that
`bundle.json` lists, with the sha256 it names, at a path that stays inside the bundle. Nothing is
written to the destination until the whole archive has been checked; every limit of
`ArtifactLimits` is checked before a member is written.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Callable

from toolchains.artifact import (
    CHUNK,
    CORRUPT,
    META_NAME,
    ArtifactLimits,
    ArtifactMeta,
    ArtifactRefused,
    open_stream,
    path_problem,
    read_meta_member,
)


def verify_and_unpack(artifact_path: Path, dest_dir: Path, limits: ArtifactLimits | None = None) -> ArtifactMeta:
    """Check every member against bundle.json and unpack into `dest_dir`, or refuse and touch nothing.

    The archive is unpacked into a fresh folder beside `dest_dir` and renamed into place only when
    all of it is verified; an existing `dest_dir` is replaced then, never before. `limits` bound
    the packed size, the members and the bytes unpacked: each member's size is checked from its
    header, before a byte of it is written.
    """
    artifact_path, dest_dir = Path(artifact_path), Path(dest_dir)
    limits = limits or ArtifactLimits()
    try:
        packed = artifact_path.stat().st_size
    except FileNotFoundError:
        raise ArtifactRefused(artifact_path, "no such file") from None
    if packed > limits.max_artifact_bytes:
        raise ArtifactRefused(
            artifact_path,
            f"it is {packed} bytes; the node takes at most max_artifact_bytes = {limits.max_artifact_bytes}",
        )
    dest_dir.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{dest_dir.name}.unpack-", dir=dest_dir.parent))
    try:
        try:
            with open_stream(artifact_path) as tar:
                meta = read_meta_member(artifact_path, tar)
                _unpack_members(artifact_path, tar, meta, work, _Budget(limits, packed))
        except CORRUPT as e:
            raise ArtifactRefused(artifact_path, f"it is truncated or corrupt ({e}); build or fetch it again") from None
        os.chmod(work, 0o755)
        _swap_into_place(work, dest_dir)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return meta


class _Budget:
    """What one artifact may still unpack: members and bytes, counted from the members' headers."""

    def __init__(self, limits: ArtifactLimits, packed: int) -> None:
        self.limits, self.packed = limits, packed
        self.members, self.unpacked = 0, 0

    def member_problem(self, size: int) -> str | None:
        limits = self.limits
        self.members += 1
        self.unpacked += size
        if self.members > limits.max_members:
            return f"it holds more than max_members = {limits.max_members} files and links"
        if self.unpacked > limits.max_unpacked_bytes:
            return f"it unpacks to more than max_unpacked_bytes = {limits.max_unpacked_bytes} bytes"
        if self.unpacked > limits.ratio_floor_bytes and self.unpacked > limits.max_ratio * self.packed:
            return (
                f"it unpacks to at least {self.unpacked} bytes from {self.packed} packed, over max_ratio = "
                f"{limits.max_ratio} times its size: a compression bomb, not a bundle"
            )
        return None


def _unpack_members(artifact_path: Path, tar: tarfile.TarFile, meta: ArtifactMeta, work: Path, budget: _Budget) -> None:
    def refuse(reason: str) -> ArtifactRefused:
        return ArtifactRefused(artifact_path, reason)

    listed = len(meta.files) + len(meta.links)
    if listed > budget.limits.max_members:
        raise refuse(
            f"{META_NAME} lists {listed} files and links; the node takes at most max_members = {budget.limits.max_members}"
        )
    seen: set[str] = set()
    executable = set(meta.exec)
    # tar.next(), not `for member in tar`: iteration would start over with bundle.json, already read.
    while (member := tar.next()) is not None:
        if why := budget.member_problem(max(member.size, 0)):
            raise refuse(why)
        name = member.name
        if why := path_problem(name):
            raise refuse(f"member {name!r}: {why}")
        if name in seen or name == META_NAME:
            raise refuse(f"member {name!r} appears twice; each path is in the archive once")
        seen.add(name)
        if member.islnk():
            raise refuse(f"member {name!r} is a hardlink (to {member.linkname!r}); a bundle holds no hardlinks")
        if member.issym():
            if name not in meta.links:
                raise refuse(f"symlink {name!r} is not listed in {META_NAME}; every link must be listed")
            if member.linkname != meta.links[name]:
                raise refuse(
                    f"symlink {name!r} points to {member.linkname!r}, but {META_NAME} says {meta.links[name]!r}"
                )
            # meta.links was checked to stay inside; parents must be real folders we made.
            target = work / name
            target.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(member.linkname, target)
            continue
        if not member.isreg():
            raise refuse(f"member {name!r} is a {_member_kind(member)}; a bundle holds only files and symlinks")
        if name not in meta.files:
            raise refuse(f"file {name!r} is not listed in {META_NAME}; every file must be listed with its sha256")
        _write_member(refuse, tar, member, work, meta.files[name], 0o755 if name in executable else 0o644)

    missing = sorted((set(meta.files) | set(meta.links)) - seen)
    if missing:
        shown = ", ".join(repr(p) for p in missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise refuse(f"{META_NAME} lists {shown}, missing from the archive; build the artifact again")


def _write_member(
    refuse: Callable[[str], ArtifactRefused],
    tar: tarfile.TarFile,
    member: tarfile.TarInfo,
    work: Path,
    expected: str,
    mode: int,
) -> None:
    target = work / member.name
    # No listed path lies under a listed link (checked in bundle.json), so these folders are real.
    target.parent.mkdir(parents=True, exist_ok=True)
    source = tar.extractfile(member)
    assert source is not None
    h = hashlib.sha256()
    # O_EXCL | O_NOFOLLOW: never write through a link or over something already unpacked.
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as out:
        while chunk := source.read(CHUNK):
            h.update(chunk)
            out.write(chunk)
    if h.hexdigest() != expected:
        raise refuse(
            f"file {member.name!r} has sha256 {h.hexdigest()}, but {META_NAME} says {expected}; "
            "the artifact was altered or damaged"
        )
    os.chmod(target, mode)


def _member_kind(member: tarfile.TarInfo) -> str:
    if member.isdir():
        return "folder entry (format 1 lists only files and symlinks)"
    if member.isfifo():
        return "named pipe (fifo)"
    if member.ischr() or member.isblk():
        return "device file"
    return f"member of tar type {member.type!r}"


def _swap_into_place(work: Path, dest_dir: Path) -> None:
    """Rename the verified folder to `dest_dir`, replacing an existing one only at this last step."""
    if not dest_dir.exists() and not dest_dir.is_symlink():
        os.rename(work, dest_dir)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{dest_dir.name}.old-", dir=dest_dir.parent))
    os.rename(dest_dir, old / "d")
    try:
        os.rename(work, dest_dir)
    except BaseException:
        os.rename(old / "d", dest_dir)  # put the old one back: a failed swap leaves things as they were
        shutil.rmtree(old, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)
