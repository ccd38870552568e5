"""Caller identity's rules, in process: the id no two callers share, the person a delegate names
(`Mesh-Person`) and who may name one, the node's own operator on the embedded bus, a bus whose
stamps the node cannot believe, and how the node judges its bus from the server's own words
(`$SYS.REQ.USER.INFO`). Against real servers: tests/test_identity_bus.py, tests/test_local_callers.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from runtime.bus.trust import GUARDED, covers, intersects, judge, may_publish
from runtime.calls.identity import CallerStamp
from runtime.wire.callproto import parse_headers
from runtime.wire.errors import BadRequest
from runtime.wire.identity import (
    CALLER_KEY,
    MAX_PERSON_BYTES,
    PERSON,
    REQUEST_INFO,
    Caller,
    CallerError,
    Person,
    encode_person,
    local_caller,
    person_from_header,
)
from tests.support.call_contract import ID_CASES, expected_id

FACE = json.dumps({"acc": "faces", "user": "mesh-mcp", "name": "meshctl-mcp"})
ALICE = json.dumps({"acc": "alice", "user": "alice", "name": "alice-client"})
OPERATOR = json.dumps({"acc": "LOCAL", "user": "mesh-local", "name": "meshctl"})
ALICE_PERSON = encode_person(Person(iss="https://idp.example/", sub="u-1", name="Alice"))


def stamp(**kw: Any) -> CallerStamp:
    return CallerStamp(local_caller("ops"), {("faces", "mesh-mcp"): "mcp", ("web", None): "console"}, **kw)


def seen(meta: bytes) -> dict[str, Any]:
    return json.loads(meta)[CALLER_KEY]


def _caller(case: dict[str, Any]) -> Caller:
    person = case.get("person")
    return Caller(
        account=case["account"],
        user=case.get("user"),
        name=case.get("name"),
        via=case["via"],
        person=Person(**person) if person else None,
    )


@pytest.mark.parametrize("case, ident", ID_CASES)
def test_the_node_and_every_sdk_agree_on_one_id_per_caller(case: dict[str, Any], ident: str) -> None:
    assert _caller(case).id == ident == expected_id(case)


def test_ids_that_used_to_meet_differ_now() -> None:
    a = Caller(account="a", user="b/c", name=None, via="bus")
    b = Caller(account="a/b", user="c", name=None, via="bus")
    local = Caller(account="ops", user=None, name=None, via="local")
    bus = Caller(account="ops", user=None, name=None, via="bus")
    assert len({a.id, b.id}) == 2 and local.id != bus.id


def test_a_delegates_person_reaches_the_child_with_its_channel() -> None:
    meta = seen(stamp().for_headers({REQUEST_INFO: FACE}, ALICE_PERSON))
    assert meta == {
        "account": "faces",
        "user": "mesh-mcp",
        "name": "meshctl-mcp",
        "via": "mcp",
        "person": {"iss": "https://idp.example/", "sub": "u-1", "name": "Alice"},
    }
    # A whole account listed as a delegate: every user of it, with its own channel.
    web = json.dumps({"acc": "web", "user": "console-1"})
    assert seen(stamp().for_headers({REQUEST_INFO: web}, ALICE_PERSON))["via"] == "console"
    # Without a person a delegate's call is its own, marked with its channel, no person key.
    assert seen(stamp().for_headers({REQUEST_INFO: FACE})) == {
        "account": "faces",
        "user": "mesh-mcp",
        "name": "meshctl-mcp",
        "via": "mcp",
    }


def test_a_person_without_a_name_is_named_by_its_subject() -> None:
    person = person_from_header('{"iss":"unix:host","sub":"alice"}')
    assert person == Person(iss="unix:host", sub="alice", name="alice")


def test_a_person_from_anyone_but_a_delegate_is_refused_naming_why() -> None:
    with pytest.raises(CallerError) as e:
        stamp().for_headers({REQUEST_INFO: ALICE}, ALICE_PERSON)
    assert e.value.header == PERSON
    assert "alice/alice is not a delegate" in str(e.value) and "[identity] delegates" in str(e.value)
    with pytest.raises(CallerError, match="inside the mesh account"):
        stamp().for_headers({}, ALICE_PERSON)
    with pytest.raises(CallerError, match="mesh-local is not a delegate"):
        stamp(operator=("LOCAL", "mesh-local")).for_headers({REQUEST_INFO: OPERATOR}, ALICE_PERSON)


@pytest.mark.parametrize(
    "value, words",
    [
        ("not json", ["is not a person", '"iss"']),
        ('{"iss":"i"}', ["is not a person", "sub"]),
        ('{"iss":"i","sub":"s","name":"n","admin":true}', ["is not a person", "admin"]),
        ('{"iss":"","sub":"s"}', ["field iss", "printable"]),
        ('{"iss":"i","sub":"a\\nb"}', ["field sub", "printable"]),
        ('{"iss":"i","sub":"s","name":"' + "n" * 300 + '"}', ["field name", "256"]),
        ('{"iss":"i","sub":"' + "s" * 2000 + '"}', ["bytes", f"at most {MAX_PERSON_BYTES}"]),
        ('["i","s"]', ["is not a person"]),
    ],
)
def test_a_bad_person_is_named(value: str, words: list[str]) -> None:
    with pytest.raises(CallerError) as e:
        stamp().for_headers({REQUEST_INFO: FACE}, value)
    assert str(e.value).startswith(f"the {PERSON} header ")
    for word in words:
        assert word in str(e.value), str(e.value)


def test_the_embedded_buses_operator_is_the_local_identity() -> None:
    s = stamp(operator=("LOCAL", "mesh-local"))
    assert s.for_headers({REQUEST_INFO: OPERATOR}) == s.local_meta
    assert seen(s.for_headers({REQUEST_INFO: ALICE}))["via"] == "bus"
    # Another user of that account is not the operator.
    other = json.dumps({"acc": "LOCAL", "user": "someone"})
    assert seen(s.for_headers({REQUEST_INFO: other}))["via"] == "bus"


def test_on_a_bus_that_vouches_for_nobody_every_caller_is_local_whatever_it_sends() -> None:
    s = stamp(stamped=False)
    for headers, person in (
        ({REQUEST_INFO: ALICE}, None),
        ({REQUEST_INFO: FACE}, ALICE_PERSON),
        ({REQUEST_INFO: "not json"}, "not json either"),
        ({}, ALICE_PERSON),
    ):
        assert s.for_headers(headers, person) == s.local_meta


def test_the_stamp_cache_keys_on_the_person_too() -> None:
    s = stamp()
    bob = encode_person(Person(iss="https://idp.example/", sub="u-2", name="Bob"))
    first = seen(s.for_headers({REQUEST_INFO: FACE}, ALICE_PERSON))
    second = seen(s.for_headers({REQUEST_INFO: FACE}, bob))
    assert (first["person"]["sub"], second["person"]["sub"]) == ("u-1", "u-2")
    s.set_delegates({})  # the face is no longer a delegate: what was cached is not reused
    with pytest.raises(CallerError, match="not a delegate"):
        s.for_headers({REQUEST_INFO: FACE}, ALICE_PERSON)


def test_the_call_protocol_knows_mesh_person_with_its_own_bound() -> None:
    opts = parse_headers("mesh.tool.m.t", {"mesh-person": ALICE_PERSON}, False)
    assert opts is not None and opts.person == ALICE_PERSON
    with pytest.raises(BadRequest) as e:
        parse_headers("mesh.tool.m.t", {PERSON: "x" * (MAX_PERSON_BYTES + 1)}, False)
    assert e.value.field == f"header {PERSON}" and f"at most {MAX_PERSON_BYTES}" in str(e.value)
    with pytest.raises(BadRequest, match="unknown header 'Mesh-Caller'"):
        parse_headers("mesh.tool.m.t", {"Mesh-Caller": "bob"}, False)


# --- how the node judges its bus ---------------------------------------------------------------
DENIED = {"publish": {"deny": list(GUARDED)}}


@pytest.mark.parametrize(
    "pattern, subject, covered",
    [
        ("mesh.tool.>", "mesh.tool.>", True),
        ("mesh.>", "mesh.cancel.*", True),
        (">", "mesh.fetch.>", True),
        ("mesh.tool.*", "mesh.tool.>", False),
        ("mesh.tool.x.>", "mesh.tool.>", False),
        ("mesh.cancel.*", "mesh.cancel.*", True),
        ("mesh.*.*", "mesh.cancel.*", True),
    ],
)
def test_a_deny_covers_a_subject_only_whole(pattern: str, subject: str, covered: bool) -> None:
    assert covers(pattern, subject) is covered


def test_patterns_intersect() -> None:
    assert intersects("mesh.tool.x", "mesh.tool.>") and intersects("*.tool.*", "mesh.tool.>")
    assert not intersects("mesh.node.>", "mesh.tool.>") and not intersects("mesh.tool", "mesh.tool.>")


def test_the_node_believes_stamps_only_where_its_account_cannot_publish_calls() -> None:
    guarded = judge({"user": "mesh-node", "account": "MESH", "permissions": DENIED})
    assert guarded.stamped and "server-stamped" in guarded.summary
    no_accounts = judge({"user": "", "account": "$G"})
    assert not no_accounts.stamped and "no accounts" in no_accounts.summary and "local" in no_accounts.summary
    open_mesh = judge({"user": "mesh-node", "account": "MESH"})
    assert not open_mesh.stamped and "mesh-node may publish mesh.tool.>" in open_mesh.summary
    half = judge({"user": "n", "account": "MESH", "permissions": {"publish": {"deny": ["mesh.tool.>"]}}})
    assert (
        not half.stamped
        and "n may publish mesh.seat.>, mesh.cancel.*, mesh.fetch.>, mesh.answer.>, mesh.task.*, so" in half.summary
    )
    # An allow list that leaves the call subjects out guards them as well.
    allow = judge({"user": "n", "account": "MESH", "permissions": {"publish": {"allow": ["mesh.node.>", "$JS.>"]}}})
    assert allow.stamped
    assert not judge({}).stamped


def test_may_publish_reads_both_forms_of_permissions() -> None:
    assert may_publish(None, "mesh.tool.>") and may_publish({}, "mesh.tool.>")
    assert not may_publish(["mesh.node.>"], "mesh.tool.>")
    assert may_publish({"allow": ["mesh.tool.x"]}, "mesh.tool.>")
