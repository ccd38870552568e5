"""Import from PyPI: `pip download` of the wheels, hashed; the entry from the console scripts."""

from __future__ import annotations

import configparser
import hashlib
import re
import shutil
import sys
import zipfile
from pathlib import Path

from manifests.imported import Fetched, PackageLock
from runtime.meshctl.imports.fetch import Fetch, Resolved

REQUIREMENTS = "requirements.txt"
_WHEEL_RE = re.compile(
    r"^(?P<name>[^-]+)-(?P<version>[^-]+)(-\d[^-]*)?-(?P<py>[^-]+)-(?P<abi>[^-]+)-(?P<plat>[^-]+)\.whl$"
)


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pip(*args: str) -> list[str]:
    return [sys.executable, "-m", "pip", *args, "--disable-pip-version-check", "--no-input"]


def resolve(fetch: Fetch, args: list[str]) -> Resolved:
    spec = fetch.spec
    wheels = fetch.cache / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    index = ["--no-index"] if fetch.offline else []
    version = spec.version
    if version is None:
        shown = fetch.run(pip("index", "versions", spec.package, *index, "--find-links", str(wheels)), fetch.work)
        found = re.search(r"\(([^)]+)\)", shown)
        if found is None:
            raise fetch.fail(f"pip index versions named no newest version ({shown.strip()[:200]})")
        version = found.group(1)
        fetch.log(f"pypi: newest {spec.package} is {version}")
    dest = fetch.work / "wheels"
    fetch.log(f"pypi: downloading {spec.package}=={version} and its dependencies (wheels only)")
    fetch.run(
        pip(
            "download",
            f"{spec.package}=={version}",
            "--only-binary=:all:",  # no sdist: building one would run the package's code here
            "--dest",
            str(dest),
            "--find-links",
            str(wheels),
            *index,
        ),
        fetch.work,
    )
    fetched, top, native = [], None, False
    for path in sorted(dest.glob("*.whl")):
        m = _WHEEL_RE.match(path.name)
        if m is None:
            raise fetch.fail(f"pip fetched {path.name}, which is not a wheel file name")
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        fetched.append(
            Fetched(name=canonical(m["name"]), version=m["version"], hash=f"sha256:{digest}", file=path.name)
        )
        native = native or m["plat"] != "any"
        if canonical(m["name"]) == canonical(spec.package):
            top = path
        if not (wheels / path.name).exists():
            shutil.copyfile(path, wheels / path.name)  # the build installs from here
    if top is None:
        raise fetch.fail(f"pip fetched no wheel of {spec.package} itself")
    module, attr = _console_script(fetch, top)
    code = f"import sys; from {module} import {attr.split('.')[0]}; sys.exit({attr}())"
    lock = PackageLock(
        registry="pypi",
        package=canonical(spec.package),
        version=version,
        spec=spec.pinned(version),
        entry=["python", "-c", code, *args],
        fetched=fetched,
        python_abi=f"cp{sys.version_info.major}{sys.version_info.minor}" if native else "",
    )
    requirements = "".join(f"{f.name}=={f.version} --hash={f.hash}\n" for f in fetched)
    return Resolved(lock, {REQUIREMENTS: requirements.encode()}, _summary(top))


def _dist_info(wheel: zipfile.ZipFile, name: str) -> str | None:
    found = [
        n
        for n in wheel.namelist()
        if n.count("/") == 1 and n.split("/")[0].endswith(".dist-info") and n.endswith("/" + name)
    ]
    return wheel.read(found[0]).decode("utf-8", "replace") if found else None


def _console_script(fetch: Fetch, top: Path) -> tuple[str, str]:
    """(module, attribute) of the console script named like the package, or of the only one."""
    with zipfile.ZipFile(top) as wheel:
        text = _dist_info(wheel, "entry_points.txt")
    parser = configparser.ConfigParser(delimiters=("=",), interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keep names' case
    parser.read_string(text or "")
    scripts = dict(parser["console_scripts"]) if parser.has_section("console_scripts") else {}
    if not scripts:
        raise fetch.fail(f"{top.name} declares no console script: it is a library, not a server one can run")
    name = canonical(fetch.spec.package)
    chosen = next((v for k, v in scripts.items() if canonical(k) == name), None)
    if chosen is None and len(scripts) == 1:
        chosen = next(iter(scripts.values()))
    if chosen is None:
        raise fetch.fail(
            f"{top.name} declares several console scripts ({', '.join(sorted(scripts))}); write the entry by hand"
        )
    target = chosen.split("[", 1)[0].strip()
    module, _, attr = target.partition(":")
    if not re.match(r"^[A-Za-z_][\w.]*\Z", module) or not re.match(r"^[A-Za-z_][\w.]*\Z", attr):
        raise fetch.fail(f"its console script {chosen!r} is not module:function")
    return module, attr


def _summary(top: Path) -> str:
    with zipfile.ZipFile(top) as wheel:
        text = _dist_info(wheel, "METADATA") or ""
    m = re.search(r"^Summary: (.*)$", text, re.M)
    return m.group(1).strip() if m else ""
