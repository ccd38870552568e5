"""The face's hot path: `tools/call` and `tools/list` parsed and answered here, everything else the
`mcp` package's.

`decide` is the one place that says which way a message goes, for every transport (HTTP of both
eras, stdio): a message is taken only when it is exactly a shape this path answers the way the
package would, and everything else (another method, a batch, JSON that is not JSON-RPC, a
progress token, a task, an unknown tool, the face off the bus, an envelope the package must judge)
goes to the package, which answers it, errors included. So the protocol stays the package's:

- a `tools/call` is one bus call through the face's own `MeshClient` (same identity, deadline and
  cancel as the package's way); the child's result bytes go to the client as they came, after a
  msgspec check that they are a plain CallToolResult (text content, `isError`, `structuredContent`,
  `_meta`) and, for a tool with an `outputSchema`, that its `structuredContent` passes the compiled
  schema (`Face.checked_result`, shared with the package's way). A result of any other shape, and
  every runtime error, is shaped by the package's own serializer for the connection's revision
  (`ServerRunner._serialize`, looked up once: without it the hot path is off).
- a `tools/list` page is the face's own page (`Face.list_page`) serialized by the package once per
  catalog, revision and cursor, then kept as bytes until the catalog changes.

Where other issues plug in: a per-request auth check (a verified bearer token, cached) belongs in
the transport before `decide` (runtime/meshctl/face/http_front.py `FaceFront.__call__`); a
`_meta.traceparent` pass-through belongs in `HotPath.call`, the one place a hot call meets the bus.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Container
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import msgspec
from mcp_types import CLIENT_CAPABILITIES_META_KEY, INTERNAL_ERROR, PROTOCOL_VERSION_META_KEY
from mcp_types import methods as spec_methods
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from runtime.client import CallError
from runtime.meshctl.face.catalog import FaceTool
from runtime.meshctl.face.task_extension import declares_tasks, task_capable
from runtime.wire.identity import Person

if TYPE_CHECKING:
    from runtime.meshctl.face.server import Face

log = logging.getLogger("mesh.face")

META_VERDICTS_KEPT = 256  # distinct `_meta` objects whose verdict is remembered (a client sends one over and over)
LIST_PAGES_KEPT = 64  # serialized tools/list pages kept per catalog
SERVER_INFO_META_KEY = "io.modelcontextprotocol/serverInfo"


# --- the wire: just enough of a JSON-RPC message to route it --------------------------------
class _Message(msgspec.Struct, forbid_unknown_fields=True):
    jsonrpc: str
    method: str
    id: int | str | None = None
    params: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET


class _CallParams(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    arguments: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    meta: msgspec.Raw | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="_meta")


class _ListParams(msgspec.Struct, forbid_unknown_fields=True):
    cursor: str | None = None
    meta: msgspec.Raw | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="_meta")


class _CancelParams(msgspec.Struct):
    requestId: int | str  # noqa: N815 (the wire's name)


class _TextBlock(msgspec.Struct, forbid_unknown_fields=True):
    type: Literal["text"]
    text: str


class _PlainResult(msgspec.Struct, forbid_unknown_fields=True):
    """A CallToolResult the hot path passes on as bytes; anything else is the package's to shape."""

    content: list[_TextBlock]
    isError: bool | msgspec.UnsetType = msgspec.UNSET  # noqa: N815
    structuredContent: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET  # noqa: N815
    meta: msgspec.Raw | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="_meta")


_decode_message = msgspec.json.Decoder(_Message).decode
_decode_call = msgspec.json.Decoder(_CallParams).decode
_decode_list = msgspec.json.Decoder(_ListParams).decode
_decode_cancel = msgspec.json.Decoder(_CancelParams).decode
_decode_plain = msgspec.json.Decoder(_PlainResult).decode
_decode_any = msgspec.json.Decoder().decode
encode = msgspec.json.Encoder().encode


# --- what was decided ---------------------------------------------------------------------
@dataclass(slots=True)
class HotCall:
    id: int | str
    tool: FaceTool
    arguments: bytes  # a JSON object, as the client sent it
    version: str  # the connection's protocol revision
    traceparent: str | None = None  # the client's W3C trace context (`_meta`), sent on as NATS headers
    tracestate: str | None = None


@dataclass(slots=True)
class HotList:
    id: int | str
    cursor: str | None
    version: str


