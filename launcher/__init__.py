"""One child: spawn, MCP stdio session, supervision, stderr capture, stop. Knows no NATS."""
