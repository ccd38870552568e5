"""`meshctl console`: one web page for the people of the mesh (runtime/meshctl/console/; docs/console.md).
The console's web stack loads only when this verb runs."""

from __future__ import annotations

import argparse

from runtime.meshctl.verbs.shared import seconds


def add_parsers(verbs: argparse._SubParsersAction, bus: argparse.ArgumentParser) -> None:
    p = verbs.add_parser(
        "console",
        help="a web page for people: the mesh, the memory, the handoff desk and what waits for a human",
        parents=[bus],
    )
    p.add_argument(
        "--http",
        metavar="HOST:PORT",
        default="127.0.0.1:8780",
        help="where to listen (default 127.0.0.1:8780; a host that is not loopback needs --auth-issuer)",
    )
    p.add_argument("--auth-issuer", metavar="URL", help="log people in with OpenID Connect at this issuer")
    p.add_argument("--auth-client-id", metavar="ID", help="the console's client id at the issuer")
    p.add_argument(
        "--auth-client-secret-file", metavar="FILE", help="a file holding the client's secret (none: a public client)"
    )
    p.add_argument(
        "--public-url",
        metavar="URL",
        help="the URL people open (default http://HOST:PORT); its https:// makes the cookie Secure",
    )
    p.add_argument("--session-s", type=seconds, default=8 * 3600.0, help="how long a login lasts (default 8 h)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.set_defaults(func=cmd_console)


def cmd_console(args: argparse.Namespace) -> int:
    from runtime.meshctl.console.main import run_console

    return run_console(args)
