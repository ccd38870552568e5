"""The key that seals a 2026-07-28 `requestState` (face/asking.py), the same in every process of a face.

A client answers an `InputRequiredResult` by sending the request again with the sealed state; that
retry may land on another worker (SO_REUSEPORT picks one per connection) or on the face after a
restart. The package's own default (one key per process) refuses both. So:

- without a key file, worker 0 makes one key when it starts and hands it to the workers it starts
  (an environment variable each worker takes out of its environment at once): every worker of
  this start opens every other's state; a restart makes a new key, and the package refuses a
  retry of an older state (the client calls the tool again);
- `meshctl mcp --state-key FILE`: the key in FILE (32 random bytes, hex), made 0600 when missing;
  a face started again with the same file opens what the last one sealed (the ask is still on the
  bus, as a detached call's task, for the task's TTL). A file others may read is refused.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from runtime.meshctl.errors import MeshError

KEY_ENV = "MESH_FACE_STATE_KEY"  # worker 0 -> its workers (the key, hex)
KEY_BYTES = 32


def state_keys(path: str | None, worker: int, workers: int) -> list[bytes]:
    """The keys ([sealing key]) this face process (worker `worker` of `workers`) seals and opens requestState with."""
    if path is not None:
        return [_from_file(Path(path))]
    handed = os.environ.pop(KEY_ENV, None)  # never passed on further than the face's own workers
    if worker > 0 and handed is not None:
        try:
            key = bytes.fromhex(handed)
        except ValueError:
            key = b""
        if len(key) == KEY_BYTES:
            return [key]
    key = os.urandom(KEY_BYTES)
    if worker == 0 and workers > 1:
        os.environ[KEY_ENV] = key.hex()  # the workers it starts inherit it (face/workers.py)
    return [key]


def _from_file(path: Path) -> bytes:
    if not path.exists():
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass  # another worker made it a moment ago
        except OSError as e:
            raise MeshError(
                f"--state-key {path}: cannot make it ({e.strerror}); name a file in a folder you own"
            ) from None
        else:
            with os.fdopen(fd, "w") as out:
                out.write(os.urandom(KEY_BYTES).hex() + "\n")
    try:
        info = path.stat()
        text = path.read_text().strip()
    except OSError as e:
        raise MeshError(f"--state-key {path}: cannot read it ({e.strerror})") from None
    if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise MeshError(
            f"--state-key {path}: others may read it (mode {stat.S_IMODE(info.st_mode):o}); whoever reads it can "
            f"forge a client's answer to a tool: `chmod 600 {path}`"
        )
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) != KEY_BYTES:
        raise MeshError(
            f"--state-key {path}: it must hold {KEY_BYTES} bytes as {KEY_BYTES * 2} hex digits; "
            "delete it and the face makes a new one"
        )
    return key
