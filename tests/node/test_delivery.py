"""Delivery, the node's side (runtime/delivery/): a real node in this process watches its membership
in its account's KV, fetches artifacts from the object store, verifies, unpacks and serves them.

Artifacts are real (packed by toolchains.pack, or written by hand as an attacker would:
tests/faults/delivery_support.py); their children are the fakes. Ported from tests/test_delivery.py
and tests/faults/test_membership.py, which run them on node processes.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any, Callable

import nats
import pytest

from runtime.meshctl.deliver import deliver, remove
from runtime.wire.membership import buckets, node_key
from tests.faults.delivery_support import manifest_text, module_ref, put_membership, upload, write_artifact
from tests.support.fake_child import Behaviour, Script, echo
from tests.support.inproc import Mesh, until
from toolchains.artifact import ArtifactLimits, ArtifactMeta
from toolchains.pack import pack


def says(word: str) -> Any:
    def answer(tool: str, arguments: dict[str, Any]) -> Any:
        return {"content": [{"type": "text", "text": word}]}

    return answer


def artifact(out: Path, module: str, version: str, seats: str = "") -> Path:
    """A real artifact of a Python tools bundle, packed by the project's packer."""
    stage = out / f"stage-{module}-{version}"
    stage.mkdir(parents=True)
    (stage / "main.py").write_text("print('the fake child runs in the test process')\n")
    manifest = (
        f'name = "{module}"\nversion = "{version}"\n\n[[bundle]]\nname = "tools"\nkind = "tools"\n'
        f'language = "python"\nsource = "src"\nentry = ["python", "main.py"]\n{seats}'
    )
    meta = ArtifactMeta(
        module=module,
        bundle="tools",
        version=version,
        kind="tools",
        language="python",
        entry=["python", "main.py"],
        manifest=manifest,
    )
    return pack(stage, meta, out)


async def empty_node(m: Mesh, **config: Any) -> None:
    """Node n1 serving nothing but what is delivered to it."""
    await m.start("n1", membership=True, **config)


async def served(m: Mesh, module: str, word: str | None = None) -> None:
    """`module` answers (saying `word`, when given); no responders or a 503 is "not yet"."""

    async def once() -> bool:
        try:
            result, code = await m.call(f"mesh.tool.{module}.greet", {}, timeout=2)
        except nats.errors.NoRespondersError:
            return False
        return code is None and (word is None or result["content"][0]["text"] == word)

    await until(once, f"module {module} served" + (f" saying {word}" if word else ""), timeout=10)


async def problem(m: Mesh, *words: str) -> str:
    async def find() -> str | None:
        return next((p for p in (await m.status("n1")).problems if all(w in p for w in words)), None)

    return await until(find, f"a status problem with {words}", timeout=10)


async def gone(m: Mesh, module: str) -> None:
    async def absent() -> bool:
        return module not in [s.name for s in (await m.status("n1")).modules]

    await until(absent, f"module {module} removed")


def quiet(line: str) -> None:
    pass


