"""`mesh.node.<node>.callers`: the callers of the node's embedded bus, listed, added and removed.

The node runs that bus, so it alone changes its accounts: it writes the server's config again,
has the running server reload it (SIGHUP), checks that the server took it (the new user logs
in; a removed one no longer does, and the server has closed its connections), and tells the
caller stamp about delegates. `meshctl caller add/remove/list` asks (runtime/meshctl/verbs/caller.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import anyio
import msgspec
import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from runtime.bus.accounts import AccountsError, EmbeddedAccounts
from runtime.bus.connect import BusError
from runtime.bus.embedded import EmbeddedServer
from runtime.wire.control import CallersAsk, CallersReply
from runtime.wire.subjects import CALLERS, node_subject, service_subjects

log = logging.getLogger("mesh.bus")

RELOAD_CHECK_S = 10.0  # how long the server may take to apply a reload before the change is said to have failed


class Callers:
    """Answers one node's `callers` subject while it serves."""

    def __init__(
        self,
        nc: Client,
        node: str,
        url: str,
        bus: tuple[EmbeddedAccounts, EmbeddedServer] | None,
        on_change: Callable[[EmbeddedAccounts], None],
    ) -> None:
        self.nc, self.node, self.url, self.bus = nc, node, url, bus
        self.on_change = on_change  # the caller stamp learns the delegates again
        self._lock = anyio.Lock()
        self._sub: Subscription | None = None

    async def start(self) -> None:
        self._sub = await self.nc.subscribe(node_subject(self.node, CALLERS), cb=self._on_ask)

    async def stop(self) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None

    async def _on_ask(self, msg: Msg) -> None:
        try:
            ask = msgspec.json.decode(msg.data or b"{}", type=CallersAsk)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            reply = CallersReply(ok=False, error=f"not a callers request ({e})")
        else:
            async with self._lock:  # one change of the server's config at a time
                reply = await self.answer(ask)
        if msg.reply:
            await msg.respond(msgspec.json.encode(reply))

    async def answer(self, ask: CallersAsk) -> CallersReply:
        if self.bus is None:
            return CallersReply(
                ok=False,
                error=f"node {self.node} joined the bus {self.url}, which it does not run: add callers to that "
                "server's accounts (README, Who is calling)",
            )
        accounts, server = self.bus
        before = list(accounts.added)
        try:
            if ask.op == "list":
                return CallersReply(ok=True, callers=accounts.rows())
            if ask.op == "add":
                row = accounts.add(ask.user, ask.account or None, ask.via or None)
                await self._reload(accounts, server, ask.user, accounts.password_of(ask.user), present=True)
                log.warning("bus caller %s/%s added (%s), on an operator's request", row.account, row.user, row.via)
            elif ask.op == "remove":
                password = accounts.password_of(ask.user) if any(r.user == ask.user for r in accounts.rows()) else ""
                row = accounts.remove(ask.user)
                await self._reload(accounts, server, ask.user, password, present=False)
                log.warning("bus caller %s/%s removed, on an operator's request", row.account, row.user)
            else:
                return CallersReply(ok=False, error=f"op {ask.op!r}: one of list, add, remove")
        except AccountsError as e:
            return CallersReply(ok=False, error=str(e))
        except BusError as e:  # the server did not take it: the callers are what they were
            accounts.restore(before)
            server.reload(accounts.server_config())
            self.on_change(accounts)
            return CallersReply(ok=False, error=f"{e}; nothing was changed")
        return CallersReply(ok=True, callers=accounts.rows(), changed=row)

    async def _reload(
        self, accounts: EmbeddedAccounts, server: EmbeddedServer, user: str, password: str, *, present: bool
    ) -> None:
        text = accounts.server_config()
        server.reload(text)
        self.on_change(accounts)
        with anyio.move_on_after(RELOAD_CHECK_S):
            while await _check(server.url, user, password, reach=False) != present:
                await anyio.sleep(0.05)
            if not present:
                return
            # nats-server 2.15 gives the imports of an account a reload brought in no interest until
            # the next reload: the new caller logs in and reaches nothing. A second reload settles it;
            # the caller reaching the nodes' INFO (an imported service) is the proof.
            server.reload(text)
            while not await _check(server.url, user, password, reach=True):
                await anyio.sleep(0.1)
            return
        raise BusError(
            f"the embedded nats-server did not apply the new accounts within {RELOAD_CHECK_S:g} s "
            f"({user} {'cannot log in or reach the mesh' if present else 'can still log in'}); "
            f"see {server.state_dir / 'nats-server.log'}"
        )


async def _quiet(_: Exception) -> None:
    """A refused login is the answer looked for, not an error to log."""


async def _check(url: str, user: str, password: str, *, reach: bool) -> bool:
    """Whether `user` logs in (and, with `reach`, gets an answer from the nodes through its imports)."""
    try:
        nc = await nats.connect(
            url,
            user=user,
            password=password,
            allow_reconnect=False,
            max_reconnect_attempts=0,
            connect_timeout=2,
            error_cb=_quiet,
        )
    except Exception:  # refused (or not reachable): not logged in
        return False
    try:
        if reach:
            await nc.request(service_subjects("INFO", "")[1], b"", timeout=1)
        return True
    except Exception:  # no responders through the import yet, or no answer in time
        return False
    finally:
        await nc.close()