@dataclass(slots=True)
class HotCancel:
    """A 2025-11-25 `notifications/cancelled` for a call the hot path is running."""

    request_id: int | str


Decision = HotCall | HotList | HotCancel | None  # None: the mcp package's


@dataclass(slots=True)
class Era:
    """What the transport knows of the connection a message came on.

    `version`: the revision negotiated by the session's `initialize` (2025-11-25 and older), or
    the modern revision the request's headers name; None while nothing is known (the package's).
    `headers`: the modern era's routing headers over HTTP (mcp-protocol-version, mcp-method,
    mcp-name), lower-cased; None on stdio. `running`: request ids of this connection's hot calls.
    """

    version: str | None
    headers: dict[str, str] | None = None
    running: Container[int | str] = frozenset()


class HotPath:
    """The decisions and answers of the hot path for one face."""

    def __init__(self, face: Face) -> None:
        self.face = face
        self.serialize = _package_serializer(face)
        self.enabled = self.serialize is not None
        self._meta_verdicts: OrderedDict[tuple[str, str, bytes], bool] = OrderedDict()
        self._pages: dict[tuple[str, str | None], bytes] = {}
        self._pages_of: object = None  # the catalog list the pages were made from
        self._param_headers: dict[int, bool] = {}  # id(definition) -> its schema names Mcp-Param headers

    # --- deciding -------------------------------------------------------------------------
    def decide(self, body: bytes, era: Era) -> Decision:
        """A hot request, or None when the message is the package's (which then answers it, errors included)."""
        if not self.enabled or era.version is None:
            return None
        try:
            message = _decode_message(body)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None  # not one JSON-RPC object of the shape taken here: batch, response, bad JSON
        if message.jsonrpc != "2.0":
            return None
        modern = era.version in MODERN_PROTOCOL_VERSIONS
        if message.id is None:
            return self._cancel(message, era)  # only for a hot call of this connection (`era.running`)
        if message.params is msgspec.UNSET:
            return HotList(message.id, None, era.version) if message.method == "tools/list" and not modern else None
        if message.method == "tools/call":
            return self._call(message.id, message.params, era, modern)
        if message.method == "tools/list":
            return self._list(message.id, message.params, era, modern)
        return None

    def _call(self, request_id: int | str, raw: msgspec.Raw, era: Era, modern: bool) -> HotCall | None:
        try:
            params = _decode_call(raw)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None  # a task-augmented call, a field the package must judge
        arguments = bytes(params.arguments) if params.arguments is not msgspec.UNSET else b"{}"
        if arguments == b"null":
            arguments = b"{}"
        elif not arguments.startswith(b"{"):
            return None  # not an object: the package's INVALID_PARAMS
        assert era.version is not None
        meta, traceparent, tracestate = _without_trace(params.meta)
        if not self._meta_ok("tools/call", params.name, meta, era, modern):
            return None
        tool = self.face.catalog.by_name.get(params.name)
        if tool is None or not self.face.nc.is_connected:
            return None  # the package's way says which tools there are, or that the bus is away
        if modern and self._names_param_headers(tool):
            return None  # Mcp-Param headers are checked against the schema by the package
        if modern and meta is not msgspec.UNSET and task_capable(tool) and declares_tasks(bytes(meta)):
            return None  # it may be a task (face/task_extension.py decides)
        return HotCall(request_id, tool, arguments, era.version, traceparent, tracestate)

    def _list(self, request_id: int | str, raw: msgspec.Raw, era: Era, modern: bool) -> HotList | None:
        try:
            params = _decode_list(raw)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None
        if not self._meta_ok("tools/list", None, params.meta, era, modern):
            return None
        assert era.version is not None
        return HotList(request_id, params.cursor, era.version)

    def _cancel(self, message: _Message, era: Era) -> HotCancel | None:
        if message.method != "notifications/cancelled" or message.params is msgspec.UNSET or not era.running:
            return None
        try:
            request_id = _decode_cancel(message.params).requestId
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None
        return HotCancel(request_id) if request_id in era.running else None

    def _meta_ok(
        self, method: str, name: str | None, raw: msgspec.Raw | bytes | msgspec.UnsetType, era: Era, modern: bool
    ) -> bool:
        """The request's `_meta` is one the package accepts, asks for no progress, and (modern) matches
        the routing headers. The package's own validator judges it once per distinct `_meta`."""
        assert era.version is not None
        if raw is msgspec.UNSET:
            return not modern  # the modern era's envelope lives in _meta
        meta_bytes = bytes(raw)
        key = (era.version, method, meta_bytes)
        verdict = self._meta_verdicts.get(key)
        if verdict is None:
            verdict = self._judge_meta(method, meta_bytes, era.version, modern)
            self._meta_verdicts[key] = verdict
            if len(self._meta_verdicts) > META_VERDICTS_KEPT:
                self._meta_verdicts.popitem(last=False)
        if not verdict:
            return False
        if modern:
            return _headers_match(method, name, era)
        return True

    def _judge_meta(self, method: str, meta_bytes: bytes, version: str, modern: bool) -> bool:
        try:
            meta = _decode_any(meta_bytes)
        except msgspec.DecodeError:
            return False
        if not isinstance(meta, dict) or "progressToken" in meta:
            return False  # a progress call streams: the package's way
        if modern:
            if meta.get(PROTOCOL_VERSION_META_KEY) != version or CLIENT_CAPABILITIES_META_KEY not in meta:
                return False
            caps = meta.get(CLIENT_CAPABILITIES_META_KEY)
            if isinstance(caps, dict) and any(k in caps for k in ("elicitation", "sampling", "roots")):
                return False  # a client that answers a tool's asks: the package's way (face/asking.py)
        elif any(isinstance(k, str) and k.startswith("io.modelcontextprotocol/") for k in meta):
            return False  # a reserved key of the legacy era (a related task, ...): the package's
        probe: dict[str, Any] = {"_meta": meta}
        if method == "tools/call":
            probe.update(name="probe", arguments={})
        try:
            spec_methods.validate_client_request(method, version, probe)
        except (ValidationError, KeyError):
            return False
        return True

    def _names_param_headers(self, tool: FaceTool) -> bool:
        key = id(tool.definition)
        found = self._param_headers.get(key)
        if found is None:
            found = b"x-mcp-header" in encode(tool.definition.get("inputSchema"))
            if len(self._param_headers) > 4 * len(self.face.catalog.tools) + 64:
                self._param_headers.clear()
            self._param_headers[key] = found
        return found

    # --- answering ------------------------------------------------------------------------
    async def call(self, hot: HotCall, person: Person | None = None) -> bytes:
        """The JSON-RPC response to a hot `tools/call`, as bytes (the one place it meets the bus);
        `person`: the request's (an HTTP token's), else the face's own."""
        face = self.face
        try:
            data = await face.client.call(
                hot.tool.subject,
                hot.arguments,
                timeout_s=face.call_timeout_s,
                on_progress=_no_progress,
                cancel_reason=face.cancel_reason,
                person=person if person is not None else face.person,
                traceparent=hot.traceparent,
                tracestate=hot.tracestate,
            )
        except CallError as e:
            return self._response(hot.id, self._shaped("tools/call", hot.version, face.error_result(e)))
        except Exception as e:  # the bus connection closed under the call, a full buffer: the package's answer to a handler that raised
            log.warning("%s: the call failed: %s: %s", hot.tool.subject, type(e).__name__, e)
            return self._response(hot.id, _Refusal(INTERNAL_ERROR, f"the bus call failed: {type(e).__name__}"))
        passed = self._passed_on(hot, data)
        if passed is not None:
            return self._response(hot.id, passed)
        return self._response(hot.id, self._shaped("tools/call", hot.version, face.checked_result(hot.tool, data)))

    def _passed_on(self, hot: HotCall, data: bytes) -> bytes | None:
        """The child's bytes with what the package would add, when they are a plain result; else None."""
        try:
            plain = _decode_plain(data)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None
        structured, meta = plain.structuredContent, plain.meta
        if structured is not msgspec.UNSET and (
            not bytes(structured).startswith(b"{") or hot.tool.definition.get("outputSchema") is not None
        ):
            return None  # not an object (the package's error), or checked against the outputSchema by `checked_result`
        if meta is not msgspec.UNSET and not bytes(meta).startswith(b"{"):
            return None
        head = b"{"
        if plain.isError is msgspec.UNSET:
            head += b'"isError":false,'
        if hot.version in MODERN_PROTOCOL_VERSIONS:
            if meta is not msgspec.UNSET:
                return None  # the serverInfo stamp goes into the tool's own _meta: the package's serializer
            head += b'"resultType":"complete","_meta":' + self._stamp() + b","
        start = data.find(b"{")
        return head + data[start + 1 :]

    def _stamp(self) -> bytes:
        return encode({SERVER_INFO_META_KEY: self.face.server.server_info_stamp})

    def _shaped(self, method: str, version: str, result: Any) -> bytes | _Refusal:
        assert self.serialize is not None
        try:
            return encode(self.serialize(method, version, result))
        except Exception as e:  # the package's INTERNAL_ERROR for a result it will not put on the wire
            log.warning("%s result not served: %s", method, e)
            return _Refusal(INTERNAL_ERROR, "Handler returned an invalid result")

    def list_page(self, hot: HotList) -> bytes:
        tools = self.face.catalog.tools
        if tools is not self._pages_of:
            self._pages, self._pages_of = {}, tools
        key = (hot.version, hot.cursor)
        page = self._pages.get(key)
        if page is None:
            shaped = self._shaped("tools/list", hot.version, self.face.list_page(hot.cursor))
            if isinstance(shaped, _Refusal):
                return self._response(hot.id, shaped)
            page = shaped
            if len(self._pages) >= LIST_PAGES_KEPT:
                self._pages.clear()
            self._pages[key] = page
        return self._response(hot.id, page)

    @staticmethod
    def _response(request_id: int | str, result: bytes | _Refusal) -> bytes:
        if isinstance(result, _Refusal):
            error = {"code": result.code, "message": result.message}
            return encode({"jsonrpc": "2.0", "id": request_id, "error": error})
        return b'{"jsonrpc":"2.0","id":' + encode(request_id) + b',"result":' + result + b"}"


