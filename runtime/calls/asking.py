"""A child's requests to its caller during a call (elicitation, sampling, roots), across the bus.

The node passes a child's `elicitation/create`, `sampling/createMessage` or `roots/list` to the
caller of the call it belongs to, as an ask frame on the call's reply subject (or, for a detached
call, in its task record), and hands the caller's answer back to the child as the response. An
answer comes as a request on `mesh.answer.<node>.<call id>.<n>` (one subscription per node) and
is taken only from the call's own account and person, while the call runs; everything else about
it is checked (runtime/wire/asking.py). A call whose caller cannot answer, or past its bounds,
gets a JSON-RPC error on the child's request at once: the child never hangs on the node.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable, Coroutine

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from launcher.session import Session
from runtime.wire.asking import (
    ANSWER_PREFIX,
    FRAME_ASK,
    MAX_ASK_BYTES,
    MAX_ASKS_PER_CALL,
    MAX_OPEN_ASKS,
    AnswerTaken,
    AskFrame,
    NotFound,
    answer_subject,
    check_answer,
    parse_answer_subject,
)
from runtime.wire.callproto import FRAME, request_account
from runtime.wire.errors import BadRequest, NodeError, render
from runtime.wire.identity import PERSON

log = logging.getLogger("mesh.asking")

_encode = msgspec.json.Encoder().encode
# JSON-RPC error codes the child gets from the node (not from the caller).
CANNOT_ASK = -32601  # as "method not found": this caller offers nothing of the kind
ASK_REFUSED = -32600  # past a bound, or naming no call


class WaitingAsk:
    __slots__ = ("session", "rid", "frame")

    def __init__(self, session: Session, rid: int | str, frame: AskFrame) -> None:
        self.session, self.rid, self.frame = session, rid, frame


class CallAsks:
    """One answering call's asking: where its asks go, how many it made, those waiting for answers."""

    __slots__ = (
        "call_id",
        "account",
        "person",
        "reply",
        "conn",
        "deadline",
        "made",
        "waiting",
        "detached",
        "owner",
        "task_key",
    )

    def __init__(
        self, call_id: str, account: str | None, person: str | None, reply: str, conn: Client, detached: bool
    ) -> None:
        self.call_id, self.account, self.person = call_id, account, person
        self.reply, self.conn, self.detached = reply, conn, detached
        self.deadline = 0.0  # loop clock; set when the call is admitted
        self.made = 0
        self.waiting: dict[int, WaitingAsk] = {}
        self.owner: object = None  # the bundle runner the call went to
        self.task_key: str | None = None  # a detached call's record (runtime/calls/tasks.py)


# A detached call's ask (or its end, None) goes to its task record instead of a reply subject.
RecordAsk = Callable[[CallAsks, AskFrame | None], Coroutine[Any, Any, None]]


