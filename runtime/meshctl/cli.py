"""`meshctl`: run a node, ask it for status, call tools, check and build modules.

The parser is each verb group's own (runtime/meshctl/verbs/); a verb imports what it uses when it
runs, so `meshctl call` loads the bus client and not the node, the toolchains or the face.
Errors are rendered here, once (runtime/meshctl/errors.py): a line that says what was wrong and
what would be right. Exit codes: 0 ok, 1 a check or call failed, 2 bad usage or no bus.
"""

from __future__ import annotations

import argparse
import os
import sys

from runtime.meshctl.errors import as_mesh_error
from runtime.meshctl.settings import bus_options
from runtime.meshctl.verbs import bundle, call, caller, console, mcp, module, node, seat, smoke

VERB_GROUPS = (node, call, mcp, console, module, bundle, seat, caller, smoke)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="meshctl", description="The mesh node tool runtime.")
    bus = bus_options()
    verbs = p.add_subparsers(dest="verb", required=True)
    for group in VERB_GROUPS:
        group.add_parsers(verbs, bus)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # `module import SPEC -- ARGS`: argparse's subparsers lose what follows `--`, so it is cut off here.
    server_args: list[str] = []
    if argv[:2] == ["module", "import"] and "--" in argv:
        cut = argv.index("--")
        argv, server_args = argv[:cut], argv[cut + 1 :]
    args = parser().parse_args(argv)
    args.server_args = server_args
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # here, so that a reader gone away is caught below, not at exit
        return code
    except BrokenPipeError:
        # The reader left (`meshctl call ... | head`): nothing more to tell it, and no traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # as a program ended by SIGPIPE
    except KeyboardInterrupt:
        return 130
    except Exception as e:
        error = as_mesh_error(e)
        if error is None:
            raise  # a bug of ours: the traceback is the report
        for line in error.lines():
            print(line, file=sys.stderr)
        return error.code


if __name__ == "__main__":
    sys.exit(main())
