"""Whether the node may believe its bus's caller stamps: asked of the server once, at connect.

The server stamps `Nats-Request-Info` on a request crossing an account import and replaces any
the client wrote; inside one account it passes a client's header as sent, and the node cannot
tell the two apart. So the node believes stamps only where no client inside its own account can
publish a call: the server has accounts, and the mesh account's user is denied publishing on
every subject the node reads a stamp from (`GUARDED`). The server says both for the node's own
connection (`$SYS.REQ.USER.INFO`, nats-server 2.10 and later); the embedded bus is set up so.
Every other user of the mesh account must be denied the same (docs/bus.md, "Accounts").
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import nats.errors
from nats.aio.client import Client

USER_INFO = "$SYS.REQ.USER.INFO"
NO_ACCOUNTS = "$G"  # the account of every client on a server without accounts
# Where the node reads a caller stamp: calls, their cancels and result objects read back.
GUARDED = ("mesh.tool.>", "mesh.seat.>", "mesh.cancel.*", "mesh.fetch.>", "mesh.answer.>", "mesh.task.*")


@dataclass(frozen=True)
class BusTrust:
    stamped: bool  # the server's stamps are believed
    account: str | None  # the node's own account, as the server named it (None: it did not say)
    summary: str  # one line for the log and `node status`

    @staticmethod
    def vouched(account: str) -> BusTrust:
        return BusTrust(True, account, f"server-stamped: callers come through accounts; {account} cannot publish calls")


def _tokens(subject: str) -> list[str]:
    return subject.split(".")


def covers(pattern: str, subject: str) -> bool:
    """Every subject `subject` (itself a pattern) matches is matched by `pattern`."""
    p, s = _tokens(pattern), _tokens(subject)
    for i, token in enumerate(p):
        if token == ">":
            return len(s) > i
        if i >= len(s) or s[i] == ">":
            return False
        if token != "*" and token != s[i]:
            return False
    return len(p) == len(s)


def intersects(a: str, b: str) -> bool:
    """Some subject is matched by both patterns."""
    x, y = _tokens(a), _tokens(b)
    for i in range(max(len(x), len(y))):
        if i >= len(x) or i >= len(y):
            return False
        if x[i] == ">" or y[i] == ">":
            return True
        if x[i] != "*" and y[i] != "*" and x[i] != y[i]:
            return False
    return True


def _patterns(value: Any) -> list[str]:
    return [p for p in value if isinstance(p, str)] if isinstance(value, list) else []


def may_publish(permissions: Any, subject: str) -> bool:
    """Whether a user with these publish permissions (the server's `{allow, deny}`) may publish some
    subject of `subject`; in doubt, yes."""
    if isinstance(permissions, list):  # a bare list is an allow list
        permissions = {"allow": permissions}
    if not isinstance(permissions, dict):
        return True
    if any(covers(d, subject) for d in _patterns(permissions.get("deny"))):
        return False
    allow = _patterns(permissions.get("allow"))
    return not allow or any(intersects(a, subject) for a in allow)


def judge(info: dict[str, Any]) -> BusTrust:
    """The trust a `$SYS.REQ.USER.INFO` answer's `data` gives (pure, for tests)."""
    account = info.get("account")
    if not isinstance(account, str) or not account:
        return BusTrust(
            False, None, "unverified: the server did not name this connection's account; every caller is local"
        )
    if account == NO_ACCOUNTS:
        return BusTrust(
            False,
            account,
            "unverified: this bus has no accounts, so the server vouches for no caller and every caller is local "
            "(README, Who is calling)",
        )
    permissions = info.get("permissions")
    publish = permissions.get("publish") if isinstance(permissions, dict) else None
    open_subjects = [s for s in GUARDED if may_publish(publish, s)]
    if open_subjects:
        user = info.get("user") or "?"
        return BusTrust(
            False,
            account,
            f"unverified: the mesh account's user {user} may publish {', '.join(open_subjects)}, so a client there "
            "could write any caller's stamp and every caller is local; deny the mesh account's users publish on "
            f"{', '.join(GUARDED)} (docs/bus.md, Accounts)",
        )
    return BusTrust.vouched(account)


async def ask_trust(nc: Client, timeout: float = 2.0) -> BusTrust:
    """What the server says about this connection, judged; a server that does not say is not believed."""
    try:
        msg = await nc.request(USER_INFO, b"", timeout=timeout)
        data = json.loads(msg.data).get("data")
    except (nats.errors.NoRespondersError, nats.errors.TimeoutError, ValueError, AttributeError) as e:
        return BusTrust(
            False,
            None,
            f"unverified: the server did not answer {USER_INFO} ({type(e).__name__}; nats-server 2.10 and later "
            "do), so the node cannot know whether a stamp is the server's; every caller is local",
        )
    return judge(data if isinstance(data, dict) else {})
