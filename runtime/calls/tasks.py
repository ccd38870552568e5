"""Detached calls: a call that outlives its caller's request, kept as a task in the mesh-tasks bucket.

A request with `Mesh-Detached: 1` is answered at once with its task record (state `working`,
header Mesh-Task); the node runs the call on as any other and writes its end into the record: the
result (or, larger than a message, a reference to it in the calls object store, owned by the
caller's account), or the runtime's error, or `cancelled`. The bucket's max age is the tasks' TTL.

Every node serves `mesh.task.get/result/list/cancel` (queue group): a record's key starts with a
hash of its owner (the caller's account and id, as the node's caller stamp reads the request), so
a request names only its own caller's tasks: another person's id finds nothing. A cancel goes to
the node that runs the call (`mesh.taskstop.<node>`, inside the mesh account), which cancels it
in the child. The bucket is opened at the first detached call or task request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Awaitable, Callable

import anyio
import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import api
from nats.js.errors import BucketNotFoundError, KeyNotFoundError
from nats.js.kv import KeyValue

from runtime.calls.asking import CallAsks
from runtime.calls.identity import CallerStamp
from runtime.calls.objects import ObjectHandoff
from runtime.wire.asking import (
    LIST_LIMIT,
    MAX_WAIT_MS,
    TASK,
    TASK_VERBS,
    TERMINAL,
    AskFrame,
    NotFound,
    TaskError,
    TaskListQuery,
    TaskPage,
    TaskQuery,
    TaskRecord,
    TaskState,
    TaskStop,
    owner_key,
    task_key,
    task_stop_subject,
    task_subject,
)
from runtime.wire.callproto import ObjectRef, request_account, valid_call_id
from runtime.wire.errors import BadRequest, Internal, NodeError, render
from runtime.wire.identity import CALLER_KEY, PERSON, Caller, CallerError

log = logging.getLogger("mesh.tasks")

MAX_WAITERS = 256  # mesh.task.result requests waiting at once on one node; past it they answer at once
MAX_LISTED = 1000  # records of one owner read for a list
HEADROOM = 8192  # bytes of a message kept for the record around an inline result

_encode = msgspec.json.Encoder().encode
_decode_record = msgspec.json.Decoder(TaskRecord).decode
_decode_query = msgspec.json.Decoder(TaskQuery).decode
_decode_list = msgspec.json.Decoder(TaskListQuery).decode
_decode_stop = msgspec.json.Decoder(TaskStop).decode
_decode_meta = msgspec.json.Decoder(dict[str, Caller]).decode


def _now_ms() -> int:
    return int(time.time() * 1000)


class TaskStore:
    """The tasks this node runs, and the task verbs every node serves."""

    def __init__(
        self,
        nc: Client,
        node: str,
        stamp: CallerStamp,
        objects: ObjectHandoff,
        bucket: str,
        ttl_s: float,
        max_bytes: int,
        cancel: Callable[[str, str | None, str], bool],
    ) -> None:
        self.nc, self.node, self.stamp, self.objects = nc, node, stamp, objects
        self.bucket, self.ttl_s, self.max_bytes = bucket, ttl_s, max_bytes
        self._cancel_local = cancel  # (call id, account, reason) -> whether a call was found
        self._kv: KeyValue | None = None
        self._lock = asyncio.Lock()
        self._live: dict[str, TaskRecord] = {}  # key -> the record of a call running here
        self._subs: list[Subscription] = []
        self._waiters = 0
        self.started = 0

    async def start(self, queue_group: str) -> None:
        for verb in TASK_VERBS:
            self._subs.append(await self.nc.subscribe(task_subject(verb), queue=queue_group, cb=self._serve(verb)))
        self._subs.append(await self.nc.subscribe(task_stop_subject(self.node), cb=self._on_stop))

    async def stop(self) -> None:
        for sub in self._subs:
            await sub.unsubscribe()
        self._subs = []

    async def _open(self) -> KeyValue:
        if self._kv is not None:
            return self._kv
        async with self._lock:
            if self._kv is None:
                js = self.nc.jetstream()
                try:
                    self._kv = await js.key_value(self.bucket)
                except BucketNotFoundError:
                    config = api.KeyValueConfig(
                        bucket=self.bucket,
                        description="mesh: detached calls, their state and results (runtime/calls/tasks.py)",
                        history=1,
                        ttl=self.ttl_s,
                        max_bytes=self.max_bytes,
                    )
                    self._kv = await js.create_key_value(config)
            return self._kv

    # --- the node's own detached calls ---------------------------------------------------------
    def owner(self, subject: str, headers: dict[str, str] | None, person: str | None) -> tuple[str | None, str]:
        """(account, caller id) of a request, as the caller stamp reads it; BadRequest when it cannot."""
        try:
            meta = self.stamp.for_headers(headers, person)
            account = request_account(headers)
        except (CallerError, ValueError) as e:
            raise BadRequest(subject, str(e)) from None
        return account, _decode_meta(meta)[CALLER_KEY].id

    async def open(self, call_id: str, subject: str, msg: Msg, person: str | None) -> str:
        """A detached call's record written (state working) and its handle sent; the record's key."""
        account, owner = self.owner(subject, msg.headers, person)
        now = _now_ms()
        record = TaskRecord(
            task=call_id,
            state="working",
            subject=subject,
            node=self.node,
            created_ms=now,
            updated_ms=now,
            ttl_ms=int(self.ttl_s * 1000),
            account=account or "",
            owner=owner,
        )
        key = task_key(account, owner, call_id)
        try:
            kv = await self._open()
            await kv.put(key, _encode(record))
        except Exception as e:
            raise Internal(f"{subject}: the task bucket {self.bucket} is not usable: {type(e).__name__}: {e}") from None
        self._live[key] = record
        self.started += 1
        if msg.reply:
            await self.nc.publish(msg.reply, _encode(record), headers={TASK: call_id})
        return key

    async def settle(self, key: str, body: bytes, error: NodeError | None, cancelled: bool) -> None:
        """The call's end into its record: its result, its error, or cancelled."""
        record = self._live.pop(key, None)
        if record is None:
            return
        record.ask = None
        if cancelled:
            record.state = "cancelled"
        elif error is not None:
            record.state, record.error = "failed", TaskError(code=error.code, message=str(error)[:2000])
        else:
            record.state = "completed"
            if len(body) > (self.nc.max_payload or 1024 * 1024) - HEADROOM:
                try:
                    ref, _ = await self.objects.park(record.subject, "the task's result", body, record.account or None)
                    record.result_object = msgspec.json.decode(ref, type=ObjectRef)
                except NodeError as e:
                    record.state, record.error = "failed", TaskError(code=e.code, message=str(e)[:2000])
            else:
                record.result = msgspec.Raw(body or b"{}")
        await self._write(key, record)

    async def record_ask(self, asks: CallAsks, frame: AskFrame | None) -> None:
        """A detached call asks (its record says input_required and what), or its asks are answered."""
        key = asks.task_key
        record = self._live.get(key) if key is not None else None
        if key is None or record is None:
            return
        record.state, record.ask = ("input_required", frame) if frame is not None else ("working", None)
        await self._write(key, record)

    async def _write(self, key: str, record: TaskRecord) -> None:
        record.updated_ms = _now_ms()
        try:
            kv = await self._open()
            await kv.put(key, _encode(record))
        except Exception as e:  # the bus is gone: the caller's get says working until the TTL
            log.warning("task %s: record not written: %s", record.task, e)

    # --- the verbs -----------------------------------------------------------------------------
    def _serve(self, verb: str) -> Callable[[Msg], Awaitable[None]]:
        async def handle(msg: Msg) -> None:
            try:
                reply = await self._verb(verb, msg)
            except NodeError as e:
                data, headers = render(e)
                if msg.reply:
                    await self.nc.publish(msg.reply, data, headers=headers)
                return
            except Exception as e:  # a bug of ours costs one request, not the node
                log.exception("task verb %s failed", verb)
                data, headers = render(Internal(f"{msg.subject}: internal error of the node: {type(e).__name__}"))
                if msg.reply:
                    await self.nc.publish(msg.reply, data, headers=headers)
                return
            if msg.reply:
                await self.nc.publish(msg.reply, reply)

        return handle

    async def _verb(self, verb: str, msg: Msg) -> bytes:
        subject = msg.subject
        if len(msg.data) > 4096:
            raise BadRequest(subject, f"the request is {len(msg.data)} bytes; a task request is at most 4096")
        person = (msg.headers or {}).get(PERSON)
        account, owner = self.owner(subject, msg.headers, person.strip() if person else None)
        if verb == "list":
            try:
                query = _decode_list(msg.data or b"{}")
            except (msgspec.DecodeError, msgspec.ValidationError) as e:
                raise BadRequest(subject, f'the body must be {{"cursor": "...", "limit": 100}} ({e})') from None
            return _encode(await self._list(account, owner, query))
        try:
            q = _decode_query(msg.data)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            raise BadRequest(subject, f'the body must be {{"task": "<task id>"}} ({e})') from None
        if not valid_call_id(q.task):
            raise BadRequest(subject, "field task must be a task id: 16 to 64 of A-Z a-z 0-9 _ -", field="task")
        key = task_key(account, owner, q.task)
        if verb == "get":
            return _encode(await self._get(subject, key))
        if verb == "result":
            if not 0 <= q.wait_ms <= MAX_WAIT_MS:
                raise BadRequest(subject, f"field wait_ms must be 0 to {MAX_WAIT_MS}", field="wait_ms")
            return _encode(await self._result(subject, key, q.wait_ms / 1000))
        return _encode(await self._cancel(subject, key))

    async def _get(self, subject: str, key: str) -> TaskRecord:
        kv = await self._open()
        try:
            entry = await kv.get(key)
        except KeyNotFoundError:
            entry = None
        if entry is None or not entry.value:
            raise NotFound(
                subject, f"no task {key.partition('.')[2]} of yours (expired after {self.ttl_s:g} s, or never made)"
            )
        return _decode_record(entry.value)

    async def _result(self, subject: str, key: str, wait_s: float) -> TaskRecord:
        record = await self._get(subject, key)
        if record.state in TERMINAL or record.state == "input_required" or wait_s <= 0:
            return record
        if self._waiters >= MAX_WAITERS:
            log.warning("%d task result requests already wait on this node; this one is answered at once", MAX_WAITERS)
            return record
        self._waiters += 1
        kv = await self._open()
        watcher = await kv.watch(key)
        try:
            with anyio.move_on_after(wait_s):
                while True:
                    entry = await watcher.updates(timeout=wait_s + 1)
                    if entry is None or not entry.value:
                        continue
                    record = _decode_record(entry.value)
                    if record.state in TERMINAL or record.state == "input_required":
                        break
        finally:
            self._waiters -= 1
            await watcher.stop()
        return record

    async def _list(self, account: str | None, owner: str, query: TaskListQuery) -> TaskPage:
        kv = await self._open()
        watcher = await kv.watch(owner_key(account, owner) + ".*")
        found: list[TaskRecord] = []
        try:
            with anyio.move_on_after(5):
                while len(found) < MAX_LISTED:
                    entry = await watcher.updates(timeout=5)
                    if entry is None:
                        break
                    if entry.value:
                        found.append(_decode_record(entry.value))
        finally:
            await watcher.stop()
        found.sort(key=lambda r: (r.created_ms, r.task))
        if query.cursor:
            found = [r for r in found if f"{r.created_ms}:{r.task}" > query.cursor]
        limit = max(1, min(LIST_LIMIT, query.limit))
        page = found[:limit]
        more = len(found) > limit
        return TaskPage(tasks=page, next_cursor=f"{page[-1].created_ms}:{page[-1].task}" if more else None)

    async def _cancel(self, subject: str, key: str) -> TaskRecord:
        record = await self._get(subject, key)
        if record.state in TERMINAL:
            return record
        stop = TaskStop(
            task=record.task, account=record.account or None, reason="cancelled by its caller (task cancel)"
        )
        try:
            await self.nc.request(task_stop_subject(record.node), _encode(stop), timeout=2)
        except Exception:  # its node is gone: the record is all that is left of the call
            log.info("task %s: its node %s did not answer the cancel; marked cancelled", record.task, record.node)
        state: TaskState = "cancelled"
        record.state, record.ask, record.updated_ms = state, None, _now_ms()
        kv = await self._open()
        await kv.put(key, _encode(record))
        return record

    async def _on_stop(self, msg: Msg) -> None:
        try:
            stop = _decode_stop(msg.data)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return
        if msg.headers and "Nats-Request-Info" in msg.headers:
            return  # only the mesh account's nodes send this (callers cannot reach it: not exported)
        found = self._cancel_local(stop.task, stop.account, stop.reason[:200])
        if msg.reply:
            await self.nc.publish(msg.reply, b'{"cancelled": true}' if found else b'{"cancelled": false}')
