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
    # The embedded bus (it always has accounts): which user meshctl, run by the node's OS user,
    # logs in as for what, and the file holding each password (files only that user reads).
    # The mesh account: status, tools, delivery, seats, callers.
    user: str | None = None
    password_file: str | None = None
    # The operator's own calls (`meshctl call`): the node gives them its local identity.
    caller_user: str | None = None
    caller_password_file: str | None = None
    # The face (`meshctl mcp`): a delegate, which passes the person behind each call.
    face_user: str | None = None
    face_password_file: str | None = None
    # The console (`meshctl console`): a delegate too, which also reads status and asks restarts.
    console_user: str | None = None
    console_password_file: str | None = None


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
    """The running local node's bus.json, or None; PermissionError when the folder is another user's."""
    try:
        info = msgspec.json.decode((state_dir / BUS_FILE).read_bytes(), type=BusInfo)
    except (FileNotFoundError, NotADirectoryError, msgspec.DecodeError, msgspec.ValidationError):
        return None
    try:
        os.kill(info.pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return info
