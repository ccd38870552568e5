"""The bus call protocol, caller's side: a deadline, cancellation, progress and large results.

    async with anyio.create_task_group() as tg:          # or any cancel scope
        caller = MeshClient(nc)
        result = await caller.call("mesh.tool.hello.greet", {"name": "Ada"},
                                   timeout_s=10, on_progress=print)

`call` returns the tool's CallToolResult as the JSON bytes the node sent (a result parked in the
object store is fetched and checked). Cancelling the task that awaits `call` (a cancel scope,
Ctrl-C) publishes the call's cancel before the cancellation goes on. The node never imports
this module; docs/bus.md is the protocol it speaks, for callers in other languages.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import json
import logging
import secrets
from typing import Any, Callable

import anyio
import msgspec
import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from runtime.calls.objects import DEFAULT_CAP, put_request
from runtime.client_tasks import AskHandler, AskRefused, TaskCalls, TaskFailed, decode_ask
from runtime.wire.asking import ANSWERS, FRAME_ASK, AskFrame, TaskRecord
from runtime.wire.callproto import (
    CALL_ID,
    DEFAULT_BUCKET,
    FRAME,
    FRAME_CHUNK,
    FRAME_KEEPALIVE,
    FRAME_PROGRESS,
    PROGRESS,
    REQUEST_OBJECT,
    RESULT_OBJECT,
    TIMEOUT_MS,
    TRACEPARENT,
    TRACESTATE,
    CancelBody,
    KeepaliveFrame,
    ObjectRef,
    ProgressFrame,
    new_traceparent,
    valid_traceparent,
)
from runtime.wire.errors import HEADER_CODE, HEADER_TEXT
from runtime.wire.identity import PERSON, Person, encode_person
from runtime.wire.subjects import cancel_subject, fetch_subject

__all__ = ["AskFrame", "AskHandler", "AskRefused", "TaskFailed", "TaskRecord"]  # with MeshClient's own

HEADROOM = 4096  # bytes of a message left for headers when deciding whether a body fits
REPLY_GRACE_S = 2.0  # how long past its deadline a caller waits for the node's own 504
FETCH_SILENCE_S = 30.0  # a result object's chunks stop coming for this long: the node is gone
FRAMES_KEPT = 256  # interim frames kept per call until the caller's loop takes them; past it the oldest go

log = logging.getLogger("mesh.client")
_decode_progress = msgspec.json.Decoder(ProgressFrame).decode
_decode_keepalive = msgspec.json.Decoder(KeepaliveFrame).decode
_decode_ref = msgspec.json.Decoder(ObjectRef).decode
_encode = msgspec.json.Encoder().encode


class CallError(Exception):
    """A call that did not give a result; `code` is the node's (400 ... 504) or the caller's own."""

    code: int = 0

    def __init__(self, subject: str, message: str, code: int = 0, body: dict[str, Any] | None = None) -> None:
        self.subject, self.message, self.body = subject, message, body or {}
        if code:
            self.code = code
        super().__init__(f"{subject}: {message}")


class NodeRefused(CallError):
    """The node answered with a runtime error (Nats-Service-Error-Code)."""


class NoResponders(CallError):
    code = 503


class NodeSilent(CallError):
    """No frame within three keepalive intervals of a call that asked for progress: the node is gone."""

    code = 504


class NoAnswer(CallError):
    """Nothing came back by the deadline and its grace (not even the node's 504)."""

    code = 504


class _Waiter:
    """One call's replies. Keepalives (and frames the caller does not read) are taken in
    `_on_reply` as signs of life, without waking the caller: its wait's timer looks at `heard`."""

    __slots__ = ("frames", "final", "wake", "heard", "silence", "wants_progress", "answers")

    def __init__(self, now: float, silence: float | None, answers: bool = False) -> None:
        self.answers = answers  # ask frames are kept for the caller's handler
        self.frames: collections.deque[Msg] = collections.deque(maxlen=FRAMES_KEPT)
        self.final: Msg | None = None
        self.wake: asyncio.Future[None] | None = None  # while the caller waits for the next message
        self.heard = now  # the loop's time of the last message from the node
        self.silence = silence  # this long without a message: the node is gone (None: not watched)
        self.wants_progress = silence is not None

    def poke(self) -> None:
        _wake_up(self.wake)


def _wake_up(wake: asyncio.Future[None] | None) -> None:
    if wake is not None and not wake.done():
        wake.set_result(None)


class MeshClient(TaskCalls):
    """Calls tools over one NATS connection; many calls may be in flight at once.

    `keepalive_s`: the node's keepalive interval assumed until its first keepalive says it.
    """

    def __init__(
        self, nc: Client, *, bucket: str = DEFAULT_BUCKET, result_cap: int = DEFAULT_CAP, keepalive_s: float = 5.0
    ) -> None:
        self.nc, self.bucket, self.result_cap, self.keepalive_s = nc, bucket, result_cap, keepalive_s
        self._prefix = ""
        self._sub: Subscription | None = None
        self._waiters: dict[str, _Waiter] = {}
        self._next = 0

    async def _inbox(self) -> str:
        if self._sub is None:
            self._prefix = self.nc.new_inbox()
            self._sub = await self.nc.subscribe(self._prefix + ".*", cb=self._on_reply)
        self._next += 1
        return f"{self._prefix}.{self._next}"

    async def close(self) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None

    async def _on_reply(self, msg: Msg) -> None:
        waiter = self._waiters.get(msg.subject)
        if waiter is None:
            return  # a late frame of a call that is over
        if msg.headers and FRAME in msg.headers:
            waiter.heard = asyncio.get_running_loop().time()
            kind = msg.headers.get(FRAME)
            if kind == FRAME_KEEPALIVE:
                if waiter.silence is not None:
                    try:
                        # The node says how often it speaks: three of its intervals of silence mean it is gone.
                        waiter.silence = 3 * max(0.1, _decode_keepalive(msg.data).interval_ms / 1000)
                    except (msgspec.DecodeError, msgspec.ValidationError):
                        pass  # a frame this client does not understand is not the call's end
                return
            if kind == FRAME_ASK:
                if not waiter.answers:
                    return  # the node does not send one unasked; nothing to do with it
            elif kind != FRAME_PROGRESS or not waiter.wants_progress:
                return  # still a sign of life
            waiter.frames.append(msg)
        else:
            waiter.final = msg
        waiter.poke()

    async def call(
        self,
        subject: str,
        arguments: dict[str, Any] | bytes | None = None,
        *,
        timeout_s: float = 60.0,
        on_progress: Callable[[ProgressFrame], None] | None = None,
        cancel_reason: str = "the caller cancelled the call",
        traceparent: str | None = None,
        tracestate: str | None = None,
        person: Person | None = None,
        on_ask: AskHandler | None = None,
    ) -> bytes:
        """The CallToolResult's JSON bytes, or a CallError; cancelling the awaiting task cancels the call.

        `on_ask`: this caller answers the tool's requests (an elicitation, sampling, roots): the handler
        gets each ask and returns its result (raises AskRefused to answer with an error); without it
        the tool learns at once that its caller cannot answer.

        `traceparent`/`tracestate`: the caller's W3C trace context, passed on as NATS headers (a node
        that traces continues it); without one, the call starts a trace of its own. `person`: the
        human behind this call, for a delegate (an MCP face, a console) to pass; a node refuses it
        (400) from any caller not listed in its `[identity] delegates`.
        """
        body = arguments if isinstance(arguments, bytes) else _encode(arguments if arguments is not None else {})
        call_id = secrets.token_urlsafe(16)
        headers = {CALL_ID: call_id, TIMEOUT_MS: str(max(1, int(timeout_s * 1000)))}
        headers[TRACEPARENT] = traceparent if traceparent and valid_traceparent(traceparent) else new_traceparent()
        if tracestate and traceparent and len(tracestate) <= 512:
            headers[TRACESTATE] = tracestate
        if person is not None:
            headers[PERSON] = encode_person(person)
        if on_progress is not None:
            headers[PROGRESS] = "1"
        if on_ask is not None:
            headers[ANSWERS] = "1"
        if len(body) > (limit := (self.nc.max_payload or 1024 * 1024) - HEADROOM):
            headers[REQUEST_OBJECT] = await self._put_request(subject, body, limit)
            body = b""
        reply = await self._inbox()
        silence = 3 * self.keepalive_s if on_progress is not None else None
        waiter = self._waiters[reply] = _Waiter(asyncio.get_running_loop().time(), silence, on_ask is not None)
        try:
            await self.nc.publish(subject, body, reply=reply, headers=headers)
            final = await self._wait(subject, waiter, timeout_s, on_progress, on_ask, person)
        except BaseException:
            # Cancelled, timed out or the node went silent: the node stops the call in its child.
            with anyio.CancelScope(shield=True):
                await self._cancel(call_id, cancel_reason)
            raise
        finally:
            del self._waiters[reply]
        return await self._result(subject, final)

    async def _put_request(self, subject: str, body: bytes, limit: int) -> str:
        """Arguments larger than one message into the object store; 413 naming why when this connection cannot."""
        try:
            with anyio.fail_after(30):
                return await put_request(self.nc, body, self.bucket)
        except Exception as e:  # no JetStream here (another account), no permission, a full store
            raise CallError(
                subject,
                f"the arguments are {len(body)} bytes, more than one message carries ({limit}); handing them over "
                f"needs JetStream on the object store {self.bucket}, which this connection cannot use "
                f"({type(e).__name__}: {e}); send smaller arguments",
                413,
            ) from None

    async def _cancel(self, call_id: str, reason: str) -> None:
        try:
            await self.nc.publish(cancel_subject(call_id), _encode(CancelBody(reason=reason)))
            await self.nc.flush(1)
        except Exception:  # the bus is gone: the node's deadline ends the call
            pass

    async def _wait(
        self,
        subject: str,
        waiter: _Waiter,
        timeout_s: float,
        on_progress: Callable[[ProgressFrame], None] | None,
        on_ask: AskHandler | None = None,
        person: Person | None = None,
    ) -> Msg:
        # nats-py is asyncio's, and so is this wait: a future and a timer handle per wait (an anyio
        # cancel scope and Event cost about 15 us a call, on the face's hot path). A cancel of the
        # awaiting task (anyio's scopes included) ends the wait at `await wake`.
        loop = asyncio.get_running_loop()
        loop_time = loop.time
        give_up = loop_time() + timeout_s + REPLY_GRACE_S
        while True:
            while waiter.frames:
                frame = waiter.frames.popleft()
                if on_ask is not None and (frame.headers or {}).get(FRAME) == FRAME_ASK:
                    await self._ask(subject, frame, on_ask, person)
                    waiter.heard = loop_time()  # the time the caller took to answer is not the node's silence
                    continue
                if on_progress is not None:
                    try:
                        on_progress(_decode_progress(frame.data))
                    except (msgspec.DecodeError, msgspec.ValidationError):
                        pass  # a frame this client does not understand is not the call's end
            if waiter.final is not None:
                return waiter.final
            now = loop_time()
            if now >= give_up:
                raise NoAnswer(subject, f"no answer within {timeout_s:g} s (and {REPLY_GRACE_S:g} s of grace)")
            wait = give_up - now
            silence, heard = waiter.silence, waiter.heard
            if silence is not None:
                if now - heard >= silence:
                    raise NodeSilent(
                        subject,
                        f"no progress or keepalive for {silence:g} s; the node serving the call is gone or cut off",
                    )
                wait = min(wait, heard + silence - now)
            wake = waiter.wake = loop.create_future()
            timer = loop.call_at(now + wait, _wake_up, wake)
            try:
                await wake
            finally:
                timer.cancel()
                waiter.wake = None

    async def _ask(self, subject: str, frame: Msg, on_ask: AskHandler, person: Person | None) -> None:
        try:
            ask = decode_ask(frame.data)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return  # not an ask this client understands; the call's end answers the child
        try:
            await self._answer_with(on_ask, ask, person)
        except (CallError, nats.errors.Error) as e:  # the ask ended (its call did): the final reply says how
            log.info("%s: the answer to ask %d was not taken: %s", subject, ask.ask, e)

    def _refused(self, subject: str, msg: Msg) -> Exception:
        return _refused_error(subject, msg)

    async def _result(self, subject: str, msg: Msg) -> bytes:
        headers = msg.headers or {}
        if headers.get("Status") == "503" or HEADER_CODE in headers:
            raise _refused_error(subject, msg)
        if RESULT_OBJECT in headers:
            return await self._fetch(subject, _decode_ref(msg.data))
        return msg.data

    async def _fetch(self, subject: str, ref: ObjectRef) -> bytes:
        """A result parked in the object store, read through a node (`mesh.fetch.<name>`) and checked."""
        if ref.size > self.result_cap:
            raise CallError(
                subject,
                f"the result ({ref.size} bytes, object {ref.name}) is larger than this "
                f"caller takes ({self.result_cap} bytes)",
                413,
            )
        inbox = self.nc.new_inbox()
        # Room for every chunk at once: the node sends them as fast as the bus takes them.
        sub = await self.nc.subscribe(inbox, pending_bytes_limit=ref.size + 8 * 1024 * 1024)
        parts: list[bytes] = []
        got = 0
        try:
            await self.nc.publish(fetch_subject(ref.name), b"", reply=inbox)
            while True:
                try:
                    msg = await sub.next_msg(timeout=FETCH_SILENCE_S)
                except nats.errors.TimeoutError:
                    raise NoAnswer(
                        subject,
                        f"result object {ref.name}: nothing for {FETCH_SILENCE_S:g} s after {got} of {ref.size} bytes",
                    ) from None
                headers = msg.headers or {}
                if headers.get(FRAME) == FRAME_CHUNK:
                    got += len(msg.data)
                    if got > ref.size:
                        raise CallError(subject, f"result object {ref.name} is longer than its reply says", 502)
                    parts.append(msg.data)
                    continue
                if HEADER_CODE in headers or headers.get("Status") == "503":
                    raise _refused_error(subject, msg)
                break
        finally:
            await sub.unsubscribe()
        data = b"".join(parts)
        if len(data) != ref.size or hashlib.sha256(data).hexdigest() != ref.sha256:
            raise CallError(subject, f"result object {ref.name} is not what the reply says (size or sha256)", 502)
        return data


def _refused_error(subject: str, msg: Msg) -> CallError:
    headers = msg.headers or {}
    if HEADER_CODE not in headers:
        return NoResponders(subject, "no node serves this subject (no responders)")
    try:
        body = json.loads(msg.data)
    except ValueError:
        body = {}
    code = int(headers[HEADER_CODE]) if headers[HEADER_CODE].isdigit() else 500
    return NodeRefused(subject, headers.get(HEADER_TEXT, ""), code, body)


def tool_result(data: bytes) -> dict[str, Any]:
    """The CallToolResult as a dict."""
    result = json.loads(data)
    if not isinstance(result, dict):
        raise ValueError("the result is not a JSON object")
    return result
