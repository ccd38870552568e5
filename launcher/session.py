"""The MCP session over one child's stdio: JSON-RPC ids, futures, timeouts, notifications.

Many calls are in flight on one pipe at once; each waits on a future keyed by its id. The hot
path avoids decoding what it only forwards: a call's arguments go to the child as the bytes the
caller sent, and the child's result comes back as `msgspec.Raw`.
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any, Callable

import msgspec

from .errors import CallTimedOut, ChildError, ProtocolError, SessionClosed
from .logbudget import LogBudget

# Revisions reachable through the `initialize` handshake, oldest first.
PROTOCOL_VERSIONS: tuple[str, ...] = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
LATEST_PROTOCOL_VERSION = PROTOCOL_VERSIONS[-1]
# Stateless revisions: no handshake; `server/discover`, and the client's version and
# capabilities in every request's `_meta` (the envelope).
STATELESS_VERSIONS: tuple[str, ...] = ("2026-07-28",)
ERA_HANDSHAKE, ERA_STATELESS = "handshake", "stateless"
META_PROTOCOL_VERSION = "io.modelcontextprotocol/protocolVersion"
META_CLIENT_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"
META_CLIENT_INFO = "io.modelcontextprotocol/clientInfo"
META_SERVER_INFO = "io.modelcontextprotocol/serverInfo"

CLIENT_INFO = {"name": "mesh-node", "version": "0.1.0"}

log = logging.getLogger("mesh.session")
_ID_RE = re.compile(rb'"id"\s*:\s*(\d+)')


class RpcError(msgspec.Struct):
    code: int = 0
    message: str = ""
    data: Any = None


class Incoming(msgspec.Struct):
    """Any line a child may write: a response, a request of its own, or a notification."""

    id: int | str | None = None
    method: str | None = None
    result: msgspec.Raw = msgspec.Raw(b"")
    error: RpcError | None = None
    params: msgspec.Raw = msgspec.Raw(b"")


class Call:
    """A request on its way: its id, the future its answer resolves, its timeout."""

    __slots__ = ("rid", "fut", "timer")

    def __init__(self, rid: int, fut: asyncio.Future[msgspec.Raw], timer: asyncio.TimerHandle) -> None:
        self.rid, self.fut, self.timer = rid, fut, timer


class Tool(msgspec.Struct):
    name: str
    description: str = ""
    inputSchema: dict[str, Any] = {}
    outputSchema: dict[str, Any] | None = None
    annotations: dict[str, Any] | None = None
    execution: dict[str, Any] | None = None  # {"taskSupport": ...}: passed through to MCP faces as declared


class _ToolsPage(msgspec.Struct):
    tools: list[Tool]
    nextCursor: str | None = None


class _InitializeResult(msgspec.Struct):
    protocolVersion: str
    capabilities: dict[str, Any] = {}
    serverInfo: dict[str, Any] = {}
    instructions: str | None = None


class _DiscoverResult(msgspec.Struct):
    supportedVersions: list[str]
    capabilities: dict[str, Any] = {}
    instructions: str | None = None
    meta: dict[str, Any] = msgspec.field(default_factory=dict, name="_meta")


def envelope(version: str) -> dict[str, Any]:
    """The `_meta` members a stateless-era client puts in every request."""
    return {
        META_PROTOCOL_VERSION: version,
        META_CLIENT_CAPABILITIES: CLIENT_CAPABILITIES,
        META_CLIENT_INFO: CLIENT_INFO,
    }


_decode_incoming = msgspec.json.Decoder(Incoming).decode
_encode = msgspec.json.Encoder().encode
_format = msgspec.json.format

_TOOLS_CALL = b'"method":"tools/call"'


def tool_call_params(tool: bytes, arguments: bytes, meta: bytes = b"") -> bytes:
    """The `params` member of a `tools/call` request, as bytes: `tool` JSON-encoded, `arguments` as sent,
    `meta` the JSON object for `params._meta` (empty: none)."""
    if b"\n" in arguments or b"\r" in arguments:
        arguments = _format(arguments, indent=0)  # one message, one line
    if meta:
        return b',"params":{"name":' + tool + b',"arguments":' + arguments + b',"_meta":' + meta + b"}"
    return b',"params":{"name":' + tool + b',"arguments":' + arguments + b"}"


Write = Callable[[bytes], None]
NotificationHandler = Callable[[str, msgspec.Raw], None]
# A child's own request the owner may answer (elicitation, sampling, roots: the node asks the call's
# caller): (session, request id, method, params) -> True when it took it and will `respond` later.
RequestHandler = Callable[["Session", "int | str", str, msgspec.Raw], bool]
# What the node offers a child in its handshake: it passes these requests to the callers that answer.
CLIENT_CAPABILITIES: dict[str, Any] = {"elicitation": {"form": {}, "url": {}}, "sampling": {}, "roots": {}}


def _not_attached(data: bytes) -> None:
    raise BrokenPipeError("the session has no child yet")


class Session:
    """JSON-RPC client side of one MCP connection. Knows lines, not processes."""

    def __init__(
        self, name: str, on_notification: NotificationHandler | None = None, on_request: RequestHandler | None = None
    ) -> None:
        self._write: Write = _not_attached
        self._on_request = on_request
        self.name = name
        self._next_id = 0
        self._pending: dict[int, asyncio.Future[msgspec.Raw]] = {}
        self._on_notification = on_notification
        self._closed: Exception | None = None
        self._loop = asyncio.get_running_loop()
        self.protocol_version: str | None = None
        self.era: str | None = None  # ERA_HANDSHAKE or ERA_STATELESS once open
        self._envelope: dict[str, Any] = {}  # stateless era: put into every request's _meta
        self._envelope_json = b""
        self.server_info: dict[str, Any] = {}
        self.capabilities: dict[str, Any] = {}
        self.last_seen = self._loop.time()  # the last JSON-RPC message: garbage is no sign of life
        self.skipped_lines = 0
        self._garbage_budget = LogBudget(name, "lines on stdout that are not JSON-RPC", rate=20)

    def attach(self, write: Write) -> None:
        """Give the session its way to the child, once the child runs."""
        self._write = write

    # --- incoming -------------------------------------------------------------------------
    def feed(self, line: bytes) -> None:
        """One line from the child's stdout."""
        if not line.strip():
            return
        try:
            msg = _decode_incoming(line)
        except (msgspec.DecodeError, msgspec.ValidationError):
            self.skipped_lines += 1
            if self._garbage_budget.take():
                shown = line[:200].decode("utf-8", "replace")
                log.warning("%s: skipped a line on stdout that is not JSON-RPC: %r", self.name, shown)
            self._fail_unreadable_answer(line)
            return
        self.last_seen = self._loop.time()
        if msg.method is None:
            fut = self._pending.pop(msg.id, None) if isinstance(msg.id, int) else None
            if fut is None:
                return  # a late answer to a call that timed out or was cancelled
            if fut.done():
                return
            if msg.error is not None:
                fut.set_exception(ChildError(msg.error.code, msg.error.message, msg.error.data))
            else:
                fut.set_result(msg.result)
        elif msg.id is None:
            if self._on_notification is not None:
                self._on_notification(msg.method, msg.params)
        else:
            self._answer_child_request(msg)

    def _fail_unreadable_answer(self, line: bytes) -> None:
        # An answer that cannot be decoded but names its id fails that call now, not at its timeout.
        found = _ID_RE.search(line[:4096])
        fut = self._pending.pop(int(found.group(1)), None) if found else None
        if fut is not None and not fut.done():
            fut.set_exception(
                ChildError(-32603, "the bundle's answer to this call is not valid JSON-RPC (see the node's log)")
            )

    def _answer_child_request(self, msg: Incoming) -> None:
        # A child may ping us, or ask its caller (handed to the owner), or ask what nobody offers.
        assert msg.method is not None and msg.id is not None
        if msg.method == "ping":
            answer: dict[str, Any] = {"jsonrpc": "2.0", "id": msg.id, "result": {}}
        elif self._on_request is not None and self._on_request(self, msg.id, msg.method, msg.params):
            return
        else:
            error = {"code": -32601, "message": f"the mesh node does not offer {msg.method}"}
            answer = {"jsonrpc": "2.0", "id": msg.id, "error": error}
        try:
            self._send(answer)
        except SessionClosed:
            pass  # the child asked and left: nobody to answer

    def respond(self, rid: int | str, result: bytes | None = None, error: tuple[int, str] | None = None) -> None:
        """Answer a child's own request: `result` a JSON object as bytes, or `error` (code, message)."""
        try:
            if error is not None:
                self._send({"jsonrpc": "2.0", "id": rid, "error": {"code": error[0], "message": error[1]}})
            else:
                self._write(b'{"jsonrpc":"2.0","id":%s,"result":%s}\n' % (_encode(rid), result or b"{}"))
        except (SessionClosed, BrokenPipeError, ConnectionError, RuntimeError):
            pass  # the child asked and left: nobody to answer

    def close(self, error: Exception) -> None:
        """Fail every call in flight at once: the child is gone, nobody waits for a timeout."""
        self._closed = error
        pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(error)

    # --- outgoing -------------------------------------------------------------------------
    def _send(self, message: dict[str, Any]) -> None:
        try:
            self._write(_encode(message) + b"\n")
        except (BrokenPipeError, ConnectionError, RuntimeError) as e:
            # The child went away between two lines: the same error as a request's write.
            raise SessionClosed(self.name, f"cannot write to the child: {e}") from e

    def notify(self, method: str, params: dict[str, Any] | None = None) -> None:
        msg: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            msg["params"] = params
        self._send(msg)

    def _start(self, head: bytes, tail: bytes) -> tuple[int, asyncio.Future[msgspec.Raw]]:
        if self._closed is not None:
            raise self._closed
        self._next_id += 1
        rid = self._next_id
        fut = self._loop.create_future()
        self._pending[rid] = fut
        try:
            self._write(b'{"jsonrpc":"2.0","id":%d,%s%s}\n' % (rid, head, tail))
        except (BrokenPipeError, ConnectionError, RuntimeError) as e:
            del self._pending[rid]
            raise SessionClosed(self.name, f"cannot write to the child: {e}") from e
        return rid, fut

    def _arm(self, rid: int, fut: asyncio.Future[msgspec.Raw], deadline: float, what: str, timeout_ms: int) -> Call:
        return Call(rid, fut, self._loop.call_at(deadline, self._expire, rid, fut, what, timeout_ms))

    async def result(self, call: Call) -> msgspec.Raw:
        """The answer to a call begun with `begin_tool_call`."""
        try:
            return await call.fut
        except asyncio.CancelledError as e:
            # The caller went away (node stopping, request abandoned, cancelled): tell the child too.
            if self._pending.pop(call.rid, None) is not None:
                reason = e.args[0] if e.args and isinstance(e.args[0], str) else "the caller cancelled the call"
                self._cancel_in_child(call.rid, reason)
            raise
        finally:
            call.timer.cancel()

    def _expire(self, rid: int, fut: asyncio.Future[msgspec.Raw], what: str, timeout_ms: int) -> None:
        if self._pending.pop(rid, None) is None or fut.done():
            return
        self._cancel_in_child(rid, f"timed out after {timeout_ms} ms")
        fut.set_exception(CallTimedOut(self.name, what, timeout_ms))

    def _cancel_in_child(self, rid: int, reason: str) -> None:
        try:
            self.notify("notifications/cancelled", {"requestId": rid, "reason": reason})
        except SessionClosed:
            pass

    async def request(self, method: str, params: dict[str, Any] | None, timeout: float) -> msgspec.Raw:
        if self._envelope:
            params = dict(params or {})
            params["_meta"] = {**self._envelope, **(params.get("_meta") or {})}
        head = b'"method":' + _encode(method)
        tail = b',"params":' + _encode(params) if params is not None else b""
        rid, fut = self._start(head, tail)
        return await self.result(self._arm(rid, fut, self._loop.time() + timeout, method, int(timeout * 1000)))

    def begin_tool_call(
        self, tool: bytes, arguments: bytes, deadline: float, timeout_ms: int, meta: bytes = b""
    ) -> Call:
        """Write a `tools/call` now; `tool` is the JSON-encoded name, `arguments` a JSON object as sent,
        `meta` the JSON object for `params._meta` (empty: none).

        Not a coroutine: the request is on its way to the child before the caller's task is
        even scheduled, which is one turn of the event loop saved on every call. The call times
        out at `deadline` (loop clock); `timeout_ms` is the timeout its error names.
        """
        if self._envelope_json:  # the stateless era: the envelope joins whatever _meta the node sends
            inner = meta.strip()[1:-1].strip() if meta else b""
            meta = self._envelope_json[:-1] + b"," + inner + b"}" if inner else self._envelope_json
        rid, fut = self._start(_TOOLS_CALL, tool_call_params(tool, arguments, meta))
        return self._arm(rid, fut, deadline, tool.decode(), timeout_ms)

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    # --- the handshake and the listing --------------------------------------------------
    async def open(self, timeout: float) -> None:
        """Find the child's protocol era: the `initialize` handshake, else `server/discover`.

        A child of the stateless revision has no `initialize` and answers it with an error
        (method not found, or unsupported version naming its own); one that speaks both eras
        is served in the handshake era, which every revision up to 2025-11-25 shares.
        """
        try:
            await self.initialize(timeout)
            return
        except ChildError as refused:
            handshake_error = refused
        try:
            await self.discover(timeout)
        except ChildError as e:
            raise ProtocolError(
                self.name,
                f"it refused both eras: initialize ({handshake_error.message}) and server/discover ({e.message}); "
                f"the node speaks {', '.join(PROTOCOL_VERSIONS + STATELESS_VERSIONS)}",
            ) from e

    async def discover(self, timeout: float) -> None:
        version = STATELESS_VERSIONS[-1]
        raw = await self.request("server/discover", {"_meta": envelope(version)}, timeout)
        try:
            result = msgspec.json.decode(raw, type=_DiscoverResult)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            raise ProtocolError(self.name, f"its server/discover result is not a DiscoverResult: {e}") from e
        mutual = [v for v in STATELESS_VERSIONS if v in result.supportedVersions]
        if not mutual:
            raise ProtocolError(
                self.name,
                f"it speaks MCP revisions {', '.join(result.supportedVersions[:8]) or 'none'}; "
                f"the node speaks {', '.join(PROTOCOL_VERSIONS + STATELESS_VERSIONS)}",
            )
        self.protocol_version, self.era = mutual[-1], ERA_STATELESS
        self._envelope = envelope(mutual[-1])
        self._envelope_json = _encode(self._envelope)
        self.capabilities = result.capabilities
        info = result.meta.get(META_SERVER_INFO)
        self.server_info = info if isinstance(info, dict) else {}

    async def initialize(self, timeout: float) -> None:
        raw = await self.request(
            "initialize",
            {
                "protocolVersion": LATEST_PROTOCOL_VERSION,
                "capabilities": CLIENT_CAPABILITIES,
                "clientInfo": CLIENT_INFO,
            },
            timeout,
        )
        try:
            result = msgspec.json.decode(raw, type=_InitializeResult)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            raise ProtocolError(self.name, f"its initialize result is not an MCP InitializeResult: {e}") from e
        if result.protocolVersion not in PROTOCOL_VERSIONS:
            raise ProtocolError(
                self.name,
                f"it speaks MCP revision {result.protocolVersion!r}; the node speaks {', '.join(PROTOCOL_VERSIONS)}",
            )
        self.protocol_version, self.era = result.protocolVersion, ERA_HANDSHAKE
        self.server_info = result.serverInfo
        self.capabilities = result.capabilities
        self.notify("notifications/initialized")

    async def list_tools(self, timeout: float) -> list[Tool]:
        tools: list[Tool] = []
        cursor: str | None = None
        for _ in range(1000):  # a child that pages for ever is broken, not patient
            raw = await self.request("tools/list", {"cursor": cursor} if cursor else {}, timeout)
            try:
                page = msgspec.json.decode(raw, type=_ToolsPage)
            except (msgspec.DecodeError, msgspec.ValidationError) as e:
                raise ProtocolError(self.name, f"its tools/list result is not a ListToolsResult: {e}") from e
            tools.extend(page.tools)
            cursor = page.nextCursor
            if not cursor:
                return tools
        raise ProtocolError(self.name, "tools/list paged more than 1000 times")

    async def ping(self, timeout: float) -> None:
        # The stateless era has no `ping`; `server/discover` is as cheap and answers the same question.
        await self.request("server/discover" if self.era == ERA_STATELESS else "ping", None, timeout)
