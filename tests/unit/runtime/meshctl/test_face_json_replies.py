"""The per-request JSON reply decision: which POSTs the package answers with one JSON body."""

from __future__ import annotations

from runtime.meshctl.face.json_replies import PerRequest, replying_as_json, wants_json

CALL = b'{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"echo_echo","arguments":{"text":"hi"}}}'
CALL_WITH_PROGRESS = (
    b'{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"x","_meta":{"progressToken":1},"arguments":{}}}'
)


def test_only_calls_and_lists_without_a_progress_token_get_json() -> None:
    assert wants_json(CALL)
    assert wants_json(b'{"jsonrpc":"2.0","id":2,"method":"tools/list"}')
    assert not wants_json(CALL_WITH_PROGRESS)
    assert not wants_json(b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}')
    assert not wants_json(b'{"jsonrpc":"2.0","id":1,"method":"subscriptions/listen","params":{}}')


def test_the_flag_is_the_requests_only() -> None:
    assert not bool(PerRequest())
    with replying_as_json(True):
        assert bool(PerRequest())  # read where the package's transport reads it: in the request's task
        with replying_as_json(False):
            assert not bool(PerRequest())
        assert bool(PerRequest())
    assert not bool(PerRequest())