@dataclass(frozen=True, slots=True)
class _Refusal:
    code: int
    message: str


def cancelled_response(request_id: int | str) -> bytes:
    """What the 2025-11-25 transport answers a request cancelled by the client (REQUEST_CANCELLED)."""
    return encode({"jsonrpc": "2.0", "id": request_id, "error": {"code": -32800, "message": "Request cancelled"}})


def _headers_match(method: str, name: str | None, era: Era) -> bool:
    headers = era.headers
    if headers is None:
        return True  # stdio: the envelope is all there is
    if headers.get("mcp-protocol-version") != era.version or headers.get("mcp-method") != method:
        return False
    if name is not None:
        from mcp.shared.inbound import decode_header_value

        return decode_header_value(headers.get("mcp-name")) == name
    return True


def _no_progress(frame: Any) -> None:
    """Progress of a call whose client asked for none: dropped (the node's keepalives still count)."""


def _package_serializer(face: Face) -> Any:
    """The package's result serializer (`ServerRunner._serialize`), or None on a release without it."""
    try:
        from mcp.server.connection import Connection
        from mcp.server.runner import ServerRunner

        runner = ServerRunner(
            face.server, Connection.from_envelope(sorted(MODERN_PROTOCOL_VERSIONS)[-1], None, None), None
        )
        serialize = runner._serialize
        serialize("tools/list", HANDSHAKE_PROTOCOL_VERSIONS[-1], {"tools": []})
    except Exception as e:  # a release of mcp without these: every request goes the package's way
        log.warning("the face's hot path is off (this mcp release has no ServerRunner._serialize): %s", e)
        return None
    return serialize


_TRACE_KEYS = (b'"traceparent"', b'"tracestate"')


def _without_trace(
    raw: msgspec.Raw | msgspec.UnsetType,
) -> tuple[msgspec.Raw | bytes | msgspec.UnsetType, str | None, str | None]:
    """A call's `_meta` without its trace context, and that context: a client's traceparent differs on
    every call, and the verdict on the rest of its `_meta` is kept per distinct bytes (`_meta_ok`)."""
    if raw is msgspec.UNSET or not any(key in bytes(raw) for key in _TRACE_KEYS):
        return raw, None, None
    try:
        meta = _decode_any(bytes(raw))
    except msgspec.DecodeError:
        return raw, None, None
    if not isinstance(meta, dict):
        return raw, None, None
    traceparent, tracestate = meta.pop("traceparent", None), meta.pop("tracestate", None)
    return (
        encode(meta),
        traceparent if isinstance(traceparent, str) else None,
        tracestate if isinstance(tracestate, str) else None,
    )
