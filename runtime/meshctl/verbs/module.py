"""`meshctl module check | import`: the registration check (record 0188); a published MCP server as a module."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parsers(verbs: argparse._SubParsersAction, bus: argparse.ArgumentParser) -> None:
    module = verbs.add_parser("module", help="check module manifests")
    module_verbs = module.add_subparsers(dest="module_verb", required=True)
    check = module_verbs.add_parser("check", help="the registration check (record 0188)")
    check.add_argument("paths", nargs="+", metavar="PATH", help="a module folder or its module.toml")
    check.add_argument("--runtime-image", action="append", help="another repository of the runtime's own image")
    check.add_argument("--quiet", action="store_true", help="print problems only")
    check.set_defaults(func=cmd_module_check)
    imp = module_verbs.add_parser(
        "import",
        help="make a module of a published MCP server (npm, PyPI, crates.io, the Go module proxy), pinned by hash",
        description="SPEC: npm:<package>@<version>, pypi:<package>==<version>, cargo:<crate>@<version>, "
        "go:<package path>@<version>; no version: the newest, written into the lock. "
        "Arguments after -- are the server's own, appended to its entry.",
    )
    imp.add_argument("spec", metavar="SPEC", help="then, after --, the arguments the server is run with")
    imp.add_argument("--name", help="the module's name (default: from the package's name)")
    imp.add_argument("--out", help="the module folder to write (default ./<name>); must not exist or be empty")
    imp.add_argument(
        "--cache", help="the package cache (default $MESH_PACKAGE_CACHE, else beside the toolchains' cache)"
    )
    imp.add_argument(
        "--offline", action="store_true", help="use the package cache only, never the network (also MESH_OFFLINE=1)"
    )
    imp.add_argument(
        "--allow-net",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="a TCP destination the server may connect to (repeatable; written into its manifest's network); "
        "none: the server has no network at all",
    )
    imp.set_defaults(func=cmd_module_import)


def cmd_module_check(args: argparse.Namespace) -> int:
    from manifests import ManifestError, load_module
    from manifests.check import RUNTIME_IMAGES, check_path, third_party

    images = RUNTIME_IMAGES + tuple(args.runtime_image or ())
    failed = 0
    for path in args.paths:
        problems = check_path(path, images)
        for p in problems:
            print(p)
        if problems:
            failed += 1
        elif not args.quiet:
            print(f"{path}: ok")
            try:
                notes = third_party(load_module(path))[0]
            except ManifestError:
                notes = []
            for note in notes:
                print(f"{path}: {note}")
    return 1 if failed else 0


def cmd_module_import(args: argparse.Namespace) -> int:
    from manifests.imported import read_lock
    from runtime.meshctl.imports import import_package
    from runtime.meshctl.imports.core import SOURCE
    from toolchains.packaged import offline

    folder = import_package(
        args.spec,
        name=args.name,
        out=Path(args.out) if args.out else None,
        args=args.server_args,
        cache=Path(args.cache) if args.cache else None,
        offline=args.offline or offline(),
        allow_net=args.allow_net,
        log=lambda line: print(line, flush=True),
    )
    lock = read_lock(folder / SOURCE)
    print(f"{folder}: module of {lock.spec} ({len(lock.fetched)} locked files), entry {' '.join(lock.entry)}")
    net = ", ".join(dict.fromkeys(args.allow_net)) or "none (give --allow-net HOST:PORT to allow a destination)"
    print(f"network: {net}")
    print(f"next: meshctl module check {folder} && meshctl bundle build {folder} --out out")
    return 0
