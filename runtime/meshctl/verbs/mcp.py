"""`meshctl mcp`: the mesh as one MCP server (runtime/meshctl/face/; docs/mcp.md). The face and the
`mcp` package load only when this verb runs."""

from __future__ import annotations

import argparse


def add_parsers(verbs: argparse._SubParsersAction, bus: argparse.ArgumentParser) -> None:
    mcp = verbs.add_parser(
        "mcp", help="the mesh as one MCP server: every tool on the bus (stdio, or --http)", parents=[bus]
    )
    mcp.add_argument("--http", metavar="HOST:PORT", help="serve Streamable HTTP at http://HOST:PORT/mcp, not stdio")
    mcp.add_argument(
        "--allow-origin", action="append", default=[], metavar="URL", help="a web origin allowed besides loopback"
    )
    mcp.add_argument(
        "--auth-issuer",
        metavar="URL",
        help="with --http: take only bearer tokens this OAuth issuer vouches for; the person in each goes with its calls",
    )
    mcp.add_argument("--auth-audience", metavar="URL", help="the audience tokens must name (default: the face's URL)")
    mcp.add_argument(
        "--auth-resource",
        metavar="URL",
        help="the face's URL as clients reach it (behind a TLS proxy); default http://HOST:PORT/mcp",
    )
    mcp.add_argument(
        "--auth-scope", action="append", default=[], metavar="SCOPE", help="a scope every token must carry"
    )
    mcp.add_argument(
        "--allow-unauthenticated",
        action="store_true",
        help="with --http on a non-loopback address and no --auth-issuer: serve anyway (said as a WARNING)",
    )
    mcp.add_argument("--only", action="append", default=[], metavar="PATTERN", help="show only matching tools")
    mcp.add_argument("--except", dest="exclude", action="append", default=[], metavar="PATTERN", help="hide these")
    mcp.add_argument("--max-tools", type=int, help="show at most this many tools (by name)")
    mcp.add_argument(
        "--config",
        metavar="FILE",
        help="a TOML file of [profiles.<name>] (only, except, max_tools), [auth] and [http] (docs/mcp.md)",
    )
    mcp.add_argument("--profile", help="the profile of --config to use")
    mcp.add_argument("--page-size", type=int, default=100, help="tools per tools/list page (default 100)")
    mcp.add_argument("--list", action="store_true", help="print what a client would see, and exit")
    mcp.add_argument("--json", action="store_true", help="with --list: the tools as JSON")
    mcp.add_argument(
        "--delegate",
        action="store_true",
        help="the bus credentials given are a delegate's ([identity] delegates on the nodes): pass the person "
        "behind each call (over stdio the OS user running the face); the embedded bus's face user is one by itself",
    )
    mcp.add_argument(
        "--workers",
        type=int,
        default=1,
        help="with --http: this many face processes on the port (SO_REUSEPORT); 2025-11-25 sessions stay on the first",
    )
    mcp.add_argument(
        "--state-key",
        metavar="FILE",
        help="the key sealing 2026-07-28 requestState (32 bytes hex, made 0600 if missing): a client's answer to a "
        "tool's ask outlives a restart of the face (default: one key per start, shared by its workers)",
    )
    mcp.add_argument("--worker", type=int, default=0, help=argparse.SUPPRESS)  # set by the first worker for the others
    mcp.add_argument("--sessions-socket", help=argparse.SUPPRESS)
    mcp.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    mcp.set_defaults(func=cmd_mcp)


def cmd_mcp(args: argparse.Namespace) -> int:
    from runtime.meshctl.face.main import run_mcp

    return run_mcp(args)
