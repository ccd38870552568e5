"""The node's side of the bus call protocol: calls that carry Mesh-* headers (docs/bus.md).

A plain request (no header) never reaches this module. For the others the desk keeps, per call
in flight: its id and caller's account (for mesh.cancel.<id>; an id is its account's own: two
accounts may use the same one at once), its deadline, and its progress forwarder. Cancels arrive on one subscription per node (`mesh.cancel.*`, no queue group: the
caller does not know which node serves its call); a node that does not have the call remembers
the id a short while, in case the cancel overtook its request.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import Any, Awaitable, Callable, TypeVar

import anyio
import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from runtime.calls.objects import ObjectHandoff
from runtime.wire.callproto import (
    FRAME,
    FRAME_KEEPALIVE,
    FRAME_PROGRESS,
    MAX_MESSAGE,
    MAX_REASON,
    CallOptions,
    CancelBody,
    KeepaliveFrame,
    ProgressFrame,
    parse_headers,
    request_account,
    valid_call_id,
)
from runtime.wire.errors import BadRequest
from runtime.wire.subjects import CANCEL_PREFIX, FETCH_PREFIX

log = logging.getLogger("mesh.calls")

T = TypeVar("T")

EARLY_CANCELS = 1024  # ids remembered for a request that may still come; the oldest go first
EARLY_CANCEL_S = 30.0
FRAMES_WAITING = 256  # progress frames waiting to be published per call; past it the oldest go

_encode = msgspec.json.Encoder().encode
_decode_cancel = msgspec.json.Decoder(CancelBody).decode


class CallSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """`[calls]` in the node's config."""

    keepalive_s: float = 5.0  # a keepalive frame after this long without a frame, when progress was asked
    object_bucket: str = "mesh-calls"
    object_ttl_s: float = 600.0
    object_cap_bytes: int = 64 * 1024 * 1024


class _ProgressParams(msgspec.Struct):
    progressToken: int | str
    progress: int | float
    total: int | float | None = None
    message: str | None = None


_decode_progress = msgspec.json.Decoder(_ProgressParams).decode


