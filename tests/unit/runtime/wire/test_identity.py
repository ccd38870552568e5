"""Caller identity, in process: the server's `Nats-Request-Info` read into the caller, the local
identity, the `_meta` a `tools/call` carries, and the config that names them. The same against a
real nats-server with three accounts is in tests/test_identity_bus.py."""

from __future__ import annotations

import asyncio
import getpass
import json
from pathlib import Path

import msgspec
import pytest

from launcher.session import Session
from runtime.calls.identity import CallerStamp
from runtime.config import ConfigError, load_config
from runtime.wire.identity import CALLER_KEY, REQUEST_INFO, Caller, CallerError, caller_from_info, local_caller

# What nats-server 2.15 stamps on a request crossing a `share: true` import (seen on the wire).
STAMPED = json.dumps(
    {
        "start": "2026-12-01T03:19:50.84769323Z",
        "host": "127.0.0.1",
        "id": 9,
        "acc": "alice",
        "user": "alice",
        "name": "alice-client",
        "lang": "python3",
        "ver": "2.16.0",
        "rtt": 835987,
        "server": "NBOPWQNTV377IH2BBUGVKYDUWWATTDESQMCSNFBSKHEAVKAAC2BLWD76",
        "kind": "Client",
        "client_type": "nats",
    }
)


def test_the_stamped_caller_is_read_and_nothing_else() -> None:
    caller = caller_from_info(STAMPED)
    assert caller == Caller(account="alice", user="alice", name="alice-client", via="bus")
    assert caller.id == "alice/alice"


def test_an_import_without_share_gives_the_account_alone() -> None:
    caller = caller_from_info('{"acc":"BOB"}')
    assert caller == Caller(account="BOB", user=None, name=None, via="bus")
    assert caller.id == "BOB"


@pytest.mark.parametrize(
    "value, words",
    [
        ("not json", ["not the server's client info"]),
        ('{"user":"alice"}', ["names no account"]),
        ('{"acc":""}', ["names no account"]),
        ('{"acc":"a\\u0000b"}', ["names no account"]),
        ('{"acc":"a","user":"x\\ny"}', ["unprintable or overlong user"]),
        ('{"acc":"a","user":"' + "u" * 300 + '"}', ["unprintable or overlong user"]),
        ('{"acc":5}', ["not the server's client info"]),
        ('{"acc":"a","pad":"' + "x" * 5000 + '"}', ["bytes", "at most a few hundred"]),
        ("[1,2]", ["not the server's client info"]),
    ],
)
def test_an_unreadable_stamp_is_named(value: str, words: list[str]) -> None:
    with pytest.raises(CallerError) as e:
        caller_from_info(value)
    assert str(e.value).startswith(f"the {REQUEST_INFO} header ")
    for word in words:
        assert word in str(e.value)


def test_a_client_name_it_chose_oddly_is_dropped_its_account_stands() -> None:
    caller = caller_from_info('{"acc":"alice","user":"alice","name":"evil\\u001b[31m"}')
    assert (caller.account, caller.user, caller.name) == ("alice", "alice", None)


def test_local_identity_defaults_to_the_os_user_and_takes_account_slash_user() -> None:
    assert local_caller(None) == Caller(account=getpass.getuser(), user=None, name=None, via="local")
    assert local_caller("ops/alice") == Caller(account="ops", user="alice", name=None, via="local")
    assert local_caller("ops/alice").id == "local:ops/alice"  # never a bus caller's id


def test_stamp_gives_local_without_header_and_bus_with_it() -> None:
    stamp = CallerStamp(local_caller("ops"))
    assert json.loads(stamp.for_headers(None)) == {
        CALLER_KEY: {"account": "ops", "user": None, "name": None, "via": "local"}
    }
    # Other headers, however named, change nothing.
    assert stamp.for_headers({"X-Caller": "bob", "X-User": "bob"}) == stamp.local_meta
    meta = json.loads(stamp.for_headers({REQUEST_INFO: STAMPED}))
    assert meta == {CALLER_KEY: {"account": "alice", "user": "alice", "name": "alice-client", "via": "bus"}}
    assert stamp.for_headers({REQUEST_INFO: STAMPED}) is stamp.for_headers({REQUEST_INFO: STAMPED})  # cached


