"""The bus side of caller identity: a mesh account for the nodes, an account per caller.

The mesh account exports the mesh's services (docs/bus.md, "Accounts"): `mesh.tool.>` and
`mesh.seat.>` with several replies per request (progress frames), `mesh.cancel.*`, and
`mesh.fetch.>` (result objects, in chunks); each caller account imports them all with
`share: true`, so the server stamps every request from it with `Nats-Request-Info` (see
runtime/wire/identity.py). The same text serves the embedded bus (written from `[[nats.caller]]` in
the node's config) and an operator's own nats-server (README).
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

from runtime.config import MESH_ACCOUNT, MESH_USER, CallerAccount

# (subject, export options): a call's progress frames are several replies to one request, for as
# long as the longest call may take.
MESH_EXPORTS = (
    ("mesh.tool.>", 'response_type: stream, response_threshold: "10m"'),
    ("mesh.seat.>", 'response_type: stream, response_threshold: "10m"'),
    ("mesh.cancel.*", ""),
    ("mesh.fetch.>", "response_type: stream"),
    # The tool list for callers' MCP faces (`meshctl mcp`): every node answers one INFO request.
    ("$SRV.INFO.mesh-node", "response_type: stream"),
    # The catalogue, read whole (batched direct gets of its one stream; runtime/bus/catalog.py): read-only.
    ("$JS.API.DIRECT.GET.KV_mesh-catalog", "response_type: stream"),
)
# Messages the mesh account publishes for its callers: the nodes' change notices (runtime/node/changes.py)
# and every write to the catalogue, as the server republishes it (runtime/bus/catalog_watch.py).
MESH_STREAMS = ("mesh.events.tools", "mesh.catalog.>")
SECRET_FILE_MODE = 0o600


def _q(text: str) -> str:
    # A JSON string is a valid quoted string in the nats-server config format.
    return json.dumps(text)


def accounts_block(mesh_users: list[tuple[str, str]], callers: list[tuple[str, str, str]]) -> str:
    """An `accounts { ... }` block: (user, password) in the mesh account, (account, user, password) callers."""
    users = ", ".join(f"{{ user: {_q(u)}, password: {_q(p)} }}" for u, p in mesh_users)
    exports = ", ".join(
        [f"{{ service: {_q(s)}{', ' + o if o else ''} }}" for s, o in MESH_EXPORTS]
        + [f"{{ stream: {_q(s)} }}" for s in MESH_STREAMS]
    )
    lines = [
        "accounts {",
        f"  {MESH_ACCOUNT} {{",
        "    jetstream: enabled",
        f"    users: [ {users} ]",
        f"    exports: [ {exports} ]",
        "  }",
    ]
    by_account: dict[str, list[tuple[str, str]]] = {}
    for account, user, password in callers:
        by_account.setdefault(account, []).append((user, password))
    imports = ", ".join(
        [f"{{ service: {{ account: {MESH_ACCOUNT}, subject: {_q(s)} }}, share: true }}" for s, _ in MESH_EXPORTS]
        + [f"{{ stream: {{ account: {MESH_ACCOUNT}, subject: {_q(s)} }} }}" for s in MESH_STREAMS]
    )
    for account, members in by_account.items():
        listed = ", ".join(f"{{ user: {_q(u)}, password: {_q(p)} }}" for u, p in members)
        lines += [f"  {_q(account)} {{", f"    users: [ {listed} ]", f"    imports: [ {imports} ]", "  }"]
    lines.append("}")
    return "\n".join(lines) + "\n"


def read_or_make_secret(path: Path) -> str:
    """A password kept in a file only its owner reads; made once, the same on every start."""
    try:
        text = path.read_text().strip()
        if text:
            return text
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    value = secrets.token_urlsafe(24)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, SECRET_FILE_MODE)
    with os.fdopen(fd, "w") as f:
        f.write(value + "\n")
    os.replace(tmp, path)
    return value


class EmbeddedAccounts:
    """The accounts of an embedded bus with caller accounts, and where their secrets are kept.

    `<state_dir>/bus-mesh.password`: the nodes' (and the local operator's) mesh-account password;
    `<state_dir>/callers/<user>.password`: a caller's password when the config gives none.
    """

    def __init__(self, state_dir: Path, callers: list[CallerAccount]) -> None:
        self.state_dir = state_dir
        self.mesh_user = MESH_USER
        self.mesh_password_file = state_dir / "bus-mesh.password"
        self.mesh_password = read_or_make_secret(self.mesh_password_file)
        self.callers: list[tuple[str, str, str]] = []
        self.generated: list[Path] = []
        for c in callers:
            password = c.password
            if password is None:
                path = state_dir / "callers" / f"{c.user}.password"
                password = read_or_make_secret(path)
                self.generated.append(path)
            self.callers.append((c.account, c.user, password))

    def summary(self) -> str:
        """One log line: who the bus lets in and where each secret the node made is kept."""
        callers = ", ".join(f"{account}/{user}" for account, user, _ in self.callers)
        made = (
            "caller passwords made in " + ", ".join(str(p) for p in self.generated)
            if self.generated
            else "every caller's password is in the config"
        )
        return (
            f"embedded bus accounts: mesh (nodes, password in {self.mesh_password_file}) and callers {callers}; {made}"
        )

    def server_config(self) -> str:
        return accounts_block([(self.mesh_user, self.mesh_password)], self.callers)
