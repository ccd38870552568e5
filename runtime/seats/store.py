"""A stateful seat's store identity: which store a module's data folder holds (seed 000: never a
second, empty store).

When a stateful seat is first held mesh-wide its data gets an identity, a random store id with
the node that made it and when, written in the seat's home record (`mesh-seat-homes`) and in the
module's data folder (`.mesh-store-<seat>.json`). A node serves the seat only from a folder
carrying the id the home record names; otherwise it answers every verb of the seat and every tool
of its module 503 (`StoreMissing`, said by the keeper) and creates nothing in the folder.
"""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path

import msgspec

from runtime.wire.leases import HomeRecord

IDENTITY_PREFIX = ".mesh-store-"
MAX_IDENTITY_BYTES = 4096
SHOWN_FILES = 5  # files named when a folder holds another store's data


class StoreIdentity(msgspec.Struct, frozen=True):
    seat: str
    store: str
    node: str  # the node that made the store
    since: float  # when


def new_store_id() -> str:
    return secrets.token_hex(8)


def identity_path(data_dir: Path, seat: str) -> Path:
    return data_dir / f"{IDENTITY_PREFIX}{seat}.json"


def read_identity(data_dir: Path, seat: str) -> StoreIdentity | None:
    """The identity the folder carries for `seat`; None when it carries none (or an unreadable one)."""
    path = identity_path(data_dir, seat)
    try:
        raw = path.read_bytes()[: MAX_IDENTITY_BYTES + 1]
    except (FileNotFoundError, NotADirectoryError):
        return None
    if len(raw) > MAX_IDENTITY_BYTES:
        return None
    try:
        return msgspec.json.decode(raw, type=StoreIdentity)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def write_identity(data_dir: Path, seat: str, home: HomeRecord) -> None:
    """The folder says which store it holds (written beside, then renamed: never half a file)."""
    identity = StoreIdentity(seat, home.store, home.store_node, home.store_since)
    path = identity_path(data_dir, seat)
    tmp = path.with_name(f"{path.name}.tmp")
    tmp.write_bytes(msgspec.json.encode(identity))
    os.chmod(tmp, 0o600)
    tmp.replace(path)


def described(home: HomeRecord) -> str:
    """The expected store as a person reads it: its id, the node that made it, when."""
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(home.store_since)) if home.store_since else "?"
    return f"store {home.store} (made on node {home.store_node or '?'} at {when})"


def what_is_there(data_dir: Path, seat: str) -> str:
    """What the folder holds, for the refusal: nothing, an empty folder, another store, files without identity."""
    if not data_dir.exists():
        return "no folder"
    if not data_dir.is_dir():
        return "a file, not a folder"
    try:
        names = sorted(p.name for p in data_dir.iterdir())
    except OSError as e:
        return f"a folder it cannot read ({e.strerror})"
    if not names:
        return "an empty folder"
    identity = read_identity(data_dir, seat)
    if identity is not None:
        return f"store {identity.store} (made on node {identity.node}), another store"
    shown = ", ".join(names[:SHOWN_FILES]) + (
        f" and {len(names) - SHOWN_FILES} more" if len(names) > SHOWN_FILES else ""
    )
    return f"files without a store identity ({shown})"


def matches(data_dir: Path, seat: str, home: HomeRecord) -> bool:
    identity = read_identity(data_dir, seat)
    return identity is not None and identity.store == home.store


def move_aside(data_dir: Path) -> Path | None:
    """An old copy is never served: the folder goes to `<module>.stale-<time>` (never deleted)."""
    if not data_dir.exists():
        return None
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    aside = data_dir.with_name(f"{data_dir.name}.stale-{stamp}")
    n = 1
    while aside.exists():
        n += 1
        aside = data_dir.with_name(f"{data_dir.name}.stale-{stamp}-{n}")
    os.replace(data_dir, aside)
    return aside


class StoreMissing(Exception):
    """The folder does not hold the store the seat's home names: the seat is answered 503 here."""

    def __init__(self, seat: str, home: HomeRecord, path: Path, found: str, more: str = "") -> None:
        self.seat, self.home, self.path, self.found = seat, home, path, found
        self.expected = described(home)
        super().__init__(
            f"seat {seat} is kept in {self.expected}; {path} holds {found}{more}: "
            "this node serves no other store, and creates none"
        )