class Asking:
    """The node's asks in flight and the one subscription their answers arrive on."""

    def __init__(self, nc: Client, node: str) -> None:
        self.nc, self.node = nc, node
        self.record_ask: RecordAsk | None = None  # set by the task store
        self._waiting: dict[tuple[str | None, str, int], CallAsks] = {}
        self._sub: Subscription | None = None
        self._tasks: set[asyncio.Task[None]] = set()  # frames on their way; ended by `stop`
        self.asked = 0
        self.answered = 0
        self.refused = 0

    async def start(self) -> None:
        self._sub = await self.nc.subscribe(f"{ANSWER_PREFIX}{self.node}.>", cb=self._on_answer)

    async def stop(self) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def refuse(self, session: Session, rid: int | str, code: int, message: str) -> None:
        self.refused += 1
        session.respond(rid, error=(code, message))

    def ask(self, call: CallAsks, session: Session, rid: int | str, method: str, params: msgspec.Raw) -> None:
        """A child's request for this call's caller: its frame sent, or refused at once saying why."""
        size = len(bytes(params))
        if size > MAX_ASK_BYTES:
            return self.refuse(
                session,
                rid,
                ASK_REFUSED,
                f"{method}: its params are {size} bytes; the mesh passes at most {MAX_ASK_BYTES}",
            )
        if call.made >= MAX_ASKS_PER_CALL:
            return self.refuse(
                session,
                rid,
                ASK_REFUSED,
                f"{method}: this call already asked {MAX_ASKS_PER_CALL} times, the most a call may",
            )
        if len(call.waiting) >= MAX_OPEN_ASKS:
            return self.refuse(
                session, rid, ASK_REFUSED, f"{method}: {MAX_OPEN_ASKS} asks of this call already wait for their answer"
            )
        loop = asyncio.get_running_loop()
        left_ms = int((call.deadline - loop.time()) * 1000) if call.deadline else 0
        if call.deadline and left_ms <= 0:
            return self.refuse(session, rid, ASK_REFUSED, f"{method}: the call's deadline has passed")
        call.made += 1
        n = call.made
        frame = AskFrame(
            ask=n,
            method=method,
            params=params if size else msgspec.Raw(b"{}"),
            answer=answer_subject(self.node, call.call_id, n),
            timeout_ms=max(0, left_ms),
        )
        call.waiting[n] = WaitingAsk(session, rid, frame)
        self._waiting[(call.account, call.call_id, n)] = call
        self.asked += 1
        task = loop.create_task(self._send(call, frame))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, call: CallAsks, frame: AskFrame) -> None:
        try:
            if call.detached:
                if self.record_ask is not None:
                    await self.record_ask(call, frame)
            else:
                await call.conn.publish(call.reply, _encode(frame), headers={FRAME: FRAME_ASK})
        except Exception as e:  # the bus is gone: the call's end answers the child
            log.warning("ask %d of call %s not sent: %s", frame.ask, call.call_id, e)

    def end(self, call: CallAsks) -> None:
        """The call is over: every ask still waiting is answered with an error, so no child waits on."""
        for n, waiting in list(call.waiting.items()):
            self._waiting.pop((call.account, call.call_id, n), None)
            waiting.session.respond(
                waiting.rid, error=(ASK_REFUSED, f"{waiting.frame.method}: the call ended before its caller answered")
            )
        call.waiting.clear()

    async def _on_answer(self, msg: Msg) -> None:
        try:
            n = self._take(msg)
        except NodeError as e:
            self.refused += 1
            if msg.reply:
                body, headers = render(e)
                await self.nc.publish(msg.reply, body, headers=headers)
            return
        if msg.reply:
            await self.nc.publish(msg.reply, _encode(AnswerTaken(ask=n)))

    def _take(self, msg: Msg) -> int:
        """The answer handed to the child; NotFound unless it is the call's own caller's, to an ask waiting."""
        subject = msg.subject[:200]
        found = parse_answer_subject(self.node, msg.subject)
        if found is None:
            raise NotFound(subject, "not an answer subject; answer on the subject the ask frame names")
        call_id, n = found
        try:
            account = request_account(msg.headers)
        except ValueError as e:
            raise BadRequest(subject, str(e), field="header Nats-Request-Info") from None
        call = self._waiting.get((account, call_id, n))
        person = ((msg.headers or {}).get(PERSON) or "").strip() or None
        if call is None or call.person != person:
            # Another account's or person's answer finds nothing, as if there were no such ask.
            raise NotFound(subject, f"no ask {n} of call {call_id} waits for your answer (answered, or its call ended)")
        checked = check_answer(msg.data)
        if isinstance(checked, str):
            raise BadRequest(subject, checked)
        del self._waiting[(account, call_id, n)]
        waiting = call.waiting.pop(n)
        if checked.error is not None:
            waiting.session.respond(waiting.rid, error=(checked.error.code, checked.error.message))
        else:
            waiting.session.respond(waiting.rid, bytes(checked.result))
        self.answered += 1
        if call.detached and self.record_ask is not None and not call.waiting:
            task = asyncio.get_running_loop().create_task(self.record_ask(call, None))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return n
