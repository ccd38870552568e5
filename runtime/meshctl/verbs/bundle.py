"""`meshctl bundle build | deliver | remove`: artifacts made, put on the bus for a node, taken off it."""

from __future__ import annotations

import argparse
from pathlib import Path

import anyio

from runtime.config import NatsConfig
from runtime.meshctl.errors import MeshError
from runtime.meshctl.settings import client_config
from runtime.meshctl.verbs.shared import checked_node


def add_parsers(verbs: argparse._SubParsersAction, bus: argparse.ArgumentParser) -> None:
    bundle = verbs.add_parser("bundle", help="build bundles")
    bundle_verbs = bundle.add_subparsers(dest="bundle_verb", required=True)
    build = bundle_verbs.add_parser("build", help="build every bundle of a module into artifacts")
    build.add_argument("modules", nargs="+", metavar="MODULE_DIR")
    build.add_argument("--out", default="out", help="where the .tar.gz artifacts go (default ./out)")
    build.set_defaults(func=cmd_bundle_build)
    deliver = bundle_verbs.add_parser(
        "deliver", help="put artifacts on the bus and make a node a member of their modules", parents=[bus]
    )
    deliver.add_argument("artifacts", nargs="+", metavar="ARTIFACT")
    deliver.add_argument("--node", help="the node that runs them (default: the local one)")
    deliver.add_argument(
        "--seat", action="append", help="hold only these seats (default: every seat the module declares)"
    )
    deliver.set_defaults(func=cmd_bundle_deliver)
    remove = bundle_verbs.add_parser(
        "remove", help="end a node's membership of modules: it stops their bundles", parents=[bus]
    )
    remove.add_argument("modules", nargs="+", metavar="MODULE")
    remove.add_argument("--node", help="the node (default: the local one)")
    remove.set_defaults(func=cmd_bundle_remove)


def cmd_bundle_build(args: argparse.Namespace) -> int:
    from toolchains.build import build_module
    from toolchains.progress import BuildProgress

    out = Path(args.out)
    with BuildProgress() as progress:  # a live line on a terminal, plain lines otherwise
        for module_dir in args.modules:
            build_module(Path(module_dir), out, progress=progress)
    return 0


def _member_node(args: argparse.Namespace) -> tuple[NatsConfig, str]:
    """The bus, and the node whose membership changes: --node, else the local one."""
    cfg, found = client_config(args)
    node = args.node or found
    if not node:
        raise MeshError("which node? name it with --node NAME")
    return cfg, checked_node(node)


def cmd_bundle_deliver(args: argparse.Namespace) -> int:
    from runtime.meshctl.bus import bus
    from runtime.meshctl.deliver import deliver

    cfg, node = _member_node(args)
    paths = [Path(a) for a in args.artifacts]
    for path in paths:
        if not path.is_file():
            raise MeshError(f"{path}: no such artifact; build one with `meshctl bundle build MODULE_DIR --out DIR`")

    async def run() -> None:
        async with bus(cfg) as nc:
            await deliver(nc, paths, node, args.seat, progress=lambda line: print(line, flush=True))

    anyio.run(run)
    return 0


def cmd_bundle_remove(args: argparse.Namespace) -> int:
    from runtime.meshctl.bus import bus
    from runtime.meshctl.deliver import remove

    cfg, node = _member_node(args)

    async def run() -> None:
        async with bus(cfg) as nc:
            membership = await remove(nc, args.modules, node)
        print(
            f"node {node}: removed {', '.join(args.modules)}; delivered modules left on it: "
            f"{', '.join(membership.modules) or 'none'}"
        )

    anyio.run(run)
    return 0
