"""The C SDK, the C toolchain and the hello-c bundle, driven as the node drives them.

Real gcc, real child processes: hello-c is built by the toolchain and its staged binary is
spoken to over stdio with the same framing the launcher uses.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any, Iterator

import msgspec
import pytest

from manifests import load_module
from tests.support.bus_contract import check_progress_and_cancel_over_the_bus
from tests.support.call_contract import (
    CALLER,
    CallContractTests,
    Wire,
    check_ask,
    check_caller,
    check_cancel,
    check_progress,
    expected,
    serving,
)
from tests.support.stdio_client import StdioClient
from toolchains.base import BuildContext, BuildFailed, ToolchainMissing
from toolchains.c import TOOLCHAIN

pytestmark = pytest.mark.toolchain("c")

REPO = Path(__file__).resolve().parent.parent
REVISIONS = ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"]


def build(module_dir: Path, work: Path, repo_root: Path = REPO) -> tuple[Path, Any]:
    """Build the module's first bundle into work/stage; return the stage and the BuildOutput."""
    module = load_module(module_dir)
    bundle = module.module.bundle[0]
    stage = work / "stage"
    stage.mkdir(parents=True)
    ctx = BuildContext(
        module=module,
        bundle=bundle,
        source_dir=module.source_dir(bundle),
        stage_dir=stage,
        cache_dir=work / "cache",
        repo_root=repo_root,
        log=lambda _: None,
    )
    return stage, TOOLCHAIN.build(ctx)