async def test_a_packed_python_artifact_is_delivered_verified_and_served(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    script.modules["store"] = [Behaviour(answer=says("store 1.0.0"))]
    await empty_node(m)
    said: list[str] = []
    await deliver(m.nc, [artifact(tmp_path / "out", "store", "1.0.0")], "n1", None, said.append)
    assert any("uploaded" in line for line in said) and said[-1] == "node n1: store 1.0.0 (tools); seats: none"
    await served(m, "store", "store 1.0.0")
    status = await m.status("n1")
    base = m.tmp / "state-n1" / "bundles" / "store" / "1.0.0"
    assert [(s.name, s.version, s.source) for s in status.modules] == [("store", "1.0.0", str(base / "module"))]
    (unpacked,) = [d for d in base.glob("tools-*") if d.is_dir()]
    child = script.of("store")[0]
    assert child.spec is not None and child.spec.cwd == str(unpacked)
    # Its bytecode was compiled once by the node (hash-based, unchecked): its children need not.
    pyc = unpacked / "__pycache__" / f"main.{sys.implementation.cache_tag}.pyc"
    assert pyc.is_file() and int.from_bytes(pyc.read_bytes()[4:8], "little") == 0b01


async def test_an_upgrade_replaces_one_module_and_leaves_the_other_alone(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    script.modules["store"] = [Behaviour(answer=says("1.0.0")), Behaviour(answer=says("2.0.0"))]
    await empty_node(m)
    out = tmp_path / "out"
    await deliver(m.nc, [artifact(out, "store", "1.0.0"), artifact(out, "other", "1.0.0")], "n1", None, quiet)
    await served(m, "store", "1.0.0")
    await served(m, "other")
    await deliver(m.nc, [artifact(out, "store", "2.0.0")], "n1", None, quiet)
    await served(m, "store", "2.0.0")
    assert [c.running for c in script.of("store")] == [False, True]
    assert len(script.of("other")) == 1 and script.of("other")[0].running
    versions = {s.name: s.version for s in (await m.status("n1")).modules}
    assert versions == {"store": "2.0.0", "other": "1.0.0"}


async def test_a_removed_module_goes_and_the_others_serve_on(tmp_path: Path, m: Mesh, script: Script) -> None:
    await empty_node(m)
    out = tmp_path / "out"
    await deliver(m.nc, [artifact(out, "store", "1.0.0"), artifact(out, "other", "1.0.0")], "n1", None, quiet)
    await served(m, "store")
    await served(m, "other")
    left = await remove(m.nc, ["store"], "n1")
    assert sorted(left.modules) == ["other"]
    await gone(m, "store")
    with pytest.raises(nats.errors.NoRespondersError):
        await m.nc.request("mesh.tool.store.greet", b"{}", timeout=5)
    assert not script.of("store")[0].running
    await served(m, "other")


async def test_a_redelivery_of_the_same_version_changes_nothing(tmp_path: Path, m: Mesh, script: Script) -> None:
    await empty_node(m)
    out = tmp_path / "out"
    v1 = artifact(out, "store", "1.0.0")
    await deliver(m.nc, [v1], "n1", None, quiet)
    await served(m, "store")
    said: list[str] = []
    await deliver(m.nc, [v1], "n1", None, said.append)
    assert said[0].endswith("already in the object store")
    # The membership is read in order: once a later change is served, the redelivery was seen.
    await deliver(m.nc, [artifact(out, "other", "1.0.0")], "n1", None, quiet)
    await served(m, "other")
    assert len(script.of("store")) == 1 and script.of("store")[0].running
    assert (await m.status("n1")).bundle("store/tools").restarts == 0  # type: ignore[union-attr]


async def test_a_removed_module_delivered_again_comes_back(tmp_path: Path, m: Mesh, script: Script) -> None:
    await empty_node(m)
    v1 = artifact(tmp_path / "out", "store", "1.0.0")
    await deliver(m.nc, [v1], "n1", None, quiet)
    await served(m, "store")
    await remove(m.nc, ["store"], "n1")
    await gone(m, "store")
    await deliver(m.nc, [v1], "n1", None, quiet)
    await served(m, "store")
    assert len(script.of("store")) == 2


async def test_a_delivered_seat_is_held_and_its_verb_served(tmp_path: Path, m: Mesh, script: Script) -> None:
    script.modules["store"] = [Behaviour(answer=echo, tools=("greet", "kv.get"))]
    await empty_node(m)
    seat = '\n[[seat]]\nname = "kv"\nstateless = true\n'
    await deliver(m.nc, [artifact(tmp_path / "out", "store", "1.0.0", seats=seat)], "n1", None, quiet)
    await served(m, "store")
    result, code = await m.call("mesh.seat.kv.get", {"k": 1})
    assert code is None and result["content"][0]["text"] == 'kv.get: {"k": 1}'


Entry = Callable[[dict[str, str]], dict[str, Any]]  # the membership entries, around an artifact's ref

HOSTILE: dict[str, tuple[Entry, tuple[str, ...]]] = {
    "a 300-character module name": (
        lambda ref: {"m" * 300: module_ref("1.0.0", {"tools": ref})},
        ("mmmm", "module is"),
    ),
    "a seat with a space": (
        lambda ref: {"bad": module_ref("1.0.0", {"tools": ref}, seats=["a b"])},
        ("bad", "seat is 'a b'"),
    ),
    "a seat that is a wildcard": (
        lambda ref: {"bad": module_ref("1.0.0", {"tools": ref}, seats=[">"])},
        ("bad", "seat is '>'"),
    ),
    "a 300-character version": (lambda ref: {"bad": module_ref("1" * 300, {"tools": ref})}, ("bad", "version is '111")),
    "a bundle key with a space": (
        lambda ref: {"bad": module_ref("1.0.0", {"a b": ref})},
        ("bad", "bundle key is 'a b'"),
    ),
    "an object name of 300 characters": (
        lambda ref: {"bad": module_ref("1.0.0", {"tools": {**ref, "object": "o" * 300}})},
        ("bad", "object is 'ooo"),
    ),
    "an entry of the wrong shape": (
        lambda ref: {"bad": {"version": 1, "seats": "all", "bundles": []}},
        ("bad", "not a membership entry"),
    ),
    "a language no toolchain has": (
        lambda ref: {"bad": module_ref("1.0.0", {"tools": {**ref, "language": "cobol"}})},
        ("bad", "language is 'cobol'"),
    ),
}


@pytest.mark.parametrize("what", list(HOSTILE))
async def test_a_hostile_membership_entry_is_that_modules_refusal_and_the_node_lives(
    tmp_path: Path, m: Mesh, script: Script, what: str
) -> None:
    await empty_node(m)
    out = tmp_path / "out"
    good = module_ref("1.0.0", {"tools": await upload(m.nc, write_artifact(out / "good.tar.gz", "good", "1.0.0"))})
    await put_membership(m.nc, "n1", {"good": good})
    await served(m, "good")
    bad = await upload(m.nc, write_artifact(out / "bad.tar.gz", "bad", "1.0.0"))
    entries, words = HOSTILE[what]
    await put_membership(m.nc, "n1", {"good": good, **entries(bad)})
    said = await problem(m, *words)
    assert "refused" in said, said
    assert m.running("n1"), "the node ended"
    await served(m, "good")
    assert len(script.of("good")) == 1 and [s.name for s in (await m.status("n1")).modules] == ["good"]


async def test_a_fixed_entry_after_a_refusal_is_taken_and_the_refusal_forgotten(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    await empty_node(m)
    bad = await upload(m.nc, write_artifact(tmp_path / "out" / "bad.tar.gz", "bad", "1.0.0"))
    await put_membership(m.nc, "n1", {"bad": module_ref("1.0.0", {"tools": bad}, seats=["a b"])})
    await problem(m, "bad", "refused")
    await put_membership(m.nc, "n1", {"bad": module_ref("1.0.0", {"tools": bad})})
    await served(m, "bad")
    assert (await m.status("n1")).problems == []


PATHS = {
    "module": ("../../esc1", "1.0.0", "tools", "'../../esc1'"),
    "version": ("esc", "../../../esc2", "tools", "'../../../esc2'"),
    "bundle key": ("esc", "1.0.0", "../../../../esc3", "'../../../../esc3'"),
}


@pytest.mark.parametrize("field", list(PATHS))
async def test_membership_fields_never_lead_a_path_out_of_the_state_folder(tmp_path: Path, m: Mesh, field: str) -> None:
    await empty_node(m)
    module, version, bundle, shown = PATHS[field]
    esc = await upload(m.nc, write_artifact(tmp_path / "out" / "esc.tar.gz", "esc", "1.0.0"))
    before = {p for p in tmp_path.rglob("*") if "state-n1" not in p.parts}
    await put_membership(m.nc, "n1", {module: module_ref(version, {bundle: esc})})
    await problem(m, shown, "refused")
    after = {p for p in tmp_path.rglob("*") if "state-n1" not in p.parts}
    assert after == before, f"written outside the state folder: {after - before}"
    assert not (m.tmp / "state-n1" / "bundles").exists()


async def test_an_artifact_that_does_not_match_its_sha256_is_refused_and_the_running_version_serves(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    script.modules["guarded"] = [Behaviour(answer=says("1.0.0"))]
    await empty_node(m)
    out = tmp_path / "out"
    v1 = module_ref("1.0.0", {"tools": await upload(m.nc, write_artifact(out / "v1.tar.gz", "guarded", "1.0.0"))})
    await put_membership(m.nc, "n1", {"guarded": v1})
    await served(m, "guarded", "1.0.0")
    v2 = await upload(m.nc, write_artifact(out / "v2.tar.gz", "guarded", "2.0.0"))
    forged = {**v2, "sha256": "0" * 64, "object": v2["object"].rsplit("/", 1)[0] + "/" + "0" * 16 + ".tar.gz"}
    await put_membership(m.nc, "n1", {"guarded": module_ref("2.0.0", {"tools": forged})})
    said = await problem(m, "guarded", "2.0.0 refused")
    assert "cannot be fetched" in said or "does not match its sha256" in said, said
    await served(m, "guarded", "1.0.0")
    assert len(script.of("guarded")) == 1


async def test_a_refused_version_is_named_once_not_at_every_membership_change(
    tmp_path: Path, m: Mesh, caplog: pytest.LogCaptureFixture
) -> None:
    await empty_node(m)
    out = tmp_path / "out"
    tamp = await upload(m.nc, write_artifact(out / "t.tar.gz", "tamp", "1.0.0"))
    other = module_ref("1.0.0", {"tools": await upload(m.nc, write_artifact(out / "o.tar.gz", "other", "1.0.0"))})
    hostile_ref = module_ref("1.0.0", {"tools": {**tamp, "sha256": "0" * 64}})
    caplog.set_level(logging.ERROR, logger="mesh.delivery")
    await put_membership(m.nc, "n1", {"tamp": hostile_ref})
    await problem(m, "tamp", "refused")
    for i in range(4):  # each change seen before the next: other comes and goes
        with_other = {"tamp": hostile_ref, **({"other": other} if i % 2 == 0 else {})}
        await put_membership(m.nc, "n1", with_other)
        if i % 2 == 0:
            await served(m, "other")
        else:
            await gone(m, "other")
    lines = [r.getMessage() for r in caplog.records if "tamp" in r.getMessage() and "refused" in r.getMessage()]
    assert len(lines) == 1, lines


async def test_a_membership_value_that_is_not_json_is_named_and_what_runs_keeps_running(
    tmp_path: Path, m: Mesh, caplog: pytest.LogCaptureFixture
) -> None:
    await empty_node(m)
    out = tmp_path / "out"
    good = module_ref("1.0.0", {"tools": await upload(m.nc, write_artifact(out / "good.tar.gz", "good", "1.0.0"))})
    await put_membership(m.nc, "n1", {"good": good})
    await served(m, "good")
    _, kv = await buckets(m.nc)
    await kv.put(node_key("n1"), b"\xff not json")  # type: ignore[attr-defined]
    await until(lambda: "membership of node n1 is not valid" in caplog.text, "the bad value named")
    await served(m, "good")
    other = module_ref("1.0.0", {"tools": await upload(m.nc, write_artifact(out / "o.tar.gz", "other", "1.0.0"))})
    await put_membership(m.nc, "n1", {"good": good, "other": other})
    await served(m, "other")


async def test_an_artifact_over_the_configured_limit_is_refused_naming_the_limit(tmp_path: Path, m: Mesh) -> None:
    await empty_node(m, delivery=ArtifactLimits(max_artifact_bytes=200_000, max_members=5))
    out = tmp_path / "out"
    big = write_artifact(out / "big.tar.gz", "big", "1.0.0", members={"r": os.urandom(300_000)}, level=0)
    many = write_artifact(out / "many.tar.gz", "many", "1.0.0", members={f"f/{i}": b"x" for i in range(10)})
    await put_membership(
        m.nc,
        "n1",
        {
            "big": module_ref("1.0.0", {"tools": await upload(m.nc, big)}),
            "many": module_ref("1.0.0", {"tools": await upload(m.nc, many)}),
        },
    )
    said = await problem(m, "big", "refused")
    assert "max_artifact_bytes" in said and "200000" in said, said
    said = await problem(m, "many", "refused")
    assert "max_members" in said and "5" in said, said
    assert not [p for p in (m.tmp / "state-n1").rglob("*") if p.is_file() and p.stat().st_size > 200_000]


async def test_an_artifact_whose_manifest_names_another_module_is_refused(tmp_path: Path, m: Mesh) -> None:
    await empty_node(m)
    art = write_artifact(tmp_path / "out" / "a.tar.gz", "liar", "1.0.0", manifest=manifest_text("honest", "1.0.0"))
    await put_membership(m.nc, "n1", {"liar": module_ref("1.0.0", {"tools": await upload(m.nc, art)})})
    said = await problem(m, "liar", "refused")
    assert "names module honest" in said, said
    with pytest.raises(nats.errors.NoRespondersError):
        await m.nc.request("mesh.tool.liar.greet", b"{}", timeout=5)
