"""The registration check the catalogue's CI runs: record 0188's rule, and a manifest that loads.

A module's own code is bundles, never an image: an `image` artifact built from a context or
Dockerfile inside the module's folder, or built on the runtime's own image, is refused. An
image of third-party software is allowed.
"""

from __future__ import annotations

import os
from pathlib import Path

from .imported import LANGUAGE_OF, REGISTRIES, LockError, is_package_bundle, read_lock
from .load import LoadedModule, ManifestError, Problem, load_module, load_module_bytes

# Repositories of the runtime's own image; an image built on one of them wraps own code in it.
RUNTIME_IMAGES: tuple[str, ...] = ("mesh-node", "mesh/node", "mesh-runtime", "mesh/tool-runtime")

RULE = (
    "record 0188 refuses it: a module's own code is bundles in any language ([[bundle]] with language "
    "and source), never an image; images are for third-party software the module installs"
)


def _repository(ref: str) -> str:
    ref = ref.split("@", 1)[0]
    last = ref.rsplit("/", 1)[-1]
    if ":" in last:
        ref = ref[: len(ref) - len(last)] + last.split(":", 1)[0]
    for prefix in ("docker.io/library/", "docker.io/"):
        if ref.startswith(prefix):
            ref = ref[len(prefix) :]
    return ref


def is_runtime_image(ref: str, runtime_images: tuple[str, ...] = RUNTIME_IMAGES) -> bool:
    repo = _repository(ref)
    # Normalise the given names too: `--runtime-image ghcr.io/acme/node:2` must still match its repository.
    return any(repo == r or repo.endswith("/" + r) for r in map(_repository, runtime_images))


def third_party(loaded: LoadedModule) -> tuple[list[str], list[Problem]]:
    """What the module ships of third-party packages (imported with `meshctl module import`), and their problems.

    A package bundle is third-party code fetched from a registry and pinned by hash, not the
    module's own code: record 0188's rule for own code does not apply to it, and the check says so.
    """
    notes: list[str] = []
    problems: list[Problem] = []
    file = str(loaded.path)
    refs = {a.ref for a in loaded.module.artifact if a.kind == "package"}
    for i, bundle in enumerate(loaded.module.bundle):
        source = loaded.source_dir(bundle)
        if not is_package_bundle(source):
            continue
        try:
            lock = read_lock(source)
        except LockError as e:
            problems.append(Problem(file, f"bundle[{i}].source", e.reason))
            continue
        if LANGUAGE_OF[lock.registry] != bundle.language:
            problems.append(
                Problem(
                    file,
                    f"bundle[{i}].language",
                    f"{bundle.language!r}, but the bundle is a {lock.registry} package ({lock.spec}): "
                    f"write language = {LANGUAGE_OF[lock.registry]!r}",
                )
            )
        if lock.spec not in refs:
            problems.append(
                Problem(
                    file,
                    "artifact",
                    f"bundle {bundle.name!r} is the third-party package {lock.spec}, which no "
                    f'[[artifact]] names: add kind = "package", ref = "{lock.spec}"',
                )
            )
        notes.append(
            f"bundle {bundle.name!r} is third-party: the package {lock.spec} from {REGISTRIES[lock.registry]}, "
            f"{len(lock.fetched)} files pinned by hash; not the module's own code"
        )
    return notes, problems


def check_loaded(loaded: LoadedModule, runtime_images: tuple[str, ...] = RUNTIME_IMAGES) -> list[Problem]:
    problems: list[Problem] = list(third_party(loaded)[1])
    file = str(loaded.path)
    for i, artifact in enumerate(loaded.module.artifact):
        if artifact.kind != "image":
            continue
        where = f"artifact[{i}]"
        if artifact.build is not None:
            try:
                context = (loaded.root / artifact.build).resolve()
            except (OSError, RuntimeError):  # a symlink loop (Python 3.11): judge the path as written
                context = Path(os.path.normpath(loaded.root / artifact.build))
            if context == loaded.root or loaded.root in context.parents:
                problems.append(
                    Problem(
                        file,
                        f"{where}.build",
                        f"the image is built from the module's own folder ({artifact.build!r}); {RULE}",
                    )
                )
            else:
                problems.append(
                    Problem(
                        file,
                        f"{where}.build",
                        f"the build context {artifact.build!r} is outside the module folder; a module builds no image "
                        "of its own: name a third-party image in `ref`, or ship the code as a bundle",
                    )
                )
        for field, ref in (("base", artifact.base), ("ref", artifact.ref if artifact.build is not None else None)):
            if ref and is_runtime_image(ref, runtime_images):
                problems.append(
                    Problem(file, f"{where}.{field}", f"the image {ref!r} is built on the runtime's own image; {RULE}")
                )
        if (
            artifact.build is None
            and artifact.base is None
            and artifact.ref
            and is_runtime_image(artifact.ref, runtime_images)
        ):
            problems.append(
                Problem(
                    file,
                    f"{where}.ref",
                    f"{artifact.ref!r} is the runtime's own image, which carries no module's code; {RULE}",
                )
            )
    return problems


def check_path(path: Path | str, runtime_images: tuple[str, ...] = RUNTIME_IMAGES) -> list[Problem]:
    """Every problem of one module: loading first, then the record 0188 rule."""
    try:
        loaded = load_module(path)
    except ManifestError as e:
        return e.problems
    return check_loaded(loaded, runtime_images)


def check_text(text: str, label: str, root: Path) -> list[Problem]:
    """The same for a manifest that travels as text (an artifact's bundle.json), as if at `root`."""
    try:
        loaded = load_module_bytes(text.encode(), Path(root) / "module.toml", label)
    except ManifestError as e:
        return e.problems
    return check_loaded(loaded)


def refuse_own_image(loaded: LoadedModule) -> None:
    """Raise ManifestError when the module breaks record 0188: where code enters, not only in CI."""
    if problems := check_loaded(loaded):
        raise ManifestError(problems)
