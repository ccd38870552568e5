"""The call protocol's checks and the node's call desk, in process: headers, stamps, cancels' memory."""

from __future__ import annotations

import pytest
from nats.aio.msg import Msg

from runtime.calls.desk import EARLY_CANCELS, CallDesk, CallSettings, call_meta
from runtime.wire.callproto import (
    CALL_ID,
    KNOWN,
    MAX_VALUE,
    PROGRESS,
    REQUEST_INFO,
    REQUEST_OBJECT,
    TIMEOUT_MS,
    CallOptions,
    parse_headers,
    request_account,
    valid_result_name,
)
from runtime.wire.errors import BadRequest

S = "mesh.tool.m.t"
ID = "abcdefghijklmnop0123"


def bad(headers: dict[str, str], has_body: bool = True) -> BadRequest:
    with pytest.raises(BadRequest) as e:
        parse_headers(S, headers, has_body)
    return e.value


def test_no_mesh_header_is_a_plain_call() -> None:
    assert parse_headers(S, {}, True) is None
    assert parse_headers(S, {"Nats-Request-Info": '{"acc":"A"}', "X-Other": "1"}, True) is None


def test_good_headers_any_case() -> None:
    opts = parse_headers(
        S,
        {
            "mesh-call-id": ID,
            "MESH-TIMEOUT-MS": " 250 ",
            PROGRESS: "1",
            REQUEST_INFO: '{"acc":"A","rtt":"1ms","user":"u"}',
        },
        True,
    )
    assert opts == CallOptions(call_id=ID, timeout_ms=250, progress=True, account="A")
    assert parse_headers(S, {REQUEST_OBJECT: "req." + ID}, False) == CallOptions(request_object="req." + ID)


@pytest.mark.parametrize(
    "headers, named, hint",
    [
        ({TIMEOUT_MS: "1.5"}, TIMEOUT_MS, "whole number of milliseconds"),
        ({TIMEOUT_MS: "-1"}, TIMEOUT_MS, "e.g. 5000"),
        ({TIMEOUT_MS: "0"}, TIMEOUT_MS, "from 1"),
        ({TIMEOUT_MS: "9999999999"}, TIMEOUT_MS, "from 1"),
        ({CALL_ID: "a.b.c.d.e.f.g.h.i.j"}, CALL_ID, "16 to 64 characters"),
        ({CALL_ID: "x" * 65}, CALL_ID, "16 to 64"),
        ({PROGRESS: "true"}, PROGRESS, "must be 1"),
        ({"Mesh-Deadline": "5"}, "Mesh-Deadline", ", ".join(KNOWN)),
        ({CALL_ID: "y" * (MAX_VALUE + 1)}, CALL_ID, f"at most {MAX_VALUE}"),
        ({REQUEST_OBJECT: "../etc/passwd"}, REQUEST_OBJECT, "req.<16 to 64"),
        ({REQUEST_OBJECT: "res." + ID}, REQUEST_OBJECT, "req.<16 to 64"),
    ],
)
def test_bad_headers_name_the_header_and_what_is_right(headers: dict[str, str], named: str, hint: str) -> None:
    e = bad(headers, has_body=False)
    assert e.field == f"header {named}" and named in e.problem and hint in e.problem


def test_request_object_needs_an_empty_body() -> None:
    e = bad({REQUEST_OBJECT: "req." + ID}, has_body=True)
    assert "empty body" in e.problem


@pytest.mark.parametrize("info", ["not json", '{"acc": 5}', '{"acc": ""}', '{"acc":"' + "a" * 5000 + '"}'])
def test_a_bad_request_info_stamp_is_refused(info: str) -> None:
    e = bad({CALL_ID: ID, REQUEST_INFO: info})
    assert e.field == f"header {REQUEST_INFO}"
    with pytest.raises(ValueError):
        request_account({REQUEST_INFO: info})


def test_request_account() -> None:
    assert request_account(None) is None and request_account({}) is None
    assert request_account({REQUEST_INFO: '{"acc":"AGENTS","user":"x"}'}) == "AGENTS"


def test_only_result_names_can_be_fetched() -> None:
    assert valid_result_name("res." + ID)
    for bad in ("req." + ID, "res.short", "res." + ID + ".x", "res.../../x" + ID, "res." + "a" * 65):
        assert not valid_result_name(bad), bad


def test_deadline_shortens_never_lengthens() -> None:
    assert CallOptions(timeout_ms=200).timeout_for(5000) == 200
    assert CallOptions(timeout_ms=60000).timeout_for(5000) == 5000
    assert CallOptions().timeout_for(5000) == 5000


def msg(headers: dict[str, str], data: bytes = b"{}", reply: str = "_INBOX.x") -> Msg:
    return Msg(_client=None, subject=S, reply=reply, data=data, headers=headers)  # type: ignore[arg-type]