class Progress:
    """One call's progress frames to its reply subject, in order, with keepalives between them.

    The first keepalive goes at once (docs/bus.md); after it a timer handle, not a task, waits for
    the next one, and a publishing task runs only while there are frames or a keepalive to send:
    every face call asks for progress, and a task group with a pump task per call cost the node
    about 100 us a call (most calls end long before their first frame or second keepalive).
    """

    def __init__(self, nc: Client, reply: str, keepalive_s: float, owner: object, desk: CallDesk | None = None) -> None:
        self.nc, self.reply, self.keepalive_s, self.owner = nc, reply, keepalive_s, owner
        self.desk = desk  # counts the frames sent (metrics)
        self.frames: collections.deque[bytes] = collections.deque(maxlen=FRAMES_WAITING)
        self.dropped = 0
        self.stopped = False  # the call was cancelled: nothing more goes to its caller
        self._started = time.monotonic()
        self._open = False  # while `during` runs: frames are published as they come
        self._keepalive_due = False
        self._timer: asyncio.TimerHandle | None = None
        self._publisher: asyncio.Task[None] | None = None  # owned by `during`: awaited before it returns

    def add(self, frame: ProgressFrame) -> None:
        if len(self.frames) == FRAMES_WAITING:
            self.dropped += 1
        self.frames.append(_encode(frame))
        self._publish_soon()

    async def during(self, work: Awaitable[T]) -> T:
        """Await `work` while frames are published; what is still waiting goes out before it returns.

        An error of `work` comes out as itself.
        """
        self._open = True
        # The first keepalive at once: the caller learns a node has its call, and the interval to expect.
        await self._keepalive()
        self._arm()
        if self.frames:
            self._publish_soon()
        try:
            return await work
        finally:
            self._open = False
            if self._timer is not None:
                self._timer.cancel()
            with anyio.CancelScope(shield=True):
                if self._publisher is not None and not self._publisher.done():
                    await asyncio.wait([self._publisher])
                await self._flush()
            if self.dropped:
                log.warning(
                    "%d progress frames to %s dropped: more than %d were waiting",
                    self.dropped,
                    self.reply,
                    FRAMES_WAITING,
                )

    def _arm(self) -> None:
        """The next keepalive, after `keepalive_s` without another frame."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(self.keepalive_s, self._keepalive_now)

    def _keepalive_now(self) -> None:
        self._keepalive_due = True
        self._publish_soon()

    def _publish_soon(self) -> None:
        if self._open and (self._publisher is None or self._publisher.done()):
            self._publisher = asyncio.get_running_loop().create_task(self._publish_due())

    async def _publish_due(self) -> None:
        # Until nothing is due: a frame added while this publishes is sent by this same task.
        while self._open and (self.frames or self._keepalive_due):
            if self.frames:
                await self._flush()
            else:
                self._keepalive_due = False
                await self._keepalive()
            self._arm()

    async def _keepalive(self) -> None:
        elapsed = int((time.monotonic() - self._started) * 1000)
        frame = KeepaliveFrame(elapsed_ms=elapsed, interval_ms=int(self.keepalive_s * 1000))
        await self._publish(_encode(frame), FRAME_KEEPALIVE)

    async def _flush(self) -> None:
        while self.frames:
            await self._publish(self.frames.popleft(), FRAME_PROGRESS)
            if self.desk is not None:
                self.desk.progress_frames += 1

    async def _publish(self, body: bytes, kind: str) -> None:
        if self.stopped:
            return
        try:
            await self.nc.publish(self.reply, body, headers={FRAME: kind})
        except Exception as e:  # the bus is gone: the final reply will say nothing either
            log.debug("progress frame to %s not sent: %s", self.reply, e)


class OpenCall:
    """A call with options, from its request to its answer (or its cancel)."""

    __slots__ = ("options", "progress", "token", "task", "cancelled")

    def __init__(self, options: CallOptions) -> None:
        self.options = options
        self.progress: Progress | None = None
        self.token = 0  # the progressToken the child gets (call_meta); 0: none
        self.task: asyncio.Task[None] | None = None
        self.cancelled = False  # by its caller: no further answer

    @property
    def begins_now(self) -> bool:
        """Whether `start` may write it to its child at once: not cancelled, its arguments not in the store."""
        return not (self.cancelled or self.options.request_object)

    def cancel(self, reason: str) -> None:
        if self.cancelled:
            return
        self.cancelled = True
        if self.progress is not None:
            self.progress.stopped = True
        task = self.task
        if task is not None and not task.done():
            # After the task's first step (call_soon is FIFO): a task cancelled before it ever ran
            # would skip the code that frees its slot.
            asyncio.get_running_loop().call_soon(task.cancel, reason)


def call_meta(base: bytes, call: OpenCall | None) -> bytes:
    """A tools/call's `params._meta`: `base` (a JSON object, e.g. the caller's identity; empty: none)
    with the call's progress token added when its caller asked for progress."""
    if call is None or not call.token:
        return base
    token = b'"progressToken":%d' % call.token
    if not base:
        return b"{" + token + b"}"
    return base[:-1] + b"," + token + b"}" if base != b"{}" else b"{" + token + b"}"


