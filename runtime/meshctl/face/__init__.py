"""The mesh as one MCP server (`meshctl mcp`): every tool on the bus, for any MCP client."""
