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
from typing import Any, Callable, TypeVar

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from launcher.session import Session
from runtime.calls.asking import ASK_REFUSED, CANNOT_ASK, Asking, CallAsks
from runtime.calls.identity import CallerStamp
from runtime.calls.objects import ObjectHandoff
from runtime.calls.progress import FRAMES_WAITING as FRAMES_WAITING
from runtime.calls.progress import Progress
from runtime.calls.tasks import TaskStore
from runtime.wire.asking import ASK_METHODS, CALL_REF, TASKS_BUCKET
from runtime.wire.callproto import (
    MAX_MESSAGE,
    MAX_REASON,
    CallOptions,
    CancelBody,
    ProgressFrame,
    parse_headers,
    request_account,
    valid_call_id,
)
from runtime.wire.errors import BadRequest
from runtime.wire.identity import local_caller
from runtime.wire.subjects import CANCEL_PREFIX, FETCH_PREFIX

log = logging.getLogger("mesh.calls")

T = TypeVar("T")

EARLY_CANCELS = 1024  # ids remembered for a request that may still come; the oldest go first
EARLY_CANCEL_S = 30.0

_encode = msgspec.json.Encoder().encode
_decode_cancel = msgspec.json.Decoder(CancelBody).decode


class CallSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """`[calls]` in the node's config."""

    keepalive_s: float = 5.0  # a keepalive frame after this long without a frame, when progress was asked
    object_bucket: str = "mesh-calls"
    object_ttl_s: float = 600.0
    object_cap_bytes: int = 64 * 1024 * 1024
    tasks_bucket: str = TASKS_BUCKET  # detached calls (runtime/calls/tasks.py), made at the first one
    tasks_ttl_s: float = 24 * 3600.0
    tasks_max_bytes: int = 256 * 1024 * 1024


class _ProgressParams(msgspec.Struct):
    progressToken: int | str
    progress: int | float
    total: int | float | None = None
    message: str | None = None


_decode_progress = msgspec.json.Decoder(_ProgressParams).decode


