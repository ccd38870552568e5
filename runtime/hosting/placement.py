"""What a node serves and how: a module's bundles, where they are, what they were built with.

Both the node (modules served from source at start) and delivery (modules fetched from the
bus) hand the node a `Placement`; the node turns each of its tools bundles into a runner.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from manifests import LoadedModule, ManifestError, find_modules, load_module
from manifests.check import refuse_own_image

log = logging.getLogger("mesh.node")


# Languages a node runs straight from their source folder; the others are built first.
RUN_FROM_SOURCE = frozenset({"python"})


@dataclass
class Placement:
    """Where a module's bundles are on this node and what each was built with."""

    loaded: LoadedModule
    dirs: dict[str, Path]
    build_env: dict[str, dict[str, str]] = field(default_factory=dict)
    seats: list[str] | None = None  # seats to hold; None: every seat the module declares
    from_source: bool = False


def from_source(loaded: LoadedModule) -> Placement:
    return Placement(loaded, {b.name: loaded.source_dir(b) for b in loaded.module.bundle}, from_source=True)


def data_dir(state_dir: Path | str, module: str) -> Path:
    """A module's own folder of data, shared by its bundles: <state>/data/<module>."""
    return Path(state_dir) / "data" / module


def made_data_dir(state_dir: Path | str, module: str, user: str | None = None, group: str | None = None) -> Path:
    """`data_dir`, made when missing and private: 0700 and the children's (`user`'s when they run as
    one). `<state>/data` is 0700, or 0711 when children run as another user: they pass through it
    to their own folder and list nothing. The children's umask (077) keeps what they write there theirs."""
    folder = data_dir(state_dir, module)
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder.parent, 0o711 if user else 0o700)
    if user:
        shutil.chown(folder, user, group)
    os.chmod(folder, 0o700)
    return folder


def load_placements(directory: Path) -> tuple[list[Placement], list[str]]:
    """Every module folder under `directory`, served from source; problems are named, not fatal."""
    placements: list[Placement] = []
    problems: list[str] = []
    try:
        folders = find_modules(directory)
    except OSError as e:
        return [], [f"{directory}: cannot read the manifests folder: {e.strerror}"]
    names: dict[str, Path] = {}
    for folder in folders:
        try:
            loaded = load_module(folder)
            refuse_own_image(loaded)  # record 0188: served from source or delivered, never an own image
        except ManifestError as e:
            problems.extend(str(p) for p in e.problems)
            continue
        if loaded.module.name in names:
            problems.append(
                f"{loaded.path}: name: module {loaded.module.name!r} is also in {names[loaded.module.name]}"
            )
            continue
        names[loaded.module.name] = loaded.path
        placements.append(from_source(loaded))
    return placements, problems
