"""A real node in this process: calls from the bus to (fake) children and back."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.fake_child import Behaviour, Script, echo
from tests.support.inproc import Mesh, module_folder


async def test_a_call_reaches_the_child_and_its_result_comes_back(tmp_path: Path, m: Mesh) -> None:
    await m.start("n1", module_folder(tmp_path, "alpha"))
    result, code = await m.call("mesh.tool.alpha.greet", {"name": "Ada"})
    assert code is None and result["content"][0]["text"] == 'greet: {"name": "Ada"}'


async def test_an_unknown_module_is_404_naming_what_is_served(tmp_path: Path, m: Mesh) -> None:
    await m.start("n1", module_folder(tmp_path, "alpha"))
    body, code = await m.call("mesh.tool.alpha.nope", {})
    assert code == "404" and "module alpha has no tool 'nope'" in body["error"]["message"]
    assert body["error"]["known"] == ["mesh.tool.alpha.greet"]


async def test_a_body_that_is_not_an_object_is_400_and_never_reaches_the_child(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    await m.start("n1", module_folder(tmp_path, "alpha"))
    body, code = await m.call("mesh.tool.alpha.greet", b"[1, 2]")
    assert code == "400" and "must be a JSON object" in body["error"]["message"]
    assert not [r for r in script.started[-1].received if r.get("method") == "tools/call"]


async def test_a_bundle_that_cannot_start_is_503_naming_it_and_the_others_serve(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    script.modules["broken"] = [Behaviour(unstartable=True)]
    await m.start("n1", module_folder(tmp_path, "alpha"), module_folder(tmp_path, "broken"))
    await m.bundle_state("n1", "broken/tools", "failed")
    body, code = await m.call("mesh.tool.broken.greet", {})
    assert code == "503" and body["error"]["bundle"] == "broken/tools" and body["error"]["state"] == "failed", body
    result, code = await m.call("mesh.tool.alpha.greet", {})
    assert code is None and "greet" in json.dumps(result)


async def test_a_call_past_the_bundles_timeout_is_504_and_the_child_is_told(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    script.modules["slow"] = [Behaviour(answer=echo, call_seconds=5)]
    await m.start("n1", module_folder(tmp_path, "slow", timeout_ms=200))
    body, code = await m.call("mesh.tool.slow.greet", {})
    assert code == "504" and body["error"]["timeout_ms"] == 200 and body["error"]["waited_for"] == "child"
    cancelled = [r for r in script.started[-1].received if r.get("method") == "notifications/cancelled"]
    assert len(cancelled) == 1
