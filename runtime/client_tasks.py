"""The caller's side of asking and detached calls (docs/bus.md): answers, tasks, their results.

`MeshClient` (runtime/client.py) carries these methods; they are here to keep each file short.

    record = await caller.start("mesh.tool.jobs.build", {"ref": "main"})   # a task, at once
    record = await caller.task_result(record.task, wait_s=600)             # ... later, from anywhere
    result = await caller.result_of(record)                                # its CallToolResult bytes
"""

from __future__ import annotations

import json
import secrets
from typing import Any, Awaitable, Callable

import anyio
import msgspec
import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg

from runtime.wire.asking import (
    ANSWERS,
    DETACHED,
    MAX_WAIT_MS,
    TERMINAL,
    AnswerBody,
    AnswerError,
    AskFrame,
    TaskListQuery,
    TaskPage,
    TaskQuery,
    TaskRecord,
    task_subject,
)
from runtime.wire.callproto import CALL_ID, TIMEOUT_MS, ObjectRef
from runtime.wire.errors import HEADER_CODE
from runtime.wire.identity import PERSON, Person, encode_person

_encode = msgspec.json.Encoder().encode
_decode_record = msgspec.json.Decoder(TaskRecord).decode
_decode_page = msgspec.json.Decoder(TaskPage).decode
decode_ask = msgspec.json.Decoder(AskFrame).decode


class AskRefused(Exception):
    """Raised by an ask handler to answer the child's request with a JSON-RPC error."""

    def __init__(self, message: str, code: int = -1) -> None:
        self.code, self.message = code, message
        super().__init__(message)


# An ask handler: the child's request (method, params) -> its JSON-RPC result (a dict); AskRefused for an error.
AskHandler = Callable[[AskFrame], Awaitable[dict[str, Any]]]


class TaskFailed(Exception):
    """A task whose record says failed or cancelled, asked for its result."""

    def __init__(self, record: TaskRecord) -> None:
        self.record = record
        why = record.error.message if record.error is not None else record.state
        super().__init__(f"task {record.task}: {why}")


