"""The facts the node's runtime gives a bundle through its environment (MESH_*)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

# Variable per field; the runtime sets all of them for every child it launches.
_VARIABLES = {
    "node": "MESH_NODE",
    "module": "MESH_MODULE",
    "bundle": "MESH_BUNDLE",
    "bundle_dir": "MESH_BUNDLE_DIR",
    "data_dir": "MESH_DATA_DIR",
}


class FactsMissing(RuntimeError):
    """The process was not started by the mesh runtime, so some MESH_* variables are unset."""

    def __init__(self, missing: list[str]) -> None:
        self.missing = missing
        super().__init__(
            f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set: this bundle was not "
            "started by the mesh runtime; set them (MESH_NODE, MESH_MODULE, MESH_BUNDLE, "
            "MESH_BUNDLE_DIR, MESH_DATA_DIR) to run it by hand"
        )


@dataclass(frozen=True)
class Facts:
    node: str  # the node's name
    module: str  # the module this bundle belongs to
    bundle: str  # this bundle's name in the module
    bundle_dir: Path  # the unpacked bundle folder (read-only in spirit: replaced on upgrade)
    data_dir: Path  # persistent per-module data; survives upgrades and restarts


def facts() -> Facts:
    """Read the MESH_* facts; create the data folder if it is not there yet.

    There is deliberately no fallback: a data folder guessed when the variable is missing
    would be a second, unconnected store, which the mesh's failure rule forbids.
    """
    values = {field: os.environ.get(var, "") for field, var in _VARIABLES.items()}
    missing = [var for field, var in _VARIABLES.items() if not values[field]]
    if missing:
        raise FactsMissing(missing)
    data_dir = Path(values["data_dir"])
    data_dir.mkdir(parents=True, exist_ok=True)
    return Facts(
        node=values["node"],
        module=values["module"],
        bundle=values["bundle"],
        bundle_dir=Path(values["bundle_dir"]),
        data_dir=data_dir,
    )
