"""The per-request JSON reply decision: which POSTs get one JSON body, and that the body reaches the app unchanged."""

from __future__ import annotations

import anyio
from starlette.types import Message, Receive, Scope, Send

from runtime.meshctl.face.json_replies import JsonReplies, PerRequest, wants_json

CALL = b'{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"echo_echo","arguments":{"text":"hi"}}}'
CALL_WITH_PROGRESS = (
    b'{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"x","_meta":{"progressToken":1},"arguments":{}}}'
)


def test_only_a_tools_call_without_a_progress_token_gets_json() -> None:
    assert wants_json(CALL)
    assert not wants_json(CALL_WITH_PROGRESS)
    assert not wants_json(b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}')
    assert not wants_json(b'{"jsonrpc":"2.0","id":2,"method":"tools/list"}')


async def _through(chunks: list[bytes]) -> tuple[bool, bytes]:
    seen: dict[str, bool] = {}
    got: list[bytes] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen["json"] = bool(PerRequest())  # read where the SDK's transport reads it: in the request's task
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        got.append(body)

    pending = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]

    async def receive() -> Message:
        return pending.pop(0)

    async def send(message: Message) -> None:
        pass

    await JsonReplies(app)({"type": "http", "method": "POST"}, receive, send)
    assert not bool(PerRequest())  # the flag is the request's only
    return seen["json"], got[0]


def test_the_middleware_sets_the_flag_for_the_request_and_hands_the_body_on_unchanged() -> None:
    assert anyio.run(_through, [CALL[:10], CALL[10:]]) == (True, CALL)
    assert anyio.run(_through, [CALL_WITH_PROGRESS]) == (False, CALL_WITH_PROGRESS)
