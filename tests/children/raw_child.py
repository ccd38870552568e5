"""A stdlib-only MCP server for tests: a real child whose misbehaviour is chosen by RAW_MODE.

Modes: normal, exit_at_start, no_init, no_ping, noisy, garbage, ignore_term, slow_start,
ping_flood (after the handshake: pings the node in a loop and never reads its stdin again),
garbage_flood (after the handshake: writes lines that are not JSON-RPC without pause, answers
no ping). RAW_SINGLE=1: `sleep` runs on the one thread that reads stdin (a single-threaded child).
RAW_EXIT_DELAY: seconds the child lingers after its stdin closes before it exits.
Tools: echo, sleep, crash, big, add_tool, grandchild, pid, env, fail, remember, version, typed,
mirror, whoami, trickle, hold, progress, meta (the call's params._meta, as the node sent it),
confirm (asks its client with elicitation/create, copying _meta["mesh/call"]; its result's text is
the response it got, as JSON).
RAW_START_LOG: a file the child appends "<unix time> <pid>" to when it starts (restart spacing).
RAW_CALL_LOG: a file the child appends "<unix time> started|cancelled|answered <request id> [reason]"
to (the hold tool and every notifications/cancelled), so a test sees what reached the child and when.
RAW_TOOLS="<n>:<bytes>": list n tools `gen00`, `gen01`, ... (echoes) of about that many bytes of
definition each, instead of the tools above (a catalogue of a known size).
RAW_ERA=stateless: the 2026-07-28 revision only: `initialize` is refused, `server/discover` answers,
and every request without the version envelope in `_meta` is refused (tool `meta` shows `_meta`).
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time

MODE = os.environ.get("RAW_MODE", "normal")
# A fault that an operator can fix: once this file exists the child starts normally.
if os.environ.get("RAW_OK_FILE") and os.path.exists(os.environ["RAW_OK_FILE"]):
    MODE = "normal"
REVISION = os.environ.get("RAW_PROTOCOL", "")
STATELESS = os.environ.get("RAW_ERA") == "stateless"
MODERN = "2026-07-28"
VERSION_KEY = "io.modelcontextprotocol/protocolVersion"
_out_lock = threading.Lock()
_asks: dict[str, queue.Queue[dict]] = {}  # the child's own requests waiting for their responses
_cancelled: set[object] = set()
_extra_tools: list[dict] = []


def log_call(event: str, rid: object, extra: str = "") -> None:
    path = os.environ.get("RAW_CALL_LOG")
    if path:
        with open(path, "a") as f:
            f.write(f"{time.time():.6f} {event} {json.dumps(rid)} {extra}".rstrip() + "\n")


TOOLS = [
    {"name": "echo", "description": "Echo the arguments", "inputSchema": {"type": "object"}},
    {
        "name": "sleep",
        "description": "Sleep then answer",
        "inputSchema": {"type": "object", "properties": {"seconds": {"type": "number"}}},
    },
    {"name": "crash", "description": "Exit at once", "inputSchema": {"type": "object"}},
    {
        "name": "big",
        "description": "Answer with N bytes of text",
        "inputSchema": {"type": "object", "properties": {"bytes": {"type": "integer"}}},
    },
    {"name": "add_tool", "description": "Add a tool and say so", "inputSchema": {"type": "object"}},
    {"name": "grandchild", "description": "Start grandchildren", "inputSchema": {"type": "object"}},
    {"name": "pid", "description": "The child's pid", "inputSchema": {"type": "object"}},
    {"name": "escapee", "description": "A setsid grandchild with an empty env", "inputSchema": {"type": "object"}},
    {"name": "env", "description": "The child's environment", "inputSchema": {"type": "object"}},
    {"name": "fail", "description": "A tool error", "inputSchema": {"type": "object"}},
    {"name": "echo.say", "description": "Seat verb", "inputSchema": {"type": "object"}},
    {"name": "remember", "description": "Store or read a value in MESH_DATA_DIR", "inputSchema": {"type": "object"}},
    {"name": "version", "description": "RAW_VERSION of this child", "inputSchema": {"type": "object"}},
    {
        "name": "mirror",
        "description": "The arguments once, with their size and hash",
        "inputSchema": {"type": "object"},
    },
    {"name": "whoami", "description": "The node and pid serving this call", "inputSchema": {"type": "object"}},
    {"name": "meta", "description": "The params._meta this call carried", "inputSchema": {"type": "object"}},
    {
        "name": "trickle",
        "description": "Write one answer slowly, a chunk at a time, over some seconds",
        "inputSchema": {"type": "object", "properties": {"seconds": {"type": "number"}, "chunks": {"type": "integer"}}},
    },
    {
        "name": "hold",
        "description": "Wait until cancelled (or `seconds` pass), logging to RAW_CALL_LOG",
        "inputSchema": {"type": "object", "properties": {"seconds": {"type": "number"}}},
        "execution": {"taskSupport": "optional"},  # passed through to MCP clients as declared
    },
    {
        "name": "progress",
        "description": "Send `steps` notifications/progress (when given a progressToken), `delay` s apart, then answer",
        "inputSchema": {"type": "object", "properties": {"steps": {"type": "integer"}, "delay": {"type": "number"}}},
    },
    {
        "name": "confirm",
        "description": "Ask the user to confirm (elicitation/create), then say what they answered",
        "inputSchema": {"type": "object", "properties": {"question": {"type": "string"}}},
        "execution": {"taskSupport": "optional"},  # a 2026-07-28 client that declares Tasks gets a task
    },
    {
        "name": "typed",
        "description": "A tool with a strict schema",
        "inputSchema": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "count": {"type": "integer"}, "ratio": {"type": "number"}},
            "required": ["name"],
            "additionalProperties": False,
        },
    },
]


def generated_tools(spec: str) -> list[dict]:
    """RAW_TOOLS: n tools of about `size` bytes of JSON each (the padding in the description)."""
    count, _, size = spec.partition(":")
    tools = []
    for i in range(int(count)):
        tool = {
            "name": f"gen{i:02}",
            "description": "",
            "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}, "n": {"type": "integer"}}},
        }
        pad = max(0, int(size or 0) - len(json.dumps(tool, separators=(",", ":"))))
        tool["description"] = (f"Generated tool {i}: echoes its arguments. " + "." * pad)[:pad]
        tools.append(tool)
    return tools


if os.environ.get("RAW_TOOLS"):
    TOOLS = generated_tools(os.environ["RAW_TOOLS"])


def send(msg: dict) -> None:
    data = json.dumps(msg, separators=(",", ":")) + "\n"
    with _out_lock:
        sys.stdout.write(data)
        sys.stdout.flush()


def text_result(text: str, structured: object = None, is_error: bool = False) -> dict:
    result: dict = {"content": [{"type": "text", "text": text}], "isError": is_error}
    if structured is not None:
        result["structuredContent"] = structured
    return result


def confirm(rid: object, args: dict, meta: dict | None) -> None:
    ask_id = f"confirm-{rid}"
    waiting: queue.Queue[dict] = queue.Queue()
    _asks[ask_id] = waiting
    params: dict = {
        "message": str(args.get("question", "Go on?")),
        "requestedSchema": {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
    }
    if meta and "mesh/call" in meta:
        params["_meta"] = {"mesh/call": meta["mesh/call"]}
    send({"jsonrpc": "2.0", "id": ask_id, "method": "elicitation/create", "params": params})
    try:
        response = waiting.get(timeout=60)
    except queue.Empty:
        response = {"error": "no response within 60 s"}
    _asks.pop(ask_id, None)
    response.pop("jsonrpc", None)
    send({"jsonrpc": "2.0", "id": rid, "result": text_result(json.dumps(response, sort_keys=True))})


def call(rid: object, name: str, args: dict, meta: dict | None = None) -> None:
    if name in ("echo", "echo.say", "typed") or name.startswith(("extra", "gen")):
        send({"jsonrpc": "2.0", "id": rid, "result": text_result(json.dumps(args), args)})
    elif name == "sleep":
        deadline = time.monotonic() + float(args.get("seconds", 1))
        while time.monotonic() < deadline:
            if rid in _cancelled:
                sys.stderr.write(f"cancelled {rid}\n")
                sys.stderr.flush()
                return
            time.sleep(0.01)
        send({"jsonrpc": "2.0", "id": rid, "result": text_result("slept", {"slept": args.get("seconds", 1)})})
    elif name == "crash":
        os._exit(3)
    elif name == "big":
        send({"jsonrpc": "2.0", "id": rid, "result": text_result("x" * int(args.get("bytes", 1000)))})
    elif name == "add_tool":
        _extra_tools.append({"name": f"extra{len(_extra_tools)}", "inputSchema": {"type": "object"}})
        send({"jsonrpc": "2.0", "id": rid, "result": text_result("added")})
        send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
    elif name == "grandchild":
        same = subprocess.Popen(["sleep", "1000"])
        away = subprocess.Popen(["sleep", "1001"], start_new_session=bool(args.get("setsid")))
        send({"jsonrpc": "2.0", "id": rid, "result": text_result("ok", {"pids": [same.pid, away.pid]})})
    elif name == "escapee":
        # A grandchild that leaves the group and carries no environment at all: no run marker.
        away = subprocess.Popen(["/bin/sleep", "1003"], env={}, start_new_session=True)
        send({"jsonrpc": "2.0", "id": rid, "result": text_result("ok", {"pids": [away.pid]})})
    elif name == "pid":
        send({"jsonrpc": "2.0", "id": rid, "result": text_result(str(os.getpid()), {"pid": os.getpid()})})
    elif name == "env":
        send({"jsonrpc": "2.0", "id": rid, "result": text_result("env", dict(os.environ))})
    elif name == "remember":
        path = os.path.join(os.environ["MESH_DATA_DIR"], "store.json")
        store = json.load(open(path)) if os.path.exists(path) else {}
        if "key" in args and "value" in args:
            store[args["key"]] = args["value"]
            with open(path, "w") as f:
                json.dump(store, f)
        send({"jsonrpc": "2.0", "id": rid, "result": text_result("ok", store)})
    elif name == "version":
        v = os.environ.get("RAW_VERSION", "")
        send({"jsonrpc": "2.0", "id": rid, "result": text_result(v, {"version": v})})
    elif name == "mirror":
        # The arguments once (echo sends them twice: text and structured), so a large request fits back.
        raw = json.dumps(args, separators=(",", ":")).encode()
        digest = hashlib.sha256(raw).hexdigest()
        send({"jsonrpc": "2.0", "id": rid, "result": text_result(f"{len(raw)} {digest}", args)})
    elif name == "whoami":
        me = {"node": os.environ.get("MESH_NODE", ""), "pid": os.getpid()}
        send({"jsonrpc": "2.0", "id": rid, "result": text_result(json.dumps(me), me)})
    elif name == "trickle":
        # One line written over `seconds`: stdout is busy with it all along, so nothing else
        # (a ping's answer included) can be written before it ends.
        chunks, seconds = int(args.get("chunks", 40)), float(args.get("seconds", 2))
        head = json.dumps({"jsonrpc": "2.0", "id": rid, "result": text_result("")}, separators=(",", ":"))
        before, after = head.split('"text":""', 1)
        with _out_lock:
            sys.stdout.write(before + '"text":"')
            for _ in range(chunks):
                sys.stdout.write("x" * 1000)
                sys.stdout.flush()
                time.sleep(seconds / chunks)
            sys.stdout.write('"' + after + "\n")
            sys.stdout.flush()
    elif name == "hold":
        log_call("started", rid, str(args.get("tag", "")))
        deadline = time.monotonic() + float(args.get("seconds", 30))
        while time.monotonic() < deadline and rid not in _cancelled:
            time.sleep(0.005)
        if rid not in _cancelled:  # a cancelled call is not answered (MCP: the receiver should not)
            log_call("answered", rid)
            send({"jsonrpc": "2.0", "id": rid, "result": text_result("held")})
    elif name == "progress":
        token = (meta or {}).get("progressToken")
        steps, delay = int(args.get("steps", 5)), float(args.get("delay", 0))
        if token is not None:
            for i in range(1, steps + 1):
                send(
                    {
                        "jsonrpc": "2.0",
                        "method": "notifications/progress",
                        "params": {"progressToken": token, "progress": i, "total": steps, "message": f"step {i}"},
                    }
                )
                time.sleep(delay)
        send({"jsonrpc": "2.0", "id": rid, "result": text_result("done", {"token": token, "steps": steps})})
    elif name == "fail":
        send({"jsonrpc": "2.0", "id": rid, "result": text_result("it failed on purpose", is_error=True)})
    else:
        send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32602, "message": f"Unknown tool: {name}"}})


# Lines a broken child might write on stdout: none is an answer to a call of the node's.
GARBAGE = [
    b"plain text, not JSON",
    b"{broken json",
    b"[1, 2, 3]",
    b'"a JSON string"',
    b"42",
    b"null",
    b'{"id": {"nested": true}, "result": {}}',
    b'{"jsonrpc": "2.0", "id": 987654321, "result": {"content": []}}',
    b'{"jsonrpc": "2.0", "id": "not-the-nodes", "error": {"code": 1, "message": "x"}}',
    b'{"jsonrpc": "2.0", "method": "notifications/unknown", "params": {"x": 1}}',
    b"\xff\xfe\x00 binary",
    b"   ",
]


def garbage() -> None:
    with _out_lock:
        for line in GARBAGE:
            sys.stdout.buffer.write(line + b"\n")
        sys.stdout.buffer.flush()


def garbage_flood() -> None:
    while True:
        with _out_lock:
            for i in range(100):
                sys.stdout.write(f"garbage line {i}, not JSON-RPC\n")
            sys.stdout.flush()
        time.sleep(0.001)


def ping_flood() -> None:
    n, pad = 0, "x" * int(os.environ.get("RAW_PING_ID_BYTES", "16"))
    while True:
        n += 1
        send({"jsonrpc": "2.0", "id": f"p{n}{pad}", "method": "ping"})  # the answer carries the id back


def main() -> None:
    if os.environ.get("RAW_START_LOG"):
        with open(os.environ["RAW_START_LOG"], "a") as f:
            f.write(f"{time.time():.6f} {os.getpid()}\n")
    if MODE == "exit_at_start":
        sys.stderr.write("cannot start: the configuration is missing\n")
        sys.exit(2)
    if MODE == "ignore_term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if MODE == "slow_start":
        time.sleep(float(os.environ.get("RAW_START_DELAY", "0.3")))
    if MODE == "noisy":
        sys.stdout.write("this is not json\n{broken\n\n")
        sys.stdout.flush()
    if MODE == "garbage":
        garbage()
    initialized = False
    for line in sys.stdin:
        if MODE == "noisy":
            sys.stderr.write("noise " * 20 + "\n")
        try:
            msg = json.loads(line)
        except ValueError:
            send({"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "Parse error"}})
            continue
        method, rid = msg.get("method"), msg.get("id")
        params = msg.get("params") or {}
        if STATELESS and rid is not None and method is not None:
            if method == "initialize":
                error = {"code": -32022, "message": "this server speaks 2026-07-28 only: no initialize"}
                send({"jsonrpc": "2.0", "id": rid, "error": dict(error, data={"supported": [MODERN]})})
                continue
            if (params.get("_meta") or {}).get(VERSION_KEY) != MODERN:
                error = {"code": -32602, "message": f"params._meta is missing the required envelope key {VERSION_KEY}"}
                send({"jsonrpc": "2.0", "id": rid, "error": error})
                continue
            if method == "server/discover":
                result = {
                    "supportedVersions": [MODERN],
                    "capabilities": {"tools": {}},
                    "resultType": "complete",
                    "cacheScope": "public",
                    "ttlMs": 0,
                    "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "raw-child", "version": "1"}},
                }
                send({"jsonrpc": "2.0", "id": rid, "result": result})
                continue
            if method == "ping":  # no ping in this revision
                send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": "Method not found: ping"}})
                continue
        if method is None and rid in _asks:
            _asks[rid].put(msg)
            continue
        if method == "initialize":
            if MODE == "no_init":
                continue
            version = REVISION or params.get("protocolVersion", "2025-11-25")
            send(
                {
                    "jsonrpc": "2.0",
                    "id": rid,
                    "result": {
                        "protocolVersion": version,
                        "capabilities": {"tools": {"listChanged": True}},
                        "serverInfo": {"name": "raw-child", "version": "1"},
                    },
                }
            )
        elif method == "notifications/initialized":
            initialized = True
        elif method == "tools/list" and MODE == "garbage_flood":
            send({"jsonrpc": "2.0", "id": rid, "result": {"tools": TOOLS}})
            threading.Thread(target=garbage_flood, daemon=True).start()
        elif method == "tools/list" and MODE == "ping_flood":
            send({"jsonrpc": "2.0", "id": rid, "result": {"tools": TOOLS}})
            ping_flood()  # never returns: stdin is not read again
        elif method == "notifications/cancelled":
            _cancelled.add(params.get("requestId"))
            log_call("cancelled", params.get("requestId"), str(params.get("reason", "")))
        elif method == "ping":
            if MODE not in ("no_ping", "garbage_flood"):
                send({"jsonrpc": "2.0", "id": rid, "result": {}})
        elif method == "tools/list":
            send({"jsonrpc": "2.0", "id": rid, "result": {"tools": TOOLS + _extra_tools}})
        elif method == "tools/call":
            name, args = str(params.get("name") or ""), params.get("arguments") or {}
            if MODE == "noisy":
                sys.stdout.write("noise on stdout\n")
            if MODE == "garbage":
                garbage()
            if name == "meta":
                meta = params.get("_meta")
                send(
                    {
                        "jsonrpc": "2.0",
                        "id": rid,
                        "result": text_result(json.dumps(meta), {"_meta": meta, "arguments": args}),
                    }
                )
            elif name == "confirm":
                threading.Thread(target=confirm, args=(rid, args, params.get("_meta")), daemon=True).start()
            elif name in ("sleep", "trickle", "hold", "progress") and not os.environ.get("RAW_SINGLE"):
                threading.Thread(target=call, args=(rid, name, args, params.get("_meta")), daemon=True).start()
            else:
                call(rid, name, args)
        elif rid is not None:
            send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": f"no method {method}"}})
    del initialized
    # RAW_EXIT_DELAY: a child that takes its time to exit once its stdin closes.
    time.sleep(float(os.environ.get("RAW_EXIT_DELAY", "0")))
    if MODE == "ignore_term":
        while True:  # stdin closed and SIGTERM ignored: only SIGKILL ends it
            time.sleep(1)


if __name__ == "__main__":
    main()
