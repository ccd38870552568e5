"""`bus.json` in the node's state folder: how `meshctl` finds the local node's bus without being told."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from runtime.bus.connect import without_credentials

BUS_FILE = "bus.json"


class BusInfo(msgspec.Struct):
    url: str
    node: str
    pid: int
    embedded: bool
    # An embedded bus with caller accounts: the mesh account's user and its password file,
    # which the local operator's meshctl uses (a file only the node's user reads).
    user: str | None = None
    password_file: str | None = None


def write_bus_info(state_dir: Path, info: BusInfo) -> Path:
    """bus.json, readable by the node's user only (0600), with a URL that carries no credentials."""
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / BUS_FILE
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        os.fchmod(f.fileno(), 0o600)  # a .tmp left by an older node may have another mode
        f.write(msgspec.json.encode(msgspec.structs.replace(info, url=without_credentials(info.url))))
    os.replace(tmp, path)
    return path


def read_bus_info(state_dir: Path) -> BusInfo | None:
    try:
        info = msgspec.json.decode((state_dir / BUS_FILE).read_bytes(), type=BusInfo)
    except (FileNotFoundError, msgspec.DecodeError, msgspec.ValidationError):
        return None
    try:
        os.kill(info.pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return info
