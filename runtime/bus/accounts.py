"""The bus side of caller identity: a mesh account for the nodes, an account per caller.

The mesh account exports the mesh's services (docs/bus.md, "Accounts"): `mesh.tool.>` and
`mesh.seat.>` with several replies per request (progress frames), `mesh.cancel.*`,
`mesh.fetch.>` (result objects, in chunks), `mesh.answer.>` (answers to a call's asks) and
`mesh.task.*` (detached calls' tasks); each caller account imports them all with
`share: true`, so the server stamps every request from it with `Nats-Request-Info` (see
runtime/wire/identity.py). The mesh account's users may not publish on those subjects
themselves: inside one account the server passes a client's stamp as written, so no call may
start there (runtime/bus/trust.py). The same text serves the embedded bus and an operator's own
nats-server (README).

The embedded bus always has accounts (`EmbeddedAccounts`): the mesh account (the nodes, and the
node's OS user's meshctl for status, delivery and seats), `LOCAL` (that user's own calls, which
the node gives its local identity), the face user `faces/mesh-mcp` (`meshctl mcp`, a delegate),
the console user `CONSOLES/mesh-console` (`meshctl console`, a delegate that also reads the nodes'
status and asks for restarts, both stamped, which the node checks: runtime/node/control.py), the callers of `[[nats.caller]]` and those `meshctl caller add` made (`<state>/callers.json`).
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

import msgspec

from runtime.config import (
    ACCOUNT_NAME_RE,
    CONSOLE_ACCOUNT,
    CONSOLE_USER,
    FACE_ACCOUNT,
    FACE_USER,
    LOCAL_ACCOUNT,
    LOCAL_USER,
    MESH_ACCOUNT,
    MESH_USER,
    CallerAccount,
    reserved_problem,
)
from runtime.wire.asking import ANSWER_PREFIX, TASK_PREFIX
from runtime.wire.control import CallerRow
from runtime.wire.identity import DELEGATE_VIAS, Via
from runtime.wire.subjects import CANCEL_PREFIX, FETCH_PREFIX, SEAT_PREFIX, TOOL_PREFIX

# (subject, export options): a call's progress frames are several replies to one request, for as
# long as the longest call may take.
MESH_EXPORTS = (
    ("mesh.tool.>", 'response_type: stream, response_threshold: "10m"'),
    ("mesh.seat.>", 'response_type: stream, response_threshold: "10m"'),
    ("mesh.cancel.*", ""),
    ("mesh.fetch.>", "response_type: stream"),
    # A caller's answers to its calls' asks, and its detached calls (runtime/wire/asking.py): each
    # request crosses the import stamped, so the node takes it only from the call's own account.
    ("mesh.answer.>", ""),
    ("mesh.task.*", 'response_threshold: "2m"'),
    # The tool list for callers' MCP faces (`meshctl mcp`): every node answers one INFO request.
    ("$SRV.INFO.mesh-node", "response_type: stream"),
    # The catalogue, read whole (batched direct gets of its one stream; runtime/bus/catalog.py): read-only.
    ("$JS.API.DIRECT.GET.KV_mesh-catalog", "response_type: stream"),
)
# Messages the mesh account publishes for its callers: the nodes' change notices (runtime/node/changes.py)
# and every write to the catalogue, as the server republishes it (runtime/bus/catalog_watch.py).
MESH_STREAMS = ("mesh.events.tools", "mesh.catalog.>")
# What only a console account imports: every node's status (read), and restarts, stamped (share: true)
# so that the node sees which delegate and person asks (runtime/node/control.py checks the person).
CONSOLE_EXPORTS = (
    ("mesh.node.*.status", "", False),
    ("mesh.node.*.restart", "", True),
)
# What no user of the mesh account may publish: every subject the node reads a caller stamp on.
MESH_DENIED = (
    TOOL_PREFIX + ">",
    SEAT_PREFIX + ">",
    CANCEL_PREFIX + "*",
    FETCH_PREFIX + ">",
    ANSWER_PREFIX + ">",
    TASK_PREFIX + "*",
)
SECRET_FILE_MODE = 0o600
CALLERS_FILE = "callers.json"


def _q(text: str) -> str:
    # A JSON string is a valid quoted string in the nats-server config format.
    return json.dumps(text)


def accounts_block(
    mesh_users: list[tuple[str, str]],
    callers: list[tuple[str, str, str]],
    *,
    guard: bool = True,
    consoles: tuple[str, ...] = (),
) -> str:
    """An `accounts { ... }` block: (user, password) in the mesh account, (account, user, password) callers.

    `guard`: the mesh account's users may not publish calls (the node believes stamps only then);
    off only for a test that shows what an unguarded mesh account costs. `consoles`: the caller
    accounts that also import the nodes' status and restart subjects (CONSOLE_EXPORTS), exported to
    them alone.
    """
    deny = ", ".join(_q(s) for s in MESH_DENIED)
    permissions = f", permissions: {{ publish: {{ deny: [ {deny} ] }} }}" if guard else ""
    users = ", ".join(f"{{ user: {_q(u)}, password: {_q(p)}{permissions} }}" for u, p in mesh_users)
    only = ", ".join(_q(a) for a in consoles)
    exports = ", ".join(
        [f"{{ service: {_q(s)}{', ' + o if o else ''} }}" for s, o in MESH_EXPORTS]
        + [f"{{ stream: {_q(s)} }}" for s in MESH_STREAMS]
        + ([f"{{ service: {_q(s)}, accounts: [ {only} ] }}" for s, _, _ in CONSOLE_EXPORTS] if consoles else [])
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
    console_imports = ", ".join(
        f"{{ service: {{ account: {MESH_ACCOUNT}, subject: {_q(s)} }}{', share: true' if share else ''} }}"
        for s, _, share in CONSOLE_EXPORTS
    )
    for account, members in by_account.items():
        listed = ", ".join(f"{{ user: {_q(u)}, password: {_q(p)} }}" for u, p in members)
        more = f", {console_imports}" if account in consoles else ""
        lines += [f"  {_q(account)} {{", f"    users: [ {listed} ]", f"    imports: [ {imports}{more} ]", "  }"]
    lines.append("}")
    return "\n".join(lines) + "\n"


def write_private(path: Path, data: bytes) -> None:
    """A file only its owner reads (0600), written whole or not at all."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, SECRET_FILE_MODE)
    with os.fdopen(fd, "wb") as f:
        os.fchmod(f.fileno(), SECRET_FILE_MODE)  # a .tmp left by an older node may have another mode
        f.write(data)
    os.replace(tmp, path)


