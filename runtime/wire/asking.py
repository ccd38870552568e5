"""Asking across the bus and calls that outlive their caller: the wire of both (docs/bus.md).

Asking: a caller that can answer sends `Mesh-Answers: 1`. A child's `elicitation/create`,
`sampling/createMessage` or `roots/list` during that call goes to the caller as an `ask` frame
on the call's reply subject; the caller answers with a request on the frame's `answer` subject
(`mesh.answer.<node>.<call id>.<n>`), which the node takes only from the call's own account and
person, within the call's deadline.

Detached calls: `Mesh-Detached: 1` (with a Mesh-Call-Id) is answered at once with a task (its
id is the call id); the node runs the call on and keeps its state and result in the `mesh-tasks`
bucket, read through `mesh.task.get/result/list/cancel` by the caller who made it and nobody else.

Pure: no I/O. Every field from the bus is hostile until checked here.
"""

from __future__ import annotations

import hashlib
import re
from typing import Literal

import msgspec

from runtime.wire.callproto import ANSWERS as ANSWERS  # the headers are read in callproto
from runtime.wire.callproto import DETACHED as DETACHED
from runtime.wire.callproto import ObjectRef
from runtime.wire.errors import NodeError

# --- headers ----------------------------------------------------------------------------------
TASK = "Mesh-Task"  # on the reply to a detached call: the task's id (the call id)
FRAME_ASK = "ask"  # Mesh-Frame of an ask

# The requests a child may send its client during a call, which the node passes to the caller.
ASK_METHODS = ("elicitation/create", "sampling/createMessage", "roots/list")
CALL_REF = "mesh/call"  # in every tools/call's _meta of a call with options; SDKs copy it onto their asks

MAX_ASK_BYTES = 64 * 1024  # a child's request's params
MAX_ANSWER_BYTES = 256 * 1024  # a caller's answer
MAX_ASKS_PER_CALL = 16  # asks over a call's life
MAX_OPEN_ASKS = 4  # asks waiting for their answer at once, per call

# --- subjects ---------------------------------------------------------------------------------
ANSWER_PREFIX = "mesh.answer."  # mesh.answer.<node>.<call id>.<n>
TASK_PREFIX = "mesh.task."
TASK_VERBS = ("get", "result", "list", "cancel")
TASK_STOP_PREFIX = "mesh.taskstop."  # mesh.taskstop.<node>: a cancel, from the node that checked its owner
TASKS_BUCKET = "mesh-tasks"

MAX_WAIT_MS = 60_000  # mesh.task.result waits at most this long per request
LIST_LIMIT = 100


def answer_subject(node: str, call_id: str, n: int) -> str:
    return f"{ANSWER_PREFIX}{node}.{call_id}.{n}"


def task_subject(verb: str) -> str:
    return TASK_PREFIX + verb


def task_stop_subject(node: str) -> str:
    return TASK_STOP_PREFIX + node


_ANSWER = re.compile(r"([A-Za-z0-9_-]{16,64})\.([0-9]{1,4})")


def parse_answer_subject(node: str, subject: str) -> tuple[str, int] | None:
    """(call id, ask number) of an answer to this node, None for anything else."""
    prefix = f"{ANSWER_PREFIX}{node}."
    if not subject.startswith(prefix):
        return None
    found = _ANSWER.fullmatch(subject[len(prefix) :])
    return (found.group(1), int(found.group(2))) if found else None


# --- asks and answers ---------------------------------------------------------------------------
class AskFrame(msgspec.Struct):
    """The body of an ask frame: the child's request as it came, and where its answer goes."""

    ask: int  # 1, 2, ... within the call
    method: str
    params: msgspec.Raw
    answer: str  # the subject to send the answer on (a request: the node says whether it took it)
    timeout_ms: int  # what is left of the call's deadline


class AnswerError(msgspec.Struct):
    code: int
    message: str


class AnswerBody(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """What a caller sends on an ask's answer subject: the JSON-RPC result for the child, or an error."""

    result: msgspec.Raw = msgspec.Raw(b"")  # (msgspec takes no Raw in a union: empty is none)
    error: AnswerError | None = None


class AnswerTaken(msgspec.Struct):
    ask: int


_decode_answer = msgspec.json.Decoder(AnswerBody).decode
_check_object = msgspec.json.Decoder(dict[str, msgspec.Raw]).decode


def check_answer(data: bytes) -> AnswerBody | str:
    """The answer, or what is wrong with it (a sentence naming what would be right)."""
    if len(data) > MAX_ANSWER_BYTES:
        return f"the answer is {len(data)} bytes; at most {MAX_ANSWER_BYTES}"
    try:
        body = _decode_answer(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        return f'the answer must be {{"result": {{...}}}} or {{"error": {{"code": -1, "message": "..."}}}} ({e})'
    if bool(body.result) == (body.error is not None):
        return "the answer has exactly one of result and error"
    if body.result:
        try:
            _check_object(body.result)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return "the answer's result must be a JSON object (e.g. an ElicitResult)"
    elif body.error is not None and len(body.error.message) > 1024:
        return "the answer's error message is longer than 1024 characters"
    return body


# --- tasks --------------------------------------------------------------------------------------
TaskState = Literal["working", "input_required", "completed", "failed", "cancelled"]
TERMINAL: tuple[str, ...] = ("completed", "failed", "cancelled")


class TaskError(msgspec.Struct):
    code: int
    message: str


class TaskRecord(msgspec.Struct, omit_defaults=True):
    """A detached call in the mesh-tasks bucket, as the task verbs return it."""

    task: str  # the call id
    state: TaskState
    subject: str
    node: str
    created_ms: int
    updated_ms: int
    ttl_ms: int
    result: msgspec.Raw = msgspec.Raw(b"")  # the CallToolResult, when it fits a message (empty: none)
    result_object: ObjectRef | None = None  # ... else where it is (read with mesh.fetch.<name>)
    error: TaskError | None = None  # a runtime error of the call (its code is the wire's: 503, 504 ...)
    ask: AskFrame | None = None  # state input_required: what the tool asks
    account: str = ""  # whose (checked; not shown to anyone else, who cannot read the record anyway)
    owner: str = ""


class TaskQuery(msgspec.Struct, forbid_unknown_fields=True):
    """The body of mesh.task.get / result / cancel."""

    task: str
    wait_ms: int = 0  # result: how long to wait for a terminal state (at most MAX_WAIT_MS)


class TaskListQuery(msgspec.Struct, forbid_unknown_fields=True):
    cursor: str | None = None
    limit: int = LIST_LIMIT


class TaskPage(msgspec.Struct, omit_defaults=True):
    tasks: list[TaskRecord]
    next_cursor: str | None = None


class TaskStop(msgspec.Struct):
    """Body of mesh.taskstop.<node>: the call to cancel (its owner already checked)."""

    task: str
    account: str | None
    reason: str


def owner_key(account: str | None, owner: str) -> str:
    """The bucket key prefix of one caller's tasks: nobody else's request can name a key under it."""
    return hashlib.sha256(f"{account or ''}\0{owner}".encode()).hexdigest()[:32]


def task_key(account: str | None, owner: str, task: str) -> str:
    return f"{owner_key(account, owner)}.{task}"


class NotFound(NodeError):
    """An answer to no ask waiting for it, or a task that is not there for the asker (or at all)."""

    code, kind = 404, "not_found"

    def __init__(self, subject: str, what: str) -> None:
        self.subject = subject
        super().__init__(f"{subject}: {what}")

    def facts(self) -> dict[str, str]:
        return {"subject": self.subject}