class CallDesk:
    """Calls with options in flight on this node, and the cancels and progress that reach them."""

    def __init__(self, nc: Client, settings: CallSettings) -> None:
        self.nc = nc
        self.settings = settings
        self.objects = ObjectHandoff(nc, settings.object_bucket, settings.object_ttl_s, settings.object_cap_bytes)
        # Mesh-Call-Id -> the caller's account -> its call: ids are each account's own, so one
        # caller's id (leaked, or chosen badly) never refuses or cancels another's call.
        self.open_calls: dict[str, dict[str | None, OpenCall]] = {}
        self._by_token: dict[int, OpenCall] = {}
        self._next_token = 0
        # (account, id) of cancels that came before their request, and when.
        self._early: collections.OrderedDict[tuple[str | None, str], float] = collections.OrderedDict()
        self._subs: list[Subscription] = []
        self.cancels_honoured = 0
        self.progress_frames = 0  # progress frames published to callers
        self.cancels_ignored = 0

    async def start(self, queue_group: str) -> None:
        self._subs = [
            await self.nc.subscribe(CANCEL_PREFIX + "*", cb=self._on_cancel),
            # Any one node reads a result object back for its caller (the store is the mesh's).
            await self.nc.subscribe(FETCH_PREFIX + ">", queue=queue_group, cb=self.objects.serve_fetch),
        ]

    async def stop(self) -> None:
        for sub in self._subs:
            await sub.unsubscribe()
        self._subs = []

    # --- a request ---------------------------------------------------------------------
    def open(self, msg: Msg, owner: object) -> OpenCall | None:
        """The call's options, registered; None for a request with no Mesh-* header. BadRequest when wrong."""
        assert msg.headers is not None
        options = parse_headers(msg.subject, msg.headers, bool(msg.data))
        if options is None:
            return None
        call = OpenCall(options)
        call_id, account = options.call_id, options.account
        if call_id is not None:
            same_id = self.open_calls.get(call_id)
            if same_id is not None and account in same_id:
                raise BadRequest(
                    msg.subject,
                    f"a call with Mesh-Call-Id {call_id} is already in flight; give every call its own random id",
                    field="header Mesh-Call-Id",
                )
            early = self._early.pop((account, call_id), None)
            if early is not None and time.monotonic() - early < EARLY_CANCEL_S:
                call.cancelled = True  # its cancel came first: never sent to the child
                self.cancels_honoured += 1
                return call
            if same_id is None:
                same_id = self.open_calls[call_id] = {}
            same_id[account] = call
        if options.progress and msg.reply:
            self._next_token += 1
            call.token = self._next_token
            # Frames on the connection the final reply takes (the request's own, calls/dispatch.py):
            # one connection keeps them in order, and none comes after the reply.
            on = msg._client if msg._client is not None else self.nc
            call.progress = Progress(on, msg.reply, self.settings.keepalive_s, owner, self)
            self._by_token[call.token] = call
        return call

    def close(self, call: OpenCall) -> None:
        call_id, account = call.options.call_id, call.options.account
        same_id = self.open_calls.get(call_id) if call_id is not None else None
        if call_id is not None and same_id is not None and same_id.get(account) is call:
            del same_id[account]
            if not same_id:
                del self.open_calls[call_id]
        if call.token:
            self._by_token.pop(call.token, None)

    # --- from the bus and the children --------------------------------------------------
    async def _on_cancel(self, msg: Msg) -> None:
        call_id = msg.subject[len(CANCEL_PREFIX) :]
        if not valid_call_id(call_id):
            return
        try:
            account = request_account(msg.headers)
        except ValueError:
            self.cancels_ignored += 1
            return
        same_id = self.open_calls.get(call_id)
        call = same_id.get(account) if same_id is not None else None
        if call is None:
            self._remember_early(call_id, account)  # its own call with that id may still come
            if same_id:
                self.cancels_ignored += 1
                log.warning(
                    "ignored a cancel of call %s from account %s: the call in flight under that id is account %s's",
                    call_id,
                    account or "(mesh)",
                    ", ".join(sorted(a or "(mesh)" for a in same_id)),
                )
            return
        self.cancels_honoured += 1
        call.cancel(_reason(msg.data))

    def _remember_early(self, call_id: str, account: str | None) -> None:
        # Also every cancel for a call served by another node, or already answered: bounded, short-lived.
        key = (account, call_id)
        self._early[key] = time.monotonic()
        self._early.move_to_end(key)
        while len(self._early) > EARLY_CANCELS:
            self._early.popitem(last=False)

    def progress(self, owner: object, params: msgspec.Raw) -> None:
        """A child's notifications/progress; only the bundle that got the token may use it."""
        try:
            p = _decode_progress(params)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return
        call = self._by_token.get(p.progressToken) if isinstance(p.progressToken, int) else None
        if call is None or call.progress is None or call.progress.owner is not owner or call.cancelled:
            return
        message = p.message[:MAX_MESSAGE] if p.message is not None else None
        call.progress.add(ProgressFrame(progress=p.progress, total=p.total, message=message))

    def stats(self) -> dict[str, Any]:
        return {
            "open": sum(len(same_id) for same_id in self.open_calls.values()),
            "cancels_honoured": self.cancels_honoured,
            "cancels_ignored": self.cancels_ignored,
        }


def _reason(data: bytes) -> str:
    default = "the caller cancelled the call"
    if not data or len(data) > 4096:
        return default
    try:
        reason = _decode_cancel(data).reason
    except (msgspec.DecodeError, msgspec.ValidationError):
        return default
    return reason[:MAX_REASON] if reason else default


ProgressHook = Callable[[object, msgspec.Raw], None]