def test_the_stamp_cache_is_bounded() -> None:
    stamp = CallerStamp(local_caller("ops"))
    for i in range(CallerStamp.CACHE_SIZE * 2 + 5):
        stamp.for_headers({REQUEST_INFO: json.dumps({"acc": f"a{i}"})})
    assert len(stamp._cache) <= CallerStamp.CACHE_SIZE


async def test_tools_call_carries_meta_beside_the_arguments_as_sent() -> None:
    written: list[bytes] = []
    session = Session("t")
    session.attach(written.append)
    meta = CallerStamp.meta(Caller(account="alice", user="alice", name=None, via="bus"))
    # The arguments hold a forged _meta of their own: it stays in the arguments, untouched.
    args = b'{"_meta":{"mesh/caller":{"account":"bob"}},"x":1}'
    deadline = asyncio.get_running_loop().time() + 5
    call = session.begin_tool_call(b'"meta"', args, deadline, 5000, meta)
    call.timer.cancel()
    message = json.loads(written[0])
    assert message["params"] == {
        "name": "meta",
        "arguments": {"_meta": {"mesh/caller": {"account": "bob"}}, "x": 1},
        "_meta": {"mesh/caller": {"account": "alice", "user": "alice", "name": None, "via": "bus"}},
    }
    session.begin_tool_call(b'"echo"', b"{}", deadline, 5000).timer.cancel()  # no meta: no _meta key
    assert "_meta" not in json.loads(written[1])["params"]


@pytest.mark.parametrize(
    "text, words",
    [
        ('[identity]\nlocal = "a/b/c"', ["identity.local", "account/user"]),
        ('[identity]\nlocal = "/x"', ["identity.local"]),
        ('[identity]\nlocal = ""', ["identity.local"]),
        ('[identity]\nwho = "x"', ["who"]),
        ("[seats]\nlease_ttl_s = 0.1", ["seats.lease_ttl_s", "1 to 3600"]),
        ('[[nats.caller]]\naccount = "al ice"\nuser = "alice"', ["nats.caller[0].account", "letters, digits"]),
        ('[[nats.caller]]\naccount = "mesh"\nuser = "x"', ["nats.caller[0]", "MESH", "mesh's own"]),
        (
            '[[nats.caller]]\naccount = "a"\nuser = "u"\n[[nats.caller]]\naccount = "b"\nuser = "u"',
            ["nats.caller[1].user", "twice"],
        ),
        (
            '[nats]\nurl = "nats://127.0.0.1:4222"\n[[nats.caller]]\naccount = "a"\nuser = "u"',
            ["nats.caller[0]", "embedded", "README"],
        ),
        ('[[nats.caller]]\naccount = "a"', ["user"]),
        ('[[nats.caller]]\naccount = "local"\nuser = "x"', ["nats.caller[0]", "LOCAL", "mesh's own"]),
        ('[[nats.caller]]\naccount = "x"\nuser = "mesh-mcp"', ["nats.caller[0]", "mesh-mcp", "mesh's own"]),
        ('[identity]\ndelegates = { "faces/" = "mcp" }', ["identity.delegates", "account/user"]),
        ('[identity]\ndelegates = { "faces/mcp" = "bus" }', ["identity.delegates", '"mcp" or "console"']),
        ('[identity]\ndelegates = { "faces/mcp" = "carrier" }', ["delegates"]),
    ],
)
def test_config_mistakes_are_named(tmp_path: Path, text: str, words: list[str]) -> None:
    path = tmp_path / "node.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_config(path)
    for word in words:
        assert word in str(e.value), f"{word!r} not in {e.value}"


def test_config_reads_identity_seats_and_callers(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    path.write_text(
        '[identity]\nlocal = "ops/alice"\n[seats]\nlease_ttl_s = 4\n'
        '[[nats.caller]]\naccount = "alice"\nuser = "alice"\npassword = "pw"\n'
        '[[nats.caller]]\naccount = "bob"\nuser = "bob"\n'
    )
    config = load_config(path)
    assert config.identity.local == "ops/alice" and config.seats.lease_ttl_s == 4
    assert [msgspec.structs.astuple(c) for c in config.nats.caller] == [("alice", "alice", "pw"), ("bob", "bob", None)]


def test_delegates_and_their_older_name_are_read(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    path.write_text('[identity]\nmcp_faces = ["faces/old", "kiosk"]\ndelegates = { "web/console" = "console" }\n')
    listed = load_config(path).identity.listed()
    assert listed == {("faces", "old"): "mcp", ("kiosk", None): "mcp", ("web", "console"): "console"}