async def test_desk_registers_refuses_a_second_id_and_forgets_on_close() -> None:
    desk = CallDesk(None, CallSettings())  # type: ignore[arg-type]  # open/close do not touch the bus
    call = desk.open(msg({CALL_ID: ID}), owner=None)
    assert call is not None and desk.open_calls[ID][None] is call and call_meta(b"", call) == b""
    with pytest.raises(BadRequest, match="already in flight"):
        desk.open(msg({CALL_ID: ID}), owner=None)
    desk.close(call)
    assert ID not in desk.open_calls
    progress = desk.open(msg({PROGRESS: "1"}), owner="bundle-a")
    assert progress is not None and call_meta(b"", progress) == b'{"progressToken":%d}' % progress.token
    # Beside what else the node puts in _meta (the caller's identity), not instead of it.
    caller = b'{"mesh/caller":{"account":"A"}}'
    assert call_meta(caller, progress) == b'{"mesh/caller":{"account":"A"},"progressToken":%d}' % progress.token
    assert call_meta(b"{}", progress) == b'{"progressToken":%d}' % progress.token
    assert call_meta(caller, None) == caller


async def test_desk_remembers_a_cancel_that_came_first_same_account_only_and_bounded() -> None:
    desk = CallDesk(None, CallSettings())  # type: ignore[arg-type]
    desk._remember_early(ID, "A")
    other = desk.open(msg({CALL_ID: ID, REQUEST_INFO: '{"acc":"B"}'}), owner=None)
    assert other is not None and not other.cancelled  # B's call is not A's to cancel
    desk.close(other)
    desk._remember_early(ID, "A")
    call = desk.open(msg({CALL_ID: ID, REQUEST_INFO: '{"acc":"A"}'}), owner=None)
    assert call is not None and call.cancelled and ID not in desk.open_calls
    # A cancel from B is remembered as B's: A's call with that id is not cancelled by it.
    desk._remember_early(ID, "B")
    mine = desk.open(msg({CALL_ID: ID, REQUEST_INFO: '{"acc":"A"}'}), owner=None)
    assert mine is not None and not mine.cancelled
    desk.close(mine)
    for i in range(EARLY_CANCELS + 50):
        desk._remember_early(f"id-{i:016d}", None)
    assert len(desk._early) == EARLY_CANCELS


async def test_call_ids_are_each_accounts_own() -> None:
    """Issue 30 item 3: B's call in flight under an id never refuses A's call with the same id."""
    desk = CallDesk(None, CallSettings())  # type: ignore[arg-type]
    bobs = desk.open(msg({CALL_ID: ID, REQUEST_INFO: '{"acc":"B"}'}), owner=None)
    alices = desk.open(msg({CALL_ID: ID, REQUEST_INFO: '{"acc":"A"}'}), owner=None)
    mesh = desk.open(msg({CALL_ID: ID}), owner=None)  # the mesh account's own (no stamp)
    assert bobs is not None and alices is not None and mesh is not None
    assert desk.open_calls[ID] == {"B": bobs, "A": alices, None: mesh} and desk.stats()["open"] == 3
    with pytest.raises(BadRequest, match="already in flight"):  # the same account twice still is
        desk.open(msg({CALL_ID: ID, REQUEST_INFO: '{"acc":"A","user":"other"}'}), owner=None)
    desk.close(alices)
    assert desk.open_calls[ID] == {"B": bobs, None: mesh}
    desk.close(alices)  # twice is nothing
    desk.close(bobs)
    desk.close(mesh)
    assert desk.open_calls == {} and desk.stats()["open"] == 0


async def test_a_cancel_reaches_the_call_of_its_own_account_only() -> None:
    desk = CallDesk(None, CallSettings())  # type: ignore[arg-type]
    bobs = desk.open(msg({CALL_ID: ID, REQUEST_INFO: '{"acc":"B"}'}), owner=None)
    alices = desk.open(msg({CALL_ID: ID, REQUEST_INFO: '{"acc":"A"}'}), owner=None)
    assert bobs is not None and alices is not None

    def cancel(account: str | None) -> Msg:
        headers = {REQUEST_INFO: f'{{"acc":"{account}"}}'} if account else None
        return Msg(_client=None, subject=f"mesh.cancel.{ID}", reply="", data=b"", headers=headers)  # type: ignore[arg-type]

    await desk._on_cancel(cancel("A"))
    assert alices.cancelled and not bobs.cancelled
    await desk._on_cancel(cancel("C"))  # nobody's call of C's: remembered as C's, nothing cancelled
    assert not bobs.cancelled and desk.cancels_ignored == 1 and ("C", ID) in desk._early
    await desk._on_cancel(cancel("B"))
    assert bobs.cancelled and desk.cancels_honoured == 2


async def test_progress_from_the_wrong_bundle_or_garbage_is_dropped() -> None:
    desk = CallDesk(None, CallSettings())  # type: ignore[arg-type]
    call = desk.open(msg({PROGRESS: "1"}), owner="bundle-a")
    assert call is not None and call.progress is not None
    token = call.token
    desk.progress("bundle-b", b'{"progressToken":%d,"progress":1}' % token)  # type: ignore[arg-type]
    desk.progress("bundle-a", b'{"progressToken":"%d","progress":1}' % token)  # type: ignore[arg-type]
    desk.progress("bundle-a", b"not json")  # type: ignore[arg-type]
    desk.progress("bundle-a", b'{"progressToken":%d}' % token)  # type: ignore[arg-type]
    assert not call.progress.frames
    desk.progress("bundle-a", b'{"progressToken":%d,"progress":2,"total":4,"message":"%s"}' % (token, b"m" * 5000))  # type: ignore[arg-type]
    [frame] = call.progress.frames
    assert frame.startswith(b'{"progress":2,"total":4,"message":"mmm') and len(frame) < 1100
