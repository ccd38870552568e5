"""Bad input: bodies that are not a JSON object, arguments that fail the tool's inputSchema,
tools and seats that do not exist, a manifest folder full of mistakes. Each is named in a
clear answer (400, 404) or in status; none reaches or harms a child; the node always starts.
"""

from __future__ import annotations

import time
from pathlib import Path

import nats
import pytest

from tests.support.mesh import bundle_status, call, client, make_module, status, wait_state

NOT_JSON = [b"{not json", b"\xff\xfe", b'{"a": 1} trailing', b"{", b"'single quotes'", b'{"a": 01}', b"NaN"]
NOT_AN_OBJECT = [b"[1, 2]", b'"text"', b"42", b"null", b"true", b"[]"]


@pytest.fixture
async def alpha(tmp_path: Path, node_factory):
    make_module(tmp_path / "mods", "alpha", seats=["memory"])
    node = node_factory(tmp_path / "mods")
    nc = await client(node.bus_url())
    await wait_state(nc, node.name, "alpha/tools", "ready")
    yield node, nc
    await nc.close()


async def _child_calls(nc, node) -> int:
    return (await bundle_status(nc, node.name, "alpha/tools"))["calls"]


async def test_bodies_that_are_not_a_json_object_are_400_and_never_reach_the_child(alpha) -> None:
    node, nc = alpha
    for raw in NOT_JSON:
        code, body = await call(nc, "mesh.tool.alpha.echo", raw=raw)
        assert code == 400, (raw, body)
        assert body["error"]["kind"] == "bad_request" and "not valid JSON" in body["error"]["message"], (raw, body)
    for raw in NOT_AN_OBJECT:
        code, body = await call(nc, "mesh.tool.alpha.echo", raw=raw)
        assert code == 400, (raw, body)
        assert "must be a JSON object" in body["error"]["message"], (raw, body)
    # On a seat's subject, a verb the seat does not have is named first: the body is never looked at.
    code, body = await call(nc, "mesh.seat.memory.say", raw=b"[1]")
    assert code == 404, body
    # The service error headers carry the same code, on the reply itself.
    msg = await nc.request("mesh.tool.alpha.echo", b"{nope", timeout=5)
    assert msg.headers["Nats-Service-Error-Code"] == "400" and "not valid JSON" in msg.headers["Nats-Service-Error"]
    assert await _child_calls(nc, node) == 0
    # And the child serves as before.
    code, r = await call(nc, "mesh.tool.alpha.echo", {" ok ": "\u00e9\u4e2d\U0001f600"})
    assert code == 200 and r["structuredContent"] == {" ok ": "\u00e9\u4e2d\U0001f600"}


async def test_invalid_utf8_inside_a_string_is_400_not_a_dead_child(alpha) -> None:
    node, nc = alpha
    before = await bundle_status(nc, node.name, "alpha/tools")
    code, body = await call(nc, "mesh.tool.alpha.echo", raw=b'{"name": "\xff\xfe"}')
    assert code == 400, body
    after = await bundle_status(nc, node.name, "alpha/tools")
    assert after["pid"] == before["pid"] and after["restarts"] == 0


async def test_deeply_nested_arguments_are_answered_clearly_without_a_traceback(alpha) -> None:
    node, nc = alpha
    depth = 100_000  # 200 KB: well within the bus's limit
    code, body = await call(nc, "mesh.tool.alpha.echo", raw=b'{"deep": ' + b"[" * depth + b"]" * depth + b"}")
    assert code == 400, body
    assert "Traceback" not in node.log()


TYPED_CASES = [
    ({}, "name", "required argument 'name' is missing"),
    ({"count": 1}, "name", "required argument 'name' is missing"),
    ({"name": 5}, "name", "is an integer; it must be string"),
    ({"name": None}, "name", "is a null; it must be string"),
    ({"name": ["a"]}, "name", "is an array; it must be string"),
    ({"name": {"first": "a"}}, "name", "is an object; it must be string"),
    ({"name": True}, "name", "is a boolean; it must be string"),
    ({"name": "a", "count": 1.5}, "count", "is a number; it must be integer"),
    ({"name": "a", "count": "3"}, "count", "is a string; it must be integer"),
    ({"name": "a", "count": False}, "count", "is a boolean; it must be integer"),
    ({"name": "a", "ratio": "0.5"}, "ratio", "is a string; it must be number"),
    ({"name": "a", "colour": "red"}, "colour", "unknown argument 'colour'"),
]


