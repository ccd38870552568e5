"""Packing: a staged folder into a reproducible artifact (same source, same bytes), `bundle.json` first."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import stat
import tarfile
import tempfile
from pathlib import Path
from typing import IO

import msgspec

from toolchains.artifact import (
    FORMAT,
    META_NAME,
    ArtifactMeta,
    PackRefused,
    artifact_name,
    clean_target,
    encode_meta,
    link_problem,
    meta_problem,
    path_problem,
    reserved,
    sha256_file,
)


def pack(stage_dir: Path, meta: ArtifactMeta, out_dir: Path) -> Path:
    """Write the artifact of `stage_dir` into `out_dir` and return its path.

    `meta` is everything but files, links and exec, which are taken from the stage. The bytes depend
    only on the staged content: entries sorted, owner 0, mtime 0, modes 0644/0755, gzip mtime 0.
    """
    stage_dir = Path(stage_dir)
    if not stage_dir.is_dir():
        raise PackRefused(stage_dir, "it is not a folder")
    files, links, executable = _scan_stage(stage_dir)
    meta = msgspec.structs.replace(meta, format=FORMAT, files=files, links=links, exec=executable)
    if why := meta_problem(meta):
        raise PackRefused(stage_dir, why)
    meta_bytes = encode_meta(meta)

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / artifact_name(meta)
    # Write beside the target and rename, so a reader never sees half an artifact.
    fd, tmp_name = tempfile.mkstemp(prefix=f".{out.name}.", dir=out_dir)
    try:
        with os.fdopen(fd, "wb") as raw:
            # filename="" and mtime=0 keep the gzip header free of the host's name and clock.
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=9, mtime=0) as gz:
                with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT, encoding="utf-8") as tar:
                    tar.addfile(_tarinfo(META_NAME, tarfile.REGTYPE, 0o644, len(meta_bytes)), io.BytesIO(meta_bytes))
                    for path in sorted(set(files) | set(links)):
                        if path in links:
                            info = _tarinfo(path, tarfile.SYMTYPE, 0o777, 0)
                            info.linkname = links[path]
                            tar.addfile(info)
                            continue
                        source = stage_dir / path
                        mode = 0o755 if path in executable else 0o644
                        with open(source, "rb") as f:
                            size = os.fstat(f.fileno()).st_size
                            reader = _HashingReader(f)
                            tar.addfile(_tarinfo(path, tarfile.REGTYPE, mode, size), reader)
                        if reader.hash.hexdigest() != files[path]:
                            raise PackRefused(stage_dir, f"{path} changed while it was being packed; build again")
        os.chmod(tmp_name, 0o644)
        os.replace(tmp_name, out)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return out


def _tarinfo(name: str, kind: bytes, mode: int, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.size = kind, mode, size
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
    return info


class _HashingReader:
    """Hands a staged file to tarfile and hashes what it hands, so a file changed since it was
    hashed for bundle.json is caught instead of packed under the wrong hash."""

    def __init__(self, f: IO[bytes]) -> None:
        self.f = f
        self.hash = hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self.hash.update(data)
        return data


def _scan_stage(stage_dir: Path) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """Hash every regular file, read every symlink; refuse what an artifact cannot hold."""
    files: dict[str, str] = {}
    links: dict[str, str] = {}
    executable: list[str] = []

    def walk(folder: Path, prefix: str) -> None:
        for entry in sorted(os.scandir(folder), key=lambda e: e.name):
            rel = prefix + entry.name
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                target = clean_target(os.readlink(entry.path))
                if why := link_problem(rel, target):
                    raise PackRefused(stage_dir, f"symlink {rel}: {why}")
                links[rel] = target
            elif stat.S_ISDIR(st.st_mode):
                walk(Path(entry.path), rel + "/")  # empty folders are not kept: create them at run time
            elif stat.S_ISREG(st.st_mode):
                if why := path_problem(rel) or reserved(rel):
                    raise PackRefused(stage_dir, f"file {rel!r}: {why}")
                files[rel] = sha256_file(Path(entry.path))
                if st.st_mode & 0o111:
                    executable.append(rel)
            else:
                raise PackRefused(
                    stage_dir, f"{rel} is a {_kind_of(st.st_mode)}; a bundle holds only files and symlinks"
                )

    walk(stage_dir, "")
    return files, links, sorted(executable)


def _kind_of(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "named pipe (fifo)"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device file"
    return "special file"