class OpenCall:
    """A call with options, from its request to its answer (or its cancel)."""

    __slots__ = ("options", "progress", "token", "task", "cancelled", "asks", "ref", "task_key")

    def __init__(self, options: CallOptions) -> None:
        self.options = options
        self.progress: Progress | None = None
        self.token = 0  # the progressToken the child gets (call_meta); 0: none
        self.task: asyncio.Task[None] | None = None
        self.cancelled = False  # by its caller: no further answer
        self.asks: CallAsks | None = None  # its caller answers a child's requests (runtime/calls/asking.py)
        self.ref = 0  # _meta["mesh/call"] of an answering call: a child's requests name it; 0: none
        self.task_key: str | None = None  # a detached call's record (runtime/calls/tasks.py)

    @property
    def begins_now(self) -> bool:
        """Whether `start` may write it to its child at once: not cancelled, its arguments not in the store,
        not detached (its task record is written first)."""
        return not (self.cancelled or self.options.request_object or self.options.detached)

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
    with the call's progress token added when its caller asked for progress, and its call reference
    when its caller answers."""
    if call is None or not (call.token or call.ref):
        return base
    fields = b'"progressToken":%d' % call.token if call.token else b""
    if call.ref:
        fields += (b"," if fields else b"") + b'"%s":%d' % (CALL_REF.encode(), call.ref)
    if not base or base == b"{}":
        return b"{" + fields + b"}"
    return base[:-1] + b"," + fields + b"}"


class CallDesk:
    """Calls with options in flight on this node, and the cancels and progress that reach them."""

    def __init__(
        self, nc: Client, settings: CallSettings, node: str = "node", stamp: CallerStamp | None = None
    ) -> None:
        self.nc = nc
        self.settings = settings
        self.objects = ObjectHandoff(nc, settings.object_bucket, settings.object_ttl_s, settings.object_cap_bytes)
        self.asking = Asking(nc, node)
        self.tasks = TaskStore(
            nc,
            node,
            stamp or CallerStamp(local_caller(None)),
            self.objects,
            settings.tasks_bucket,
            settings.tasks_ttl_s,
            settings.tasks_max_bytes,
            self.cancel_local,
        )
        self.asking.record_ask = self.tasks.record_ask
        self._by_ref: dict[int, OpenCall] = {}
        self._answering: dict[object, set[OpenCall]] = {}  # bundle runner -> its answering calls in flight
        self._next_ref = 0
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
        await self.asking.start()
        await self.tasks.start(queue_group)

    async def stop(self) -> None:
        for sub in self._subs:
            await sub.unsubscribe()
        self._subs = []
        await self.asking.stop()
        await self.tasks.stop()

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
        on = msg._client if msg._client is not None else self.nc
        if options.answers and call_id is not None and (msg.reply or options.detached):
            call.asks = CallAsks(call_id, account, options.person, msg.reply, on, options.detached)
            self._next_ref += 1
            call.ref = self._next_ref
            self._by_ref[call.ref] = call
        if options.progress and msg.reply and not options.detached:
            self._next_token += 1
            call.token = self._next_token
            # Frames on the connection the final reply takes (the request's own, calls/dispatch.py):
            # one connection keeps them in order, and none comes after the reply.
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
        if call.asks is not None:
            self.asking.end(call.asks)
            self._by_ref.pop(call.ref, None)
            mine = self._answering.get(call.asks.owner)
            if mine is not None:
                mine.discard(call)
                if not mine:
                    del self._answering[call.asks.owner]

    def begun(self, call: OpenCall, owner: object) -> None:
        """The call went to `owner`'s child: a request of that child without a call reference may be its."""
        if call.asks is not None and call.asks.owner is None:
            call.asks.owner = owner
            self._answering.setdefault(owner, set()).add(call)

    def ask(self, owner: object, session: Session, rid: int | str, method: str, params: msgspec.Raw) -> bool:
        """A child's own request: passed to the caller of the call it belongs to, or refused at once."""
        if method not in ASK_METHODS:
            return False
        ref = _call_ref(params)
        if ref is not None:
            call = self._by_ref.get(ref)
            if call is None or call.asks is None or call.asks.owner is not owner:
                self.asking.refuse(
                    session,
                    rid,
                    ASK_REFUSED,
                    f"{method} names call {ref} (_meta {CALL_REF}): no such call is in flight here",
                )
                return True
        else:
            mine = self._answering.get(owner)
            if not mine:
                self.asking.refuse(
                    session,
                    rid,
                    CANNOT_ASK,
                    f"{method}: the caller of this call cannot answer it (its request did not say Mesh-Answers: 1); "
                    "go on without the answer, or fail saying what the tool needed",
                )
                return True
            if len(mine) > 1 or session.in_flight > 1:
                self.asking.refuse(
                    session,
                    rid,
                    ASK_REFUSED,
                    f"{method} names no call while {session.in_flight} are in flight on this child; copy "
                    f"_meta[{CALL_REF!r}] of the tools/call it belongs to onto the request",
                )
                return True
            call = next(iter(mine))
        assert call.asks is not None
        self.asking.ask(call.asks, session, rid, method, params)
        return True

    def cancel_local(self, call_id: str, account: str | None, reason: str) -> bool:
        """Cancel a call of this node by id and account (a task's cancel, its owner already checked)."""
        same_id = self.open_calls.get(call_id)
        call = same_id.get(account) if same_id is not None else None
        if call is None:
            return False
        self.cancels_honoured += 1
        call.cancel(reason)
        return True

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


class _Meta(msgspec.Struct):
    meta: dict[str, msgspec.Raw] = msgspec.field(default_factory=dict, name="_meta")


_decode_meta = msgspec.json.Decoder(_Meta).decode


def _call_ref(params: msgspec.Raw) -> int | None:
    """`_meta["mesh/call"]` of a child's request, when it names one (an integer)."""
    if CALL_REF.encode() not in bytes(params):
        return None
    try:
        raw = _decode_meta(params).meta.get(CALL_REF)
        ref = msgspec.json.decode(raw) if raw is not None else None
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return ref if isinstance(ref, int) and not isinstance(ref, bool) else None


ProgressHook = Callable[[object, msgspec.Raw], None]