def read_or_make_secret(path: Path) -> str:
    """A password kept in a file only its owner reads; made once, the same on every start."""
    try:
        text = path.read_text().strip()
        if text:
            os.chmod(path, SECRET_FILE_MODE)  # one an older node made with another mode
            return text
    except FileNotFoundError:
        pass
    value = secrets.token_urlsafe(24)
    write_private(path, (value + "\n").encode())
    return value


class AddedCaller(msgspec.Struct, frozen=True):
    """A caller `meshctl caller add` made (kept in `<state>/callers.json`; its password beside it)."""

    account: str
    user: str
    via: Via | None = None  # a delegate's channel ("mcp" or "console"); None: an ordinary caller


class AccountsError(Exception):
    """A caller that cannot be added or removed; the text says why and what would do."""


@dataclass(frozen=True)
class Login:
    """A user and the file holding its password (0600, the node's OS user's)."""

    user: str
    password_file: Path

    def password(self) -> str:
        return self.password_file.read_text().strip()


class EmbeddedAccounts:
    """The accounts of the embedded bus and where their secrets are kept.

    `<state_dir>/bus-mesh.password`: the mesh account's (nodes; the operator's status, delivery
    and seats); `bus-local.password`: the operator's own calls; `bus-mcp.password`: the face;
    `bus-console.password`: the console;
    `callers/<user>.password`: a caller's password when the config gives none, or one `meshctl
    caller add` made.
    """

    def __init__(self, state_dir: Path, configured: list[CallerAccount]) -> None:
        self.state_dir = state_dir
        self.mesh_user = MESH_USER
        self.mesh_password_file = state_dir / "bus-mesh.password"
        self.mesh_password = read_or_make_secret(self.mesh_password_file)
        self.local = Login(LOCAL_USER, state_dir / "bus-local.password")
        self.face = Login(FACE_USER, state_dir / "bus-mcp.password")
        self.console = Login(CONSOLE_USER, state_dir / "bus-console.password")
        self._local_password = read_or_make_secret(self.local.password_file)
        self._face_password = read_or_make_secret(self.face.password_file)
        self._console_password = read_or_make_secret(self.console.password_file)
        self.configured: list[tuple[str, str, str]] = []
        self.generated: list[Path] = []
        for c in configured:
            password = c.password
            if password is None:
                path = self._password_file(c.user)
                password = read_or_make_secret(path)
                self.generated.append(path)
            self.configured.append((c.account, c.user, password))
        self.problem: str | None = None  # a callers.json the node cannot read: said, and started without it
        self.added: list[AddedCaller] = self._read_added()

    # --- who is in ----------------------------------------------------------------------------
    @property
    def operator(self) -> tuple[str, str]:
        return LOCAL_ACCOUNT, LOCAL_USER

    def delegates(self) -> dict[tuple[str, str | None], Via]:
        """The embedded bus's own delegates: its face, and every added caller with a channel."""
        found: dict[tuple[str, str | None], Via] = {
            (FACE_ACCOUNT, FACE_USER): "mcp",
            (CONSOLE_ACCOUNT, CONSOLE_USER): "console",
        }
        for a in self.added:
            if a.via is not None:
                found[(a.account, a.user)] = a.via
        return found

    def callers(self) -> list[tuple[str, str, str]]:
        """Every caller user of the bus with its password: the operator's, the face, configured, added."""
        own = [
            (LOCAL_ACCOUNT, LOCAL_USER, self._local_password),
            (FACE_ACCOUNT, FACE_USER, self._face_password),
            (CONSOLE_ACCOUNT, CONSOLE_USER, self._console_password),
        ]
        added = []
        for a in self.added:
            try:
                added.append((a.account, a.user, self._password_file(a.user).read_text().strip()))
            except OSError:  # its password file is gone: the caller cannot log in, the others can
                continue
        return own + self.configured + added

    def rows(self) -> list[CallerRow]:
        rows = [
            CallerRow(LOCAL_ACCOUNT, LOCAL_USER, "operator", "local", str(self.local.password_file)),
            CallerRow(FACE_ACCOUNT, FACE_USER, "face", "mcp", str(self.face.password_file)),
            CallerRow(CONSOLE_ACCOUNT, CONSOLE_USER, "console", "console", str(self.console.password_file)),
        ]
        made = {str(p) for p in self.generated}
        for account, user, _ in self.configured:
            path = str(self._password_file(user))
            rows.append(CallerRow(account, user, "config", "bus", path if path in made else ""))
        for a in self.added:
            rows.append(CallerRow(a.account, a.user, "added", a.via or "bus", str(self._password_file(a.user))))
        return rows

    # --- changes (`meshctl caller add/remove`, through the node) -----------------------------
    def add(self, user: str, account: str | None, via: str | None) -> CallerRow:
        account = account or user
        for field, value in (("user", user), ("account", account)):
            if not ACCOUNT_NAME_RE.match(value):
                raise AccountsError(
                    f'the {field} {value!r} is not a name: write letters, digits, - and _, e.g. "alice"'
                )
        if why := reserved_problem(account, user):
            raise AccountsError(why)
        if via is not None and via not in DELEGATE_VIAS:
            raise AccountsError(f"--delegate {via!r}: a delegate's channel is one of {', '.join(DELEGATE_VIAS)}")
        if any(u == user for _, u, _ in self.callers()):
            raise AccountsError(f"a caller {user!r} exists already; `meshctl caller list` shows them, remove it first")
        read_or_make_secret(self._password_file(user))
        self.added = [*self.added, AddedCaller(account=account, user=user, via=via)]
        self._write_added()
        return next(r for r in self.rows() if r.user == user)

    def remove(self, user: str) -> CallerRow:
        row = next((r for r in self.rows() if r.user == user), None)
        if row is None:
            raise AccountsError(f"no caller {user!r} on this bus; `meshctl caller list` shows them")
        if row.kind != "added":
            where = "the node's config ([[nats.caller]])" if row.kind == "config" else "the embedded bus itself"
            raise AccountsError(f"{user!r} comes from {where}; only callers `meshctl caller add` made are removed here")
        self.added = [a for a in self.added if a.user != user]
        self._write_added()
        self._password_file(user).unlink(missing_ok=True)
        return row

    def restore(self, added: list[AddedCaller]) -> None:
        """The added callers as they were before a change the server did not take."""
        self.added = list(added)
        self._write_added()

    def password_of(self, user: str) -> str:
        return next(p for _, u, p in self.callers() if u == user)

    # --- files -------------------------------------------------------------------------------
    def _password_file(self, user: str) -> Path:
        return self.state_dir / "callers" / f"{user}.password"

    def _read_added(self) -> list[AddedCaller]:
        try:
            data = (self.state_dir / CALLERS_FILE).read_bytes()
        except FileNotFoundError:
            return []
        try:
            return msgspec.json.decode(data, type=list[AddedCaller])
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            self.problem = (
                f"{self.state_dir / CALLERS_FILE} is not the list `meshctl caller add` writes ({e}); its callers "
                "cannot log in: fix or remove it, then start the node again"
            )
            return []

    def _write_added(self) -> None:
        write_private(self.state_dir / CALLERS_FILE, msgspec.json.encode(self.added))

    # --- what the server and the log are told ----------------------------------------------
    def summary(self) -> str:
        """One log line: who the bus lets in and where each secret the node made is kept."""
        callers = ", ".join(f"{account}/{user}" for account, user, _ in self.configured + self._added_triples())
        if self.generated:
            made = "caller passwords made in " + ", ".join(str(p) for p in self.generated)
        elif self.configured:
            made = "every configured caller's password is in the config"
        else:
            made = f"`meshctl caller add NAME` makes more (passwords in {self.state_dir / 'callers'})"
        return (
            f"embedded bus accounts: mesh (nodes, password in {self.mesh_password_file}), the operator's calls "
            f"({LOCAL_ACCOUNT}/{LOCAL_USER}), the face ({FACE_ACCOUNT}/{FACE_USER}), the console "
            f"({CONSOLE_ACCOUNT}/{CONSOLE_USER}) and callers {callers or 'none'}; "
            f"{made}"
        )

    def _added_triples(self) -> list[tuple[str, str, str]]:
        return [(a.account, a.user, "") for a in self.added]

    def server_config(self) -> str:
        return accounts_block([(self.mesh_user, self.mesh_password)], self.callers(), consoles=(CONSOLE_ACCOUNT,))