class TaskCalls:
    """Asking and tasks over `self.nc` (mixed into MeshClient)."""

    nc: Client

    async def _fetch(self, subject: str, ref: ObjectRef) -> bytes:
        raise NotImplementedError

    def _refused(self, subject: str, msg: Msg) -> Exception:
        raise NotImplementedError

    async def answer(
        self,
        frame: AskFrame,
        result: dict[str, Any] | None = None,
        *,
        error: tuple[int, str] | None = None,
        person: Person | None = None,
    ) -> None:
        """Send the answer to an ask (a result for the child, or an error); the node says it took it."""
        if error is not None:
            body = AnswerBody(error=AnswerError(code=error[0], message=error[1]))
        else:
            body = AnswerBody(result=msgspec.Raw(_encode(result)))
        headers = {PERSON: encode_person(person)} if person is not None else None
        reply = await self.nc.request(frame.answer, _encode(body), timeout=10, headers=headers)
        if reply.headers and HEADER_CODE in reply.headers:
            raise self._refused(frame.answer, reply)

    async def _answer_with(self, handler: AskHandler, frame: AskFrame, person: Person | None) -> None:
        try:
            result = await handler(frame)
        except AskRefused as e:
            await self.answer(frame, error=(e.code, e.message), person=person)
            return
        await self.answer(frame, result, person=person)

    async def start(
        self,
        subject: str,
        arguments: dict[str, Any] | bytes | None = None,
        *,
        timeout_s: float = 3600.0,
        answers: bool = False,
        person: Person | None = None,
        call_id: str | None = None,
    ) -> TaskRecord:
        """A detached call: its task record at once (state working); the call runs on without this caller.

        `answers`: the tool may ask (its record says input_required; answer with `answer`, or let
        `task_result` do it with a handler)."""
        body = arguments if isinstance(arguments, bytes) else _encode(arguments if arguments is not None else {})
        headers = {CALL_ID: call_id or secrets.token_urlsafe(16), DETACHED: "1"}
        headers[TIMEOUT_MS] = str(max(1, int(timeout_s * 1000)))
        if answers:
            headers[ANSWERS] = "1"
        if person is not None:
            headers[PERSON] = encode_person(person)
        return await self._task_request(subject, body, headers, 30)

    async def task(self, task: str, *, person: Person | None = None) -> TaskRecord:
        """A task's record now (404 unless it is this caller's own)."""
        return await self._task_request(task_subject("get"), _encode(TaskQuery(task=task)), _person(person), 10)

    async def task_result(
        self,
        task: str,
        *,
        wait_s: float = 60.0,
        person: Person | None = None,
        on_ask: AskHandler | None = None,
    ) -> TaskRecord:
        """The task's record once it ends (completed, failed, cancelled), or as it is after `wait_s`.

        Each request waits at most 60 s (the node's bound); longer waits ask again. With `on_ask`, a
        task that asks is answered and waited for on; without, its input_required record is returned.
        """
        deadline = anyio.current_time() + wait_s
        answered: set[int] = set()
        while True:
            left_ms = int(max(0.0, deadline - anyio.current_time()) * 1000)
            query = TaskQuery(task=task, wait_ms=min(MAX_WAIT_MS, left_ms))
            record = await self._task_request(
                task_subject("result"), _encode(query), _person(person), query.wait_ms / 1000 + 10
            )
            if record.state in TERMINAL or left_ms <= 0:
                return record
            if record.state == "input_required" and record.ask is not None:
                if on_ask is None:
                    return record
                if record.ask.ask not in answered:
                    answered.add(record.ask.ask)
                    await self._answer_with(on_ask, record.ask, person)
                else:
                    await anyio.sleep(0.05)  # answered; its record is on its way back to working

    async def result_of(self, record: TaskRecord) -> bytes:
        """A completed task's CallToolResult bytes (read from the object store when large); TaskFailed otherwise."""
        if record.state != "completed":
            raise TaskFailed(record)
        if record.result_object is not None:
            return await self._fetch(record.subject, record.result_object)
        return bytes(record.result) or b"{}"

    async def tasks(self, cursor: str | None = None, *, limit: int = 100, person: Person | None = None) -> TaskPage:
        """This caller's tasks, oldest first, a page at a time (`next_cursor` for the next)."""
        query = _encode(TaskListQuery(cursor=cursor, limit=limit))
        reply = await self._task_reply(task_subject("list"), query, _person(person), 15)
        return _decode_page(reply.data)

    async def cancel(self, task: str, *, person: Person | None = None) -> TaskRecord:
        """Cancel a task of this caller's (the child is told); its record after."""
        return await self._task_request(task_subject("cancel"), _encode(TaskQuery(task=task)), _person(person), 10)

    async def _task_request(
        self, subject: str, body: bytes, headers: dict[str, str] | None, timeout: float
    ) -> TaskRecord:
        return _decode_record((await self._task_reply(subject, body, headers, timeout)).data)

    async def _task_reply(self, subject: str, body: bytes, headers: dict[str, str] | None, timeout: float) -> Msg:
        try:
            reply = await self.nc.request(subject, body, timeout=timeout, headers=headers)
        except nats.errors.NoRespondersError:
            raise self._refused(subject, Msg(self.nc, subject=subject, headers={"Status": "503"})) from None
        if reply.headers and (HEADER_CODE in reply.headers or reply.headers.get("Status") == "503"):
            raise self._refused(subject, reply)
        return reply


def _person(person: Person | None) -> dict[str, str] | None:
    return {PERSON: encode_person(person)} if person is not None else None


def ask_text(frame: AskFrame) -> dict[str, Any]:
    """The ask's params as a dict (the child's request: an elicitation's message and requestedSchema ...)."""
    params = json.loads(bytes(frame.params)) if frame.params else {}
    return params if isinstance(params, dict) else {}
