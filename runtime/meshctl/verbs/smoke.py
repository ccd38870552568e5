"""`meshctl smoke`: build, deliver and call every hello-<language> bundle on a fresh local node."""

from __future__ import annotations

import argparse
from pathlib import Path

from runtime.meshctl.errors import MeshError
from runtime.meshctl.verbs.shared import seconds


def add_parsers(verbs: argparse._SubParsersAction, bus: argparse.ArgumentParser) -> None:
    smoke = verbs.add_parser(
        "smoke", help="build, deliver and call every hello-<language> bundle on a fresh local node"
    )
    smoke.add_argument(
        "--bundles", metavar="DIR", help="where the hello-* modules are (default: this checkout's bundles/)"
    )
    smoke.add_argument("--timeout", type=seconds, default=180.0, help="seconds for every tool to answer")
    smoke.add_argument("--keep", action="store_true", help="keep the work folder (artifacts, node state and log)")
    smoke.set_defaults(func=cmd_smoke)


def cmd_smoke(args: argparse.Namespace) -> int:
    from runtime.meshctl.smoke import run_smoke
    from toolchains.build import find_repo_root

    bundles = Path(args.bundles) if args.bundles else None
    if bundles is None:
        root = find_repo_root(Path.cwd()) or find_repo_root(Path(__file__).resolve().parent)
        if root is None:
            raise MeshError("where are the hello bundles? name the folder with --bundles DIR")
        bundles = root / "bundles"
    return run_smoke(bundles, args.timeout, args.keep)
