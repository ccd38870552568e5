"""mesh_sdk: the thin Python SDK for mesh tools bundles.

A tools bundle is a process that speaks MCP over stdio to the node's runtime (record 0188).
This package wraps the official `mcp` library for that one job and adds the few things a
module's code needs from the mesh: seat-verb tool names, the node's facts (MESH_*), the
caller of a call, cancellation and progress, and logging to stderr. It holds no transport
to the bus and no client of any module.
"""

from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult

from .asking import elicit, elicit_url
from .call import Caller, Person, caller, cancelled, parse_caller, progress
from .facts import Facts, FactsMissing, facts
from .log import logger, setup_logging
from .names import ToolNameError, check_tool_name, seat_verb
from .server import Server, result

__all__ = [
    "CallToolResult",
    "Caller",
    "Person",
    "Context",
    "Facts",
    "FactsMissing",
    "Server",
    "ToolError",
    "ToolNameError",
    "caller",
    "cancelled",
    "check_tool_name",
    "elicit",
    "elicit_url",
    "facts",
    "logger",
    "parse_caller",
    "progress",
    "result",
    "seat_verb",
    "setup_logging",
]
