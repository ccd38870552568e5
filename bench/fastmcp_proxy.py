"""FastMCP's proxy (PyPI `fastmcp`, in bench/.envs/fastmcp) in front of one stdio MCP server,
over Streamable HTTP: `python fastmcp_proxy.py PORT COMMAND ARG...` (run by bench/face.py)."""

import sys

from fastmcp.client.transports import StdioTransport
from fastmcp.server import create_proxy

port, command, *args = sys.argv[1:]
# One backend session for every client (the usual single-user proxy), pinned to the handshake era.
proxy = create_proxy(StdioTransport(command=command, args=args, keep_alive=True), name="echo-proxy", mode="legacy")
proxy.run(transport="http", host="127.0.0.1", port=int(port), show_banner=False, log_level="WARNING")