async def test_arguments_failing_the_input_schema_are_400_naming_the_field(alpha) -> None:
    node, nc = alpha
    for args, field, text in TYPED_CASES:
        code, body = await call(nc, "mesh.tool.alpha.typed", args)
        assert code == 400, (args, body)
        assert body["error"]["field"] == field, (args, body)
        assert text in body["error"]["message"], (args, body)
        assert body["error"]["subject"] == "mesh.tool.alpha.typed"
    # An empty body is {}: the required field is still missing.
    msg = await nc.request("mesh.tool.alpha.typed", b"", timeout=5)
    assert msg.headers and msg.headers["Nats-Service-Error-Code"] == "400"
    assert await _child_calls(nc, node) == 0
    for args in ({"name": "a"}, {"name": "a", "count": -3, "ratio": 1}, {"name": "", "ratio": -2.5e-3}):
        code, r = await call(nc, "mesh.tool.alpha.typed", args)
        assert code == 200 and r["structuredContent"] == args, (args, r)


async def test_integers_written_with_a_fraction_or_exponent_pass_the_schema_check(alpha) -> None:
    node, nc = alpha
    for raw in (b'{"name": "a", "count": 2.0}', b'{"name": "a", "count": 1e2}'):
        code, body = await call(nc, "mesh.tool.alpha.typed", raw=raw)
        assert code == 200, (raw, body)


async def test_unknown_tools_verbs_and_subjects_are_404_or_no_responders(alpha) -> None:
    node, nc = alpha
    code, body = await call(nc, "mesh.tool.alpha.nope", {})
    assert code == 404 and "no tool 'nope'" in body["error"]["message"], body
    assert "mesh.tool.alpha.echo" in body["error"]["known"]
    code, body = await call(nc, "mesh.tool.alpha.nope.deeper", {})
    assert code == 404, body
    code, body = await call(nc, "mesh.seat.memory.nope", {})
    assert code == 404 and "no verb 'nope'" in body["error"]["message"], body
    # A module or seat no node serves: nobody listens, and the bus says so at once.
    for subject in ("mesh.tool.nobody.echo", "mesh.seat.nobody.get"):
        started = time.monotonic()
        with pytest.raises(nats.errors.NoRespondersError):
            await nc.request(subject, b"{}", timeout=5)
        assert time.monotonic() - started < 2
    assert await _child_calls(nc, node) == 0


async def test_manifest_folder_with_mistakes_the_node_starts_and_names_each(tmp_path: Path, node_factory) -> None:
    mods = tmp_path / "mods"
    make_module(mods, "alpha")
    bad = {
        "bad-toml": b'name = "bad-toml"\nversion = \n',
        "bad-fields": b'name = "Bad Name"\nversion = "1"\n[[bundle]]\nname = "t"\nkind = "tool"\n',
        "not-utf8": b'name = "\xff\xfe"\n',
        "same-name": b'name = "alpha"\nversion = "2.0.0"\n',
        "empty": b"",
    }
    for folder, text in bad.items():
        (mods / folder).mkdir()
        (mods / folder / "module.toml").write_bytes(text)
    (mods / "no-manifest").mkdir()  # not a module folder at all: ignored
    # A valid manifest whose entry does not exist: it loads, then its bundle cannot start.
    gone = make_module(mods, "gone")
    (gone / "module.toml").write_text(
        (gone / "module.toml").read_text().replace('["python", "raw_child.py"]', '["./missing"]')
    )

    node = node_factory(mods)
    nc = await client(node.bus_url())
    await wait_state(nc, node.name, "alpha/tools", "ready")
    st = await status(nc, node.name)
    problems = st["problems"]
    shown = "\n".join(problems)

    def named(folder: str, text: str) -> bool:
        return any(f"{folder}/module.toml" in p and text in p for p in problems)

    assert named("bad-toml", "is not valid TOML"), shown
    assert named("bad-fields", "name:") and named("bad-fields", "kind"), shown
    assert not named("bad-fields", "version:"), shown  # version "1" is fine: only what is wrong is named
    assert named("not-utf8", "UTF-8"), shown
    assert named("same-name", "module 'alpha' is also in"), shown
    assert named("empty", "name"), shown
    log = node.log()
    for folder in bad:
        assert f"ERROR mesh.cli: module not loaded: {mods / folder}/module.toml" in log, folder
    assert "no-manifest" not in shown
    # Only the good modules were loaded; alpha serves.
    assert sorted(m["name"] for m in st["modules"]) == ["alpha", "gone"]
    code, r = await call(nc, "mesh.tool.alpha.echo", {"fine": True})
    assert code == 200 and r["structuredContent"] == {"fine": True}
    # The bundle that cannot start is named: failed, with the reason, and its calls are 503.
    failed = await wait_state(nc, node.name, "gone/tools", "failed", timeout=30)
    assert "cannot start" in (failed["last_error"] or "") and "missing" in failed["last_error"], failed
    code, body = await call(nc, "mesh.tool.gone.echo", {})
    assert code == 503 and body["error"]["state"] == "failed", body
    assert "ERROR mesh.bundle: bundle gone/tools failed" in node.log()
    assert "Traceback" not in node.log()
    await nc.close()