@pytest.fixture(scope="module")
def stage(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        TOOLCHAIN.check()
    except ToolchainMissing as e:  # reported as a failure, never skipped: CI must install it
        pytest.fail(f"{e} (scripts/setup-c.sh installs it)")
    staged, _ = build(REPO / "bundles" / "hello-c", tmp_path_factory.mktemp("hello-c"))
    return staged


@pytest.fixture
def client(stage: Path) -> Iterator[StdioClient]:
    with StdioClient([str(stage / "bin" / "hello-c")], cwd=stage) as c:
        c.initialize()
        yield c


def send_raw(c: StdioClient, line: bytes) -> None:
    assert c.proc.stdin is not None
    c.proc.stdin.write(line + b"\n")
    c.proc.stdin.flush()


def read_reply(c: StdioClient) -> dict[str, Any]:
    assert c.proc.stdout is not None
    line = c.proc.stdout.readline()
    assert line, "child closed stdout"
    return json.loads(line)


def rpc(c: StdioClient, msg: dict[str, Any]) -> dict[str, Any]:
    send_raw(c, json.dumps({"jsonrpc": "2.0", **msg}).encode())
    return read_reply(c)


def files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# ---- the build --------------------------------------------------------------------------------


def test_build_is_reproducible_across_checkouts(stage: Path, tmp_path: Path) -> None:
    # A second checkout at another path: absolute paths baked in would change the bytes.
    other = tmp_path / "elsewhere" / "checkout"
    shutil.copytree(REPO / "bundles" / "hello-c", other / "bundles" / "hello-c")
    shutil.copytree(REPO / "sdk" / "c", other / "sdk" / "c")
    again, out = build(other / "bundles" / "hello-c", tmp_path / "work", repo_root=other)
    assert files(again) == files(stage)
    assert list(files(stage)) == ["bin/hello-c"]
    assert out.os == "linux" and out.arch in ("amd64", "arm64")
    assert not any(p in (stage / "bin" / "hello-c").read_bytes() for p in (str(REPO).encode(), str(tmp_path).encode()))


def test_compile_error_is_build_failed_with_compiler_output(tmp_path: Path) -> None:
    module = write_module(tmp_path / "broken", "int main(void) { return missing_symbol; }\n")
    with pytest.raises(BuildFailed) as e:
        build(module, tmp_path / "work")
    assert "missing_symbol" in e.value.output and "error" in e.value.output


def test_entry_outside_the_bundle_is_refused(tmp_path: Path) -> None:
    module = load_module(write_module(tmp_path / "m", "int main(void) { return 0; }\n"))
    bundle = msgspec.structs.replace(module.module.bundle[0], entry=["../escape"])
    ctx = BuildContext(module, bundle, module.source_dir(bundle), tmp_path / "s", tmp_path / "c", REPO, lambda _: None)
    with pytest.raises(BuildFailed, match="inside the bundle"):
        TOOLCHAIN.build(ctx)


def test_missing_compiler_names_the_package(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ToolchainMissing, match="apt-get install gcc"):
        TOOLCHAIN.check()


def test_missing_jansson_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    # gcc answers as it does without libjansson-dev: the include fails, the archive is not found.
    absent = subprocess.CompletedProcess([], 1, stdout="libjansson.a\n", stderr="jansson.h: No such file")
    monkeypatch.setattr("toolchains.c._run_quiet", lambda cmd, stdin="": absent)
    with pytest.raises(ToolchainMissing, match="apt-get install libjansson-dev"):
        TOOLCHAIN.check()


# ---- the protocol -----------------------------------------------------------------------------


@pytest.mark.parametrize("revision", REVISIONS)
def test_initialize_answers_the_clients_revision(stage: Path, revision: str) -> None:
    with StdioClient([str(stage / "bin" / "hello-c")], cwd=stage) as c:
        result = c.request(
            "initialize", {"protocolVersion": revision, "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}
        )
        assert result["protocolVersion"] == revision
        assert result["capabilities"] == {"tools": {"listChanged": False}}
        assert result["serverInfo"] == {"name": "hello-c", "version": "0.1.0"}


def test_initialize_offers_the_latest_for_an_unknown_revision(stage: Path) -> None:
    with StdioClient([str(stage / "bin" / "hello-c")], cwd=stage) as c:
        assert c.request("initialize", {"protocolVersion": "1999-01-01"})["protocolVersion"] == "2025-11-25"


def test_tools_list_and_greet(client: StdioClient) -> None:
    (tool,) = client.list_tools()
    assert tool["name"] == "greet" and tool["inputSchema"]["required"] == ["name"]
    result = client.call("greet", {"name": "Ada"})
    assert result == {
        "content": [{"type": "text", "text": "Hello, Ada! (c)"}],
        "structuredContent": {"greeting": "Hello, Ada! (c)"},
        "isError": False,
    }


def test_missing_name_is_a_tool_error(client: StdioClient) -> None:
    result = client.call("greet", {})
    assert result["isError"] is True
    assert "missing argument `name`" in result["content"][0]["text"]


def test_garbage_line_is_a_parse_error_and_serving_goes_on(client: StdioClient) -> None:
    send_raw(client, b"this is { not json")
    reply = read_reply(client)
    assert reply["id"] is None and reply["error"]["code"] == -32700
    assert client.request("ping") == {}
    assert client.call("greet", {"name": "again"})["structuredContent"] == {"greeting": "Hello, again! (c)"}


def test_protocol_errors(client: StdioClient) -> None:
    assert rpc(client, {"id": 1, "method": "no/such"})["error"]["code"] == -32601
    assert rpc(client, {"id": 2, "method": "tools/call", "params": {"name": "nope"}})["error"]["code"] == -32602
    assert rpc(client, {"id": 3, "method": "tools/call", "params": {"arguments": {}}})["error"]["code"] == -32602
    bad_args = {"id": 4, "method": "tools/call", "params": {"name": "greet", "arguments": [1]}}
    assert rpc(client, bad_args)["error"]["code"] == -32602
    # Notifications are never answered: the next line read is the ping's reply.
    send_raw(
        client,
        json.dumps({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 99}}).encode(),
    )
    send_raw(client, json.dumps({"jsonrpc": "2.0", "method": "no/such/notification"}).encode())
    assert rpc(client, {"id": "p", "method": "ping"}) == {"jsonrpc": "2.0", "id": "p", "result": {}}


def test_one_mebibyte_argument(client: StdioClient) -> None:
    name = "x" * (1 << 20)
    result = client.call("greet", {"name": name})
    assert result["structuredContent"]["greeting"] == f"Hello, {name}! (c)"


def test_many_requests_in_flight_are_answered_by_id(client: StdioClient) -> None:
    ids = list(range(100, 120))
    for i in ids:  # all written before any reply is read
        msg = {
            "jsonrpc": "2.0",
            "id": i,
            "method": "tools/call",
            "params": {"name": "greet", "arguments": {"name": f"n{i}"}},
        }
        send_raw(client, json.dumps(msg).encode())
    replies = {r["id"]: r for r in (read_reply(client) for _ in ids)}
    assert sorted(replies) == ids
    assert all(replies[i]["result"]["structuredContent"]["greeting"] == f"Hello, n{i}! (c)" for i in ids)


def test_facts_create_the_data_dir_and_eof_exits_zero(stage: Path, tmp_path: Path) -> None:
    data = tmp_path / "data" / "hello-c"
    c = StdioClient([str(stage / "bin" / "hello-c")], cwd=stage, env={"MESH_DATA_DIR": str(data), "MESH_NODE": "n1"})
    c.initialize()
    assert data.is_dir() and (data.stat().st_mode & 0o777) == 0o700
    assert c.close() == 0
    assert c.proc.stderr is not None and b"serving on node n1" in c.proc.stderr.read()


def test_seat_verb_names_and_tool_registration_rules(tmp_path: Path) -> None:
    # A bundle whose main() checks the SDK's rules and exits 3 when one is broken.
    module = write_module(tmp_path / "seat", SEAT_CHECK_SOURCE)
    stage, _ = build(module, tmp_path / "work")
    with StdioClient([str(stage / "bin" / "m")], cwd=stage) as c:
        c.initialize()
        assert [t["name"] for t in c.list_tools()] == ["memory.store"]
        result = c.call("memory.store", {"a": 1, "b": 2})
        assert result["isError"] is False and result["structuredContent"] == {"stored": True, "keys": 2}
        assert json.loads(result["content"][0]["text"]) == {"stored": True, "keys": 2}  # text added for older clients
        assert c.close() == 0


SEAT_CHECK_SOURCE = r"""
#include <errno.h>
#include <string.h>
#include "mesh.h"

static void store(json_t *args, mesh_result *r, void *ud) {
    const char *key;
    json_t *value;
    json_int_t n = 0;
    (void)ud;
    json_object_foreach(args, key, value) n += key[0] != '\0' && value != NULL;  /* compiles under -Werror */
    mesh_result_structured(r, json_pack("{s:b, s:I}", "stored", 1, "keys", n));
}

#define CHECK(cond) do { if (!(cond)) { mesh_log(MESH_ERROR, "check failed: %s", #cond); return 3; } } while (0)

int main(void) {
    char buf[64], tiny[4];
    CHECK(mesh_seat_verb(buf, sizeof buf, "memory", "store") == 0 && strcmp(buf, "memory.store") == 0);
    CHECK(mesh_seat_verb(buf, sizeof buf, "Memory", "store") == -1 && errno == EINVAL);
    CHECK(mesh_seat_verb(buf, sizeof buf, "mem.ory", "store") == -1 && errno == EINVAL);
    CHECK(mesh_seat_verb(buf, sizeof buf, "memory", "st.ore") == -1 && errno == EINVAL);
    CHECK(mesh_seat_verb(buf, sizeof buf, "memory", "") == -1 && errno == EINVAL);
    CHECK(mesh_seat_verb(tiny, sizeof tiny, "memory", "store") == -1 && errno == ERANGE);
    mesh_server *s = mesh_server_new("m", "0");
    CHECK(s != NULL);
    CHECK(mesh_tool_add(s, buf, "stores", NULL, store, NULL) == 0);
    CHECK(mesh_tool_add(s, buf, "twice", NULL, store, NULL) == -1);
    CHECK(mesh_tool_add(s, "bad name", NULL, NULL, store, NULL) == -1);
    CHECK(mesh_tool_add(s, "x", NULL, "{not json", store, NULL) == -1);
    CHECK(mesh_tool_add(s, "y", NULL, "{\"type\": \"array\"}", store, NULL) == -1);
    int rc = mesh_serve_stdio(s);
    mesh_server_free(s);
    return rc;
}
"""


def write_module(root: Path, main_c: str) -> Path:
    (root / "src").mkdir(parents=True)
    (root / "src" / "main.c").write_text(main_c)
    (root / "module.toml").write_text(
        'name = "m"\nversion = "0.0.1"\n\n[[bundle]]\nname = "tools"\nkind = "tools"\nlanguage = "c"\n'
        'source = "src"\nentry = ["bin/m"]\n'
    )
    return root


# ---- the call: caller, cancellation, progress -------------------------------------------------

CONTRACT_SOURCE = r"""
#include <stdio.h>
#include <time.h>
#include "mesh.h"

static void nap_ms(long ms) {
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

static void mark(const char *path, const char *line) {
    FILE *f = fopen(path, "a");
    if (f) fprintf(f, "%s\n", line), fclose(f);
}

/* Arguments are ignored: a caller written there must never be believed. */
static void whoami(json_t *args, mesh_result *r, void *ud) {
    (void)args, (void)ud;
    const struct mesh_caller *c = mesh_call_caller(r);
    json_t *person = c && c->person ? json_pack("{s:s, s:s, s:s}", "iss", c->person->iss, "sub", c->person->sub,
                                                "name", c->person->name)
                                    : json_null();
    json_t *seen = c ? json_pack("{s:s, s:s?, s:s?, s:s, s:s, s:o}", "account", c->account, "user", c->user,
                                 "name", c->name, "via", c->via, "id", c->id, "person", person)
                     : (json_decref(person), json_null());
    mesh_result_text(r, "%s", c ? c->id : "nobody");
    mesh_result_structured(r, json_pack("{s:o}", "caller", seen));
}

static void wait_cancel(json_t *args, mesh_result *r, void *ud) {
    (void)ud;
    const char *marker = json_string_value(json_object_get(args, "marker"));
    if (!marker) { mesh_result_error(r, "needs marker"); return; }
    mark(marker, "started");
    for (int i = 0; i < 6000; i++, nap_ms(5))
        if (mesh_call_cancelled(r)) {
            mark(marker, "cancelled");
            mesh_result_text(r, "cancelled, and this must not be sent");
            return;
        }
    mesh_result_text(r, "never cancelled");
}

static void count(json_t *args, mesh_result *r, void *ud) {
    (void)ud;
    json_int_t steps = json_integer_value(json_object_get(args, "steps"));
    char message[32];
    for (json_int_t i = 1; i <= steps; i++) {
        snprintf(message, sizeof message, "step %lld", (long long)i);
        if (mesh_call_progress(r, (double)i, (double)steps, message) != 0) mesh_log(MESH_ERROR, "progress failed");
    }
    mesh_result_text(r, "counted %lld", (long long)steps);
}

/* Sleeps without ever asking whether it was cancelled. */
static void nap(json_t *args, mesh_result *r, void *ud) {
    (void)ud;
    nap_ms((long)json_integer_value(json_object_get(args, "ms")));
    mesh_result_text(r, "napped");
}

/* Asks the caller, copying the call's mesh/call, and says what they answered. */
static void confirm(json_t *args, mesh_result *r, void *ud) {
    (void)ud;
    const char *question = json_string_value(json_object_get(args, "question"));
    struct mesh_elicit_answer a;
    if (mesh_call_elicit(r, question ? question : "?", "{\"type\":\"object\",\"properties\":{\"ok\":{\"type\":\"boolean\"}},\"required\":[\"ok\"]}", &a) != 0) {
        mesh_result_error(r, "could not ask: %s", a.error);
        return;
    }
    if (a.action == MESH_ELICIT_ACCEPT) {
        json_t *content = a.content ? json_loads(a.content, 0, NULL) : NULL;
        mesh_result_text(r, "ok=%s", json_is_true(json_object_get(content, "ok")) ? "true" : "false");
        json_decref(content);
    } else {
        mesh_result_text(r, "%s", a.action == MESH_ELICIT_DECLINE ? "declined" : "cancelled");
    }
}

int main(void) {
    mesh_server *s = mesh_server_new("contract", "0");
    if (!s || mesh_tool_add(s, "whoami", NULL, NULL, whoami, NULL) || mesh_tool_add(s, "wait_cancel", NULL, NULL, wait_cancel, NULL)
        || mesh_tool_add(s, "count", NULL, NULL, count, NULL) || mesh_tool_add(s, "nap", NULL, NULL, nap, NULL)
        || mesh_tool_add(s, "confirm", NULL, NULL, confirm, NULL))
        return 3;
    int rc = mesh_serve_stdio(s);
    mesh_server_free(s);
    return rc;
}
"""


@pytest.fixture(scope="module")
def contract_stage(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("contract")
    staged, _ = build(write_module(root / "m", CONTRACT_SOURCE), root / "work")
    return staged


@pytest.fixture
def contract(contract_stage: Path) -> Iterator[Wire]:
    with serving([str(contract_stage / "bin" / "m")], cwd=contract_stage) as wire:
        yield wire


class TestCallContract(CallContractTests):
    """Caller, cancellation (mesh_call_cancelled, polled), progress and asking (mesh_call_elicit), as
    tests/support/call_contract.py checks them."""


def test_a_cancel_is_honoured_even_when_the_handler_never_asks(contract: Wire) -> None:
    contract.call(70, "nap", {"ms": 300})
    contract.send({"method": "notifications/cancelled", "params": {"requestId": 70}})
    contract.send({"id": 71, "method": "ping"})
    contract.until(71)
    assert [m for m in contract.seen if m.get("id") == 70] == [], "a cancelled call was answered"


def test_a_call_cancelled_before_it_starts_never_runs(contract: Wire, tmp_path: Path) -> None:
    first, queued = tmp_path / "first", tmp_path / "queued"
    contract.call(80, "wait_cancel", {"marker": str(first)})
    contract.call(81, "wait_cancel", {"marker": str(queued)})
    contract.send({"method": "notifications/cancelled", "params": {"requestId": 81}})
    contract.send({"method": "notifications/cancelled", "params": {"requestId": 80}})
    contract.call(82, "whoami", {}, {"mesh/caller": CALLER})
    reply, before = contract.until(82)
    assert reply["result"]["structuredContent"]["caller"] == expected(CALLER)
    assert before == [], "a cancelled call was answered"
    assert first.read_text().split() == ["started", "cancelled"]
    assert not queued.exists(), "a call cancelled while it waited in line was run"
    # A cancel for a call long answered (or never made) changes nothing.
    contract.send({"method": "notifications/cancelled", "params": {"requestId": 82}})
    contract.call(83, "whoami", {}, {"mesh/caller": CALLER})
    assert contract.until(83)[0]["result"]["structuredContent"]["caller"] == expected(CALLER)


# ---- memory -----------------------------------------------------------------------------------


def valgrind_argv(binary: Path, log: Path) -> list[str]:
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        pytest.fail("valgrind is not installed: apt-get install valgrind")
    return [
        valgrind,
        "--leak-check=full",
        "--show-leak-kinds=all",
        "--errors-for-leak-kinds=all",
        "--error-exitcode=99",
        f"--log-file={log}",
        str(binary),
    ]


def assert_clean(code: int, log: Path) -> None:
    report = log.read_text()
    assert code == 0, report
    assert "ERROR SUMMARY: 0 errors" in report, report
    assert "All heap blocks were freed" in report, report


@pytest.mark.slow
def test_a_session_under_valgrind_is_clean(stage: Path, tmp_path: Path) -> None:
    log = tmp_path / "valgrind.log"
    with StdioClient(
        valgrind_argv(stage / "bin" / "hello-c", log), cwd=stage, env={"MESH_DATA_DIR": str(tmp_path / "data")}
    ) as c:
        c.initialize()
        c.list_tools()
        assert c.call("greet", {"name": "Ada"})["isError"] is False
        assert c.call("greet", {})["isError"] is True
        send_raw(c, b"garbage")
        assert read_reply(c)["error"]["code"] == -32700
        assert rpc(c, {"id": "u", "method": "tools/call", "params": {"name": "nope"}})["error"]["code"] == -32602
        assert c.call("greet", {"name": "y" * (1 << 20)})["isError"] is False
        code = c.close()
    assert_clean(code, log)


@pytest.mark.slow
def test_callers_cancels_and_progress_under_valgrind_are_clean(contract_stage: Path, tmp_path: Path) -> None:
    log = tmp_path / "valgrind.log"
    client = StdioClient(valgrind_argv(contract_stage / "bin" / "m", log), cwd=contract_stage)
    wire = Wire(client)
    wire.initialize()
    check_caller(wire)
    check_progress(wire)
    check_cancel(wire, tmp_path / "marker")
    check_ask(wire)  # the answers kept for the call are freed when it ends
    # cancels read ahead, one for a call never made: each noted id is freed when the loop reaches it
    wire.call(90, "wait_cancel", {"marker": str(tmp_path / "m2")})
    wire.send({"method": "notifications/cancelled", "params": {"requestId": 90}})
    wire.send({"method": "notifications/cancelled", "params": {"requestId": "never-made"}})
    wire.send({"id": 91, "method": "ping"})
    wire.until(91)
    assert_clean(client.close(), log)


async def test_progress_and_cancel_over_the_bus_through_a_node(
    contract_stage: Path, node_factory, tmp_path: Path
) -> None:
    """docs/bus.md end to end: bus progress from the SDK's progress, a bus cancel reaches mesh_call_cancelled."""
    await check_progress_and_cancel_over_the_bus(
        node_factory, tmp_path / "mods", [], tmp_path / "marker", program=contract_stage / "bin" / "m"
    )
