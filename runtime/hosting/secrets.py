"""Secrets for bundles (API keys) from a file only the node can read, into one bundle's environment.

The node's config names the file (`secrets = "/etc/mesh/secrets.toml"`); a table per bundle:

```toml
["everything/tools"]          # <module>/<bundle>
API_KEY = "..."
```

The file must belong to the node's user and be readable by nobody else (mode 0600 or 0400),
or it is refused whole: a secret readable by every user of the machine is not one. Values never
reach the manifest, the log or status; only the names are ever said.
"""

from __future__ import annotations

import os
import stat
import tomllib
from pathlib import Path

from manifests.model import ENV_NAME_RE


class SecretsError(Exception):
    def __init__(self, path: Path | str, reason: str) -> None:
        self.path, self.reason = str(path), reason
        super().__init__(f"secrets file {path}: {reason}; no bundle gets a secret from it")


def bundle_secrets(path: Path | str, module: str, bundle: str) -> dict[str, str]:
    """The secrets of `<module>/<bundle>` (maybe none); SecretsError when the file cannot be trusted or read."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as e:
        raise SecretsError(path, f"cannot be opened ({e.strerror})") from None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if info.st_uid != os.geteuid():
            raise SecretsError(path, f"belongs to uid {info.st_uid}, not the node's user (uid {os.geteuid()})")
        if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise SecretsError(path, f"mode {stat.S_IMODE(info.st_mode):o} lets other users read it: chmod 600 {path}")
        data = f.read(1024 * 1024 + 1)
    if len(data) > 1024 * 1024:
        raise SecretsError(path, "is larger than 1 MiB")
    try:
        tables = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        # The parser's message may quote a line of the file, a secret with it: say where, not what.
        where = str(e).rsplit("(", 1)[-1].rstrip(")") if "(" in str(e) else "somewhere"
        raise SecretsError(path, f"is not valid TOML ({where})") from None
    table = tables.get(f"{module}/{bundle}", {})
    if not isinstance(table, dict):
        raise SecretsError(path, f'["{module}/{bundle}"] is not a table of NAME = "value"')
    out: dict[str, str] = {}
    for name, value in table.items():
        if not ENV_NAME_RE.match(name) or name.startswith("MESH_"):
            raise SecretsError(path, f'["{module}/{bundle}"] {name!r} is not an environment name a secret may take')
        if not isinstance(value, str) or "\0" in value:
            raise SecretsError(path, f'["{module}/{bundle}"].{name} is not a string')
        out[name] = value
    return out
