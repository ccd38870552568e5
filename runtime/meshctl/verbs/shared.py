"""What several verbs share: argument types, a table on stdout, a node's name checked."""

from __future__ import annotations

import argparse
import math
from typing import Sequence

from runtime.config import ConfigError, NodeConfig, finish, node_name_problem
from runtime.meshctl.errors import MeshError


def seconds(text: str) -> float:
    """An argparse type: a time in seconds above 0 (0 or less would be a deadline already past)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds; give e.g. 30 or 0.5") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} seconds: give a number above 0, e.g. 30 or 0.5")
    return value


def table(rows: Sequence[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())


def checked_node(name: str) -> str:
    """A node name given to a verb: it becomes part of subjects and KV keys, so it must be a name."""
    if why := node_name_problem(name):
        raise MeshError(why)
    return name


def finished(config: NodeConfig) -> NodeConfig:
    try:
        return finish(config)
    except ConfigError as e:
        raise MeshError(f"{e}; name the node with --name (or `name` in --config)") from None
