"""Manifest loading and the registration check (record 0188).

The loader must name the file, the field and what would be right for every mistake, and report
all of a file's problems at once. The check refuses a module's own code shipped as an image.
A property test feeds the loader random manifests: it may refuse them, never crash on them.
"""

from __future__ import annotations

import datetime
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from manifests import LoadedModule, ManifestError, Problem, load_module
from manifests.check import check_path, is_runtime_image
from manifests.model import KINDS, LANGUAGES, NAME_RE

DATA = Path(__file__).resolve().parents[2] / "data" / "manifests"

# A valid manifest; each loader case below changes one line of it.
GOOD = """\
name = "hello"
version = "0.1.0"

[[bundle]]
name = "tools"
kind = "tools"
language = "go"
source = "src"
entry = ["hello"]
timeout_ms = 30000

[[seat]]
name = "memory"
"""

SECOND_BUNDLE = """
[[bundle]]
name = "tools"
kind = "tools"
language = "python"
source = "src"
entry = ["python", "main.py"]
"""


def write_module(folder: Path, text: str | bytes) -> Path:
    """A module folder with `text` as its module.toml and a `src` folder; returns the module.toml."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "src").mkdir(exist_ok=True)
    file = folder / "module.toml"
    if isinstance(text, bytes):
        file.write_bytes(text)
    else:
        file.write_text(text, encoding="utf-8")
    return file


def load_problems(path: Path) -> list[Problem]:
    with pytest.raises(ManifestError) as caught:
        load_module(path)
    assert caught.value.problems, "a ManifestError without problems explains nothing"
    return caught.value.problems


def test_the_base_manifest_of_the_cases_is_valid(tmp_path: Path) -> None:
    assert load_module(write_module(tmp_path / "m", GOOD)).module.name == "hello"


# --- 1. the loader: every mistake named by file, field and what would be right -------------------
# (line to replace in GOOD, its replacement, the field named, texts the message must contain)
# A table: one case a line, as written.
# fmt: off
CASES: dict[str, tuple[str, str, str, tuple[str, ...]]] = {
    "name uppercase": ('name = "hello"', 'name = "Hello"', "name", ("'Hello'", "[a-z][a-z0-9-]{0,62}")),
    "name too long": ('name = "hello"', f'name = "{"a" * 64}"', "name", ("[a-z][a-z0-9-]{0,62}",)),
    "name starts with a digit": ('name = "hello"', 'name = "1hello"', "name", ("'1hello'", "[a-z]")),
    "name with a trailing newline": ('name = "hello"', 'name = "hello\\n"', "name", ("[a-z][a-z0-9-]{0,62}",)),
    "name missing": ('name = "hello"\n', "", "name", ("missing",)),
    "version missing": ('version = "0.1.0"\n', "", "version", ("missing", '"0.1.0"')),
    "version not a string": ('version = "0.1.0"', "version = 1", "version", ('"0.1.0"',)),
    "unknown language": ('language = "go"', 'language = "java"', "bundle[0].language",
                         ("'java'", "python, typescript, go, rust, c")),
    "unknown kind": ('kind = "tools"', 'kind = "tool"', "bundle[0].kind", ("'tool'", "tools, service, step")),
    "entry missing": ('entry = ["hello"]\n', "", "bundle[0].entry", ("missing", "argv")),
    "entry empty": ('entry = ["hello"]', "entry = []", "bundle[0].entry", ("non-empty list of strings",)),
    "entry not strings": ('entry = ["hello"]', 'entry = ["hello", 3]', "bundle[0].entry", ("list of strings",)),
    "entry absolute": ('entry = ["hello"]', 'entry = ["/usr/bin/hello"]', "bundle[0].entry",
                       ("'/usr/bin/hello'", "outside the bundle")),
    "entry with ..": ('entry = ["hello"]', 'entry = ["../hello"]', "bundle[0].entry", ("outside the bundle",)),
    "entry with NUL": ('entry = ["hello"]', 'entry = ["hel\\u0000lo"]', "bundle[0].entry", ("NUL",)),
    "source escapes": ('source = "src"', 'source = "../other"', "bundle[0].source",
                       ("'../other'", "escapes the module folder")),
    "source escapes via src": ('source = "src"', 'source = "src/../../other"', "bundle[0].source", ("escapes",)),
    "source absolute": ('source = "src"', 'source = "/srv/src"', "bundle[0].source", ("absolute", "relative")),
    "source missing": ('source = "src"\n', "", "bundle[0].source", ("missing", "relative to module.toml")),
    "source not a string": ('source = "src"', "source = 5", "bundle[0].source", ("is 5", "folder")),
    "source with NUL": ('source = "src"', 'source = "s\\u0000rc"', "bundle[0].source", ("NUL",)),
    "bad seat name": ('name = "memory"', 'name = "Memory"', "seat[0].name", ("'Memory'", "[a-z][a-z0-9-]{0,62}")),
    "seat name with a dot": ('name = "memory"', 'name = "memory.get"', "seat[0].name", ("'memory.get'",)),
    "seat stateless not bool": ('name = "memory"', 'name = "memory"\nstateless = "yes"', "seat[0].stateless",
                                ("true or false",)),
    "unknown top-level field": ('version = "0.1.0"', 'version = "0.1.0"\nauthor = "me"', "author",
                                ("unknown field", "bundle", "version")),
    "unknown odd top-level field": ('version = "0.1.0"', 'version = "0.1.0"\n"a b\\n" = 1', '"a b\\n"',
                                    ("unknown field",)),
    "unknown bundle field": ('language = "go"', 'language = "go"\nlang = "go"', "bundle[0].lang",
                             ("unknown field", "language", "entry")),
    "unknown seat field": ('name = "memory"', 'name = "memory"\ncolour = "red"', "seat[0].colour", ("stateless",)),
    "timeout_ms a string": ("timeout_ms = 30000", 'timeout_ms = "30s"', "bundle[0].timeout_ms",
                            ("'30s'", "whole number")),
    "timeout_ms a bool": ("timeout_ms = 30000", "timeout_ms = true", "bundle[0].timeout_ms", ("whole number",)),
    "timeout_ms zero": ("timeout_ms = 30000", "timeout_ms = 0", "bundle[0].timeout_ms", ("from 1",)),
    "max_in_flight a float": ("timeout_ms = 30000", "max_in_flight = 2.5", "bundle[0].max_in_flight",
                              ("whole number",)),
    "env value not a string": ("timeout_ms = 30000", "env = { LEVEL = 3 }", "bundle[0].env", ("table of strings",)),
    "env not a table": ("timeout_ms = 30000", 'env = ["LEVEL=3"]', "bundle[0].env", ("table of strings",)),
    "env key MESH_": ("timeout_ms = 30000", 'env = { MESH_NODE = "me" }', "bundle[0].env.MESH_NODE", ("MESH_",)),
    "env key not a name": ("timeout_ms = 30000", 'env = { "LOG-LEVEL" = "x" }', "bundle[0].env.LOG-LEVEL",
                           ("variable name",)),
    "env key with a newline": ("timeout_ms = 30000", 'env = { "A\\n" = "x" }', 'bundle[0].env."A\\n"',
                               ("variable name",)),
    "pass_env not names": ("timeout_ms = 30000", 'pass_env = ["HOME", "not a name"]', "bundle[0].pass_env",
                           ("variable names",)),
    "bundle not an array": ("[[bundle]]", "[bundle]", "bundle", ("[[bundle]]",)),
    "description not a string": ('version = "0.1.0"', 'version = "0.1.0"\ndescription = 3', "description",
                                 ("string",)),
    "duplicate bundle names": ("\n[[seat]]", SECOND_BUNDLE + "\n[[seat]]", "bundle[1].name",
                               ('"tools"', "unique")),
    "bundle[1] language": ("\n[[seat]]", SECOND_BUNDLE.replace('"tools"\nkind', '"other"\nkind')
                           .replace('"python"', '"java"') + "\n[[seat]]", "bundle[1].language", ("'java'",)),
    "duplicate seats": ('name = "memory"', 'name = "memory"\n\n[[seat]]\nname = "memory"', "seat[1].name",
                        ('"memory"', "twice")),
    "artifact unknown kind": ('name = "memory"', 'name = "memory"\n\n[[artifact]]\nkind = "vm"\nref = "x"',
                              "artifact[0].kind", ("image, package, binary",)),
    "artifact without ref": ('name = "memory"', 'name = "memory"\n\n[[artifact]]\nkind = "image"',
                             "artifact[0].ref", ("docker.io/library/postgres:16",)),
    "artifact unknown field": ('name = "memory"',
                               'name = "memory"\n\n[[artifact]]\nkind = "image"\nref = "x"\nimage = "y"',
                               "artifact[0].image", ("unknown field", "ref")),
    # Confinement (issue 24): paths, TCP destinations, limits.
    "read escapes the bundle": ("timeout_ms = 30000", 'read = ["../other-bundle"]', "bundle[0].read[0]",
                                ("'../other-bundle'", "escapes the bundle folder", "absolute path")),
    "read with .. in an absolute path": ("timeout_ms = 30000", 'read = ["/srv/../etc"]', "bundle[0].read[0]",
                                         ("has a .. in it",)),
    "read the whole machine": ("timeout_ms = 30000", 'read = ["/"]', "bundle[0].read[0]",
                               ("whole machine", "name the folders")),
    "read with ~": ("timeout_ms = 30000", 'read = ["~/.npmrc"]', "bundle[0].read[0]", ("not expanded", "absolute")),
    "read not a list": ("timeout_ms = 30000", 'read = "/srv"', "bundle[0].read", ("write a list",)),
    "write not a string": ("timeout_ms = 30000", "write = [3]", "bundle[0].write[0]", ("is 3", "write a path")),
    "write with NUL": ("timeout_ms = 30000", 'write = ["ca\\u0000che"]', "bundle[0].write[0]", ("NUL",)),
    "network without a port": ("timeout_ms = 30000", 'network = ["db.example.com"]', "bundle[0].network[0]",
                               ("has no port", '"127.0.0.1:5432"')),
    "network every port": ("timeout_ms = 30000", 'network = ["*:*"]', "bundle[0].network[0]",
                           ("by port", "name the ports")),
    "network port zero": ("timeout_ms = 30000", 'network = ["127.0.0.1:0"]', "bundle[0].network[0]",
                          ("from 1 to 65535",)),
    "network port too big": ("timeout_ms = 30000", 'network = ["*:65536"]', "bundle[0].network[0]",
                             ("'65536'", "from 1 to 65535")),
    "network bad host": ("timeout_ms = 30000", 'network = ["-db-:5432"]', "bundle[0].network[0]",
                         ("is not a host",)),
    "network bad IPv4": ("timeout_ms = 30000", 'network = ["127.0.0.256:5432"]', "bundle[0].network[0]",
                         ("not an IPv4 address",)),
    "network IPv6 unbracketed": ("timeout_ms = 30000", 'network = ["::1:5432"]', "bundle[0].network[0]",
                                 ("in brackets",)),
    "network a number": ("timeout_ms = 30000", "network = [5432]", "bundle[0].network[0]", ("HOST:PORT",)),
    "max_memory_mb too small": ("timeout_ms = 30000", "max_memory_mb = 8", "bundle[0].max_memory_mb",
                                ("is 8", "from 16 to 1048576")),
    "max_processes zero": ("timeout_ms = 30000", "max_processes = 0", "bundle[0].max_processes", ("from 1 to 65536",)),
    "max_open_files a string": ("timeout_ms = 30000", 'max_open_files = "many"', "bundle[0].max_open_files",
                                ("'many'", "whole number")),
    "artifact build not a string": ('name = "memory"',
                                    'name = "memory"\n\n[[artifact]]\nkind = "image"\nref = "x"\nbuild = 1',
                                    "artifact[0].build", ("path string",)),
}
# fmt: on


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_each_mistake_names_file_field_and_what_is_right(tmp_path: Path, case: str) -> None:
    old, new, field, expected = CASES[case]
    assert old in GOOD
    file = write_module(tmp_path / "m", GOOD.replace(old, new, 1))
    problems = load_problems(file)
    named = [p for p in problems if p.field == field]
    assert named, f"no problem names {field}: {[str(p) for p in problems]}"
    for p in problems:
        assert p.file == str(file)
        assert str(p).startswith(f"{file}: {p.field}: ")
        assert "\n" not in str(p), "the CLI prints one line per problem"
    for text in expected:
        assert any(text in p.message for p in named), f"{text!r} not in {[p.message for p in named]}"


def test_all_problems_of_one_file_are_reported_together() -> None:
    file = DATA / "many-mistakes" / "module.toml"
    problems = load_problems(file)
    fields = [p.field for p in problems]
    assert sorted(fields) == sorted(
        {
            "name",
            "version",
            "colour",
            "bundle[0].kind",
            "bundle[0].source",
            "bundle[0].entry",
            "bundle[0].timeout_ms",
            "bundle[1].name",
            "bundle[1].language",
            "bundle[1].source",
            "bundle[1].entry",
            "bundle[1].env.MESH_NODE",
            "bundle[1].lang",
            "bundle[2].name",
            "bundle[2].env",
            "bundle[2].entry",
            "seat[1].name",
            "seat[2].name",
        }
    ), "\n".join(str(p) for p in problems)
    assert all(str(p).startswith(f"{file}: ") for p in problems)
    # The whole error reads as one problem per line, so a person sees everything in one go.
    with pytest.raises(ManifestError) as caught:
        load_module(file)
    assert str(caught.value).splitlines() == [str(p) for p in problems]


def test_not_toml(tmp_path: Path) -> None:
    file = write_module(tmp_path / "m", 'name = "hello"\nversion = 0.1.0\n[[bundle]\n')
    [problem] = load_problems(file)
    assert problem.file == str(file) and "is not valid TOML" in problem.message and "line 2" in problem.message


def test_not_utf8(tmp_path: Path) -> None:
    file = write_module(tmp_path / "m", 'name = "h\xe9llo"\nversion = "0.1.0"\n'.encode("latin-1"))
    [problem] = load_problems(file)
    assert problem.file == str(file) and "UTF-8" in problem.message


def test_nested_too_deep_is_a_problem_not_a_recursion_error(tmp_path: Path) -> None:
    file = write_module(tmp_path / "m", "x = " + "[" * 5000 + "]" * 5000 + "\n")
    [problem] = load_problems(file)
    assert "too deeply" in problem.message


@pytest.mark.parametrize("where", ["folder", "file", "empty folder"])
def test_missing_file(tmp_path: Path, where: str) -> None:
    target = {"folder": tmp_path / "absent", "file": tmp_path / "absent" / "module.toml", "empty folder": tmp_path}[
        where
    ]
    [problem] = load_problems(target)
    # A path that is no folder is taken as the manifest itself.
    shown = target / "module.toml" if target.is_dir() else target
    assert problem.file == str(shown) and "no such file" in problem.message and "module.toml" in problem.message


def test_source_through_a_symlink_loop_is_a_problem(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    file = write_module(folder, GOOD.replace('source = "src"', 'source = "loop"'))
    (folder / "loop").symlink_to("loop")
    problems = load_problems(file)
    assert [p.field for p in problems] == ["bundle[0].source"]


def test_source_through_a_symlink_out_of_the_module_escapes(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    (tmp_path / "elsewhere").mkdir()
    file = write_module(folder, GOOD.replace('source = "src"', 'source = "link"'))
    (folder / "link").symlink_to(tmp_path / "elsewhere")
    [problem] = load_problems(file)
    assert problem.field == "bundle[0].source" and "escapes" in problem.message


# --- 2. a good manifest becomes the structs, with the right values and defaults ------------------
@pytest.mark.parametrize("given_as", ["folder", "module.toml"])
def test_good_manifest_loads_with_values_and_defaults(given_as: str) -> None:
    folder = DATA / "good"
    loaded = load_module(folder if given_as == "folder" else folder / "module.toml")
    assert isinstance(loaded, LoadedModule)
    assert loaded.path == folder / "module.toml" and loaded.root == folder.resolve()
    m = loaded.module
    assert (m.name, m.version) == ("hello", "0.1.0")
    assert m.description.startswith("The architecture sketch")
    tools, worker = m.bundle
    assert (tools.name, tools.kind, tools.language) == ("tools", "tools", "go")
    assert (tools.source, tools.entry) == ("go", ["hello"])
    assert tools.env == {"LOG_LEVEL": "info"} and tools.timeout_ms == 30_000
    assert tools.pass_env == [] and tools.max_in_flight == 256  # defaults
    assert (worker.kind, worker.language, worker.entry) == ("service", "python", ["python", "main.py", "--serve"])
    assert worker.env == {} and worker.pass_env == ["HTTPS_PROXY"]
    assert (worker.timeout_ms, worker.max_in_flight) == (5000, 8)
    assert [(s.name, s.stateless) for s in m.seat] == [("memory", False), ("clock", True)]
    [image] = m.artifact
    assert (image.kind, image.ref, image.build, image.base) == ("image", "docker.io/library/postgres:16", None, None)
    assert m.tools_bundles() == [tools] and m.seat_names() == ["memory", "clock"]
    assert loaded.source_dir(tools) == (folder / "go").resolve() and loaded.source_dir(tools).is_dir()
    assert loaded.source_dir(worker) == (folder / "worker").resolve()


def test_confinement_fields_load_with_their_values() -> None:
    bundle = load_module(Path(__file__).resolve().parents[2] / "children" / "sandbox-probe").module.bundle[0]
    assert (bundle.read, bundle.write) == (["/srv/models"], ["cache"])
    assert bundle.endpoints() == [("127.0.0.1", 5432), ("*", 443)]
    assert (bundle.max_memory_mb, bundle.max_processes, bundle.max_open_files) == (512, 64, 256)


def test_minimal_manifest_defaults(tmp_path: Path) -> None:
    m = load_module(write_module(tmp_path / "m", 'name = "bare"\nversion = "1"\n')).module
    assert (m.bundle, m.seat, m.artifact, m.description) == ([], [], [], "")


def test_the_repository_bundles_load() -> None:
    bundles = Path(__file__).resolve().parents[3] / "bundles"
    folders = sorted(p for p in bundles.iterdir() if (p / "module.toml").is_file())
    assert folders
    for folder in folders:
        assert check_path(folder) == [], folder


# --- 3. the registration check: record 0188 ---------------------------------------------------
def test_good_module_passes_the_check() -> None:
    assert check_path(DATA / "good") == []


@pytest.mark.parametrize("module", ["build-dot", "build-docker", "build-dockerfile"])
def test_image_built_from_inside_the_module_is_refused(module: str) -> None:
    folder = DATA / module
    build = load_module(folder).module.artifact[0].build
    assert build is not None and (folder / build).exists()  # the context really is in the module
    [problem] = check_path(folder)
    assert problem.file == str(folder / "module.toml") and problem.field == "artifact[0].build"
    assert "record 0188" in problem.message and repr(build) in problem.message


def test_image_built_on_the_runtime_image_is_refused() -> None:
    [problem] = check_path(DATA / "runtime-base")
    assert problem.field == "artifact[0].base"
    assert "record 0188" in problem.message and "ghcr.io/acme/mesh-node:1.2" in problem.message


def test_the_runtime_image_itself_as_an_artifact_is_refused(tmp_path: Path) -> None:
    text = GOOD + '\n[[artifact]]\nkind = "image"\nref = "docker.io/library/mesh-node:1.2"\n'
    [problem] = check_path(write_module(tmp_path / "m", text).parent)
    assert problem.field == "artifact[0].ref" and "record 0188" in problem.message


def test_build_context_outside_the_module_is_refused(tmp_path: Path) -> None:
    (tmp_path / "ctx").mkdir()
    text = GOOD + '\n[[artifact]]\nkind = "image"\nref = "x/y:1"\nbuild = "../ctx"\n'
    [problem] = check_path(write_module(tmp_path / "m", text).parent)
    assert problem.field == "artifact[0].build" and "outside the module folder" in problem.message


@pytest.mark.parametrize(
    "ref",
    [
        "docker.io/library/postgres:16",
        "redis",
        "ghcr.io/acme/mesh-node-exporter:1",
        "quay.io/prometheus/node-exporter@sha256:" + "0" * 64,
    ],
)
def test_third_party_images_pass(tmp_path: Path, ref: str) -> None:
    text = GOOD + f'\n[[artifact]]\nkind = "image"\nref = "{ref}"\n'
    assert check_path(write_module(tmp_path / "m", text).parent) == []


@pytest.mark.parametrize(
    "ref, expected",
    [
        ("mesh-node", True),
        ("docker.io/library/mesh-node:1.2", True),
        ("ghcr.io/acme/mesh-node@sha256:" + "a" * 64, True),
        ("localhost:5000/mesh/node:2", True),
        ("registry.example.com/mesh-runtime", True),
        ("docker.io/library/postgres:16", False),
        ("ghcr.io/acme/mesh-node-exporter:1", False),
        ("localhost:5000/mesh-node-ui", False),
    ],
)
def test_is_runtime_image(ref: str, expected: bool) -> None:
    assert is_runtime_image(ref) is expected


def test_runtime_images_given_with_a_tag_still_match() -> None:
    folder = DATA / "custom-runtime-base"
    assert check_path(folder) == []  # the default list does not know this runtime image
    for name in ("registry.example.com/ops/node-runtime", "registry.example.com/ops/node-runtime:9"):
        [problem] = check_path(folder, ("mesh-node", name))
        assert problem.field == "artifact[0].base" and "record 0188" in problem.message


def test_check_path_reports_load_problems() -> None:
    assert check_path(DATA / "many-mistakes") == load_problems(DATA / "many-mistakes")


def meshctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "runtime.meshctl", *args], capture_output=True, text=True, timeout=60)


def test_cli_check_good_module() -> None:
    # The installed console script, once; the other CLI tests use `python -m runtime.meshctl`.
    script = Path(sys.executable).parent / "meshctl"
    done = subprocess.run(
        [str(script), "module", "check", str(DATA / "good")], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{DATA / 'good'}: ok\n" and done.stderr == ""


def test_cli_check_several_paths() -> None:
    paths = [DATA / n for n in ("good", "build-docker", "runtime-base", "many-mistakes", "custom-runtime-base")]
    done = meshctl("module", "check", *map(str, paths))
    assert done.returncode == 1 and done.stderr == ""
    lines = done.stdout.splitlines()
    expected = [f"{paths[0]}: ok"]
    for path in paths[1:4]:
        expected += [str(p) for p in check_path(path)]
    expected.append(f"{paths[4]}: ok")
    assert lines == expected
    assert len([line for line in lines if "record 0188" in line]) == 2
    assert len(lines) == 2 + 2 + len(load_problems(DATA / "many-mistakes"))


def test_cli_runtime_image_option_and_quiet() -> None:
    folder = str(DATA / "custom-runtime-base")
    done = meshctl(
        "module",
        "check",
        "--quiet",
        "--runtime-image",
        "registry.example.com/ops/node-runtime",
        folder,
        str(DATA / "good"),
    )
    assert done.returncode == 1
    [line] = done.stdout.splitlines()  # --quiet: the passing module prints nothing
    assert line.startswith(f"{folder}/module.toml: artifact[0].base: ") and "record 0188" in line


def test_cli_missing_module() -> None:
    done = meshctl("module", "check", str(DATA / "no-such-module"))
    assert done.returncode == 1 and done.stderr == ""
    assert done.stdout == f"{DATA / 'no-such-module'}: -: no such file; a module folder holds a module.toml\n"


# --- 4. property: random manifests are refused with problems, never with a crash ----------------
def toml_string(s: str) -> str:
    # JSON string escapes are TOML basic-string escapes; TOML also wants DEL escaped.
    return json.dumps(s, ensure_ascii=False).replace("\x7f", "\\u007f")


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, str):
        return toml_string(v)
    if isinstance(v, (datetime.date, datetime.time)):
        return v.isoformat()
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{toml_string(k)} = {toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(type(v))


def toml_document(data: dict[str, Any]) -> str:
    return "".join(f"{toml_string(k)} = {toml_value(v)}\n" for k, v in data.items())


# Strategies laid out as the data they make.
# fmt: off
TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)  # type: ignore[arg-type]
SCALARS = st.one_of(
    TEXT, st.integers(-(2**63), 2**63 - 1), st.floats(), st.booleans(), st.dates(), st.times(),
)
ANY = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
                   max_leaves=6)


def sometimes(good: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly a plausible value, sometimes anything at all."""
    return st.one_of(good, good, ANY)


NAMES = sometimes(st.sampled_from(["hello", "tools", "a", "a-b", "memory", "Hello", "1a", "a" * 63, "a" * 64, "",
                                   "a.b", "hello\n", "é"]) | st.from_regex(NAME_RE, fullmatch=True))
PATHS = sometimes(st.sampled_from(["src", ".", "", "..", "../other", "/srv/src", "src/../..", "a\x00b", "src/x",
                                   "Dockerfile", "docker", "~", "//x"]) | TEXT)
ENV = sometimes(st.dictionaries(st.sampled_from(["LEVEL", "MESH_NODE", "a b", "_X", "A\n"]) | TEXT,
                                sometimes(TEXT), max_size=3))
BUNDLE = st.fixed_dictionaries({}, optional={
    "name": NAMES,
    "kind": sometimes(st.sampled_from([*KINDS, "tool"])),
    "language": sometimes(st.sampled_from([*LANGUAGES, "java"])),
    "source": PATHS,
    "entry": sometimes(st.lists(PATHS, max_size=3)),
    "env": ENV,
    "pass_env": sometimes(st.lists(st.sampled_from(["HOME", "HTTPS_PROXY", "x y", "B\n"]), max_size=2)),
    "timeout_ms": sometimes(st.integers(-5, 10**12)),
    "max_in_flight": sometimes(st.integers(-5, 200_000)),
    "unknown": ANY,
})
SEAT = st.fixed_dictionaries({}, optional={"name": NAMES, "stateless": sometimes(st.booleans()), "x": ANY})
IMAGES = sometimes(st.sampled_from(["docker.io/library/postgres:16", "ghcr.io/acme/mesh-node:1.2", "mesh-node",
                                    "", "a:b:c@d", "/", ":"]) | TEXT)
ARTIFACT = st.fixed_dictionaries({}, optional={
    "kind": sometimes(st.sampled_from(["image", "package", "binary", "vm"])),
    "ref": IMAGES, "build": PATHS, "base": IMAGES, "x": ANY,
})
MODULE = st.fixed_dictionaries({}, optional={
    "name": NAMES,
    "version": sometimes(st.sampled_from(["0.1.0", "1", "", "1.0 beta", "v2+build_7"])),
    "description": sometimes(TEXT),
    "bundle": sometimes(st.lists(sometimes(BUNDLE), max_size=3)),
    "seat": sometimes(st.lists(sometimes(SEAT), max_size=3)),
    "artifact": sometimes(st.lists(sometimes(ARTIFACT), max_size=2)),
    "extra": ANY,
})
VALID_BUNDLE = st.fixed_dictionaries(
    {"name": st.from_regex(NAME_RE, fullmatch=True), "kind": st.sampled_from(KINDS),
     "language": st.sampled_from(LANGUAGES), "source": st.sampled_from(["src", ".", "src/tools", "./src"]),
     "entry": st.lists(st.sampled_from(["python", "main.py", "bin/hello", "node", "dist/main.js", "-v"]),
                       min_size=1, max_size=3)},
    optional={"env": st.dictionaries(st.from_regex(r"[A-L_][A-Z0-9_]{0,8}", fullmatch=True), TEXT.filter(
                  lambda s: "\0" not in s), max_size=3),
              "pass_env": st.lists(st.sampled_from(["HOME", "HTTPS_PROXY", "_X1"]), max_size=2),
              "timeout_ms": st.integers(1, 24 * 3600 * 1000), "max_in_flight": st.integers(1, 100_000)},
)
VALID_MODULE = st.fixed_dictionaries(
    {"name": st.from_regex(NAME_RE, fullmatch=True), "version": st.sampled_from(["0.1.0", "1", "2.0.0-rc.1+b_7"])},  # type: ignore[dict-item]
    optional={
        "description": TEXT,
        "bundle": st.lists(VALID_BUNDLE, max_size=3, unique_by=lambda b: b["name"]),  # type: ignore[index]
        "seat": st.lists(st.fixed_dictionaries({"name": st.from_regex(NAME_RE, fullmatch=True)},
                                               optional={"stateless": st.booleans()}),
                         max_size=3, unique_by=lambda s: s["name"]),  # type: ignore[index]
        "artifact": st.lists(st.fixed_dictionaries(
            {"kind": st.sampled_from(["image", "package", "binary"]),
             "ref": st.sampled_from(["docker.io/library/postgres:16", "redis:7", "ghcr.io/acme/tool@sha256:ab"])}),
            max_size=2),
    },
)

SPOILABLE = ["name", "version", "description", "bundle", "seat", "artifact", "other", *(
    f"bundle.{f}" for f in ("name", "kind", "language", "source", "entry", "env", "pass_env", "timeout_ms",
                            "max_in_flight", "other"))]
# fmt: on


def spoil(data: dict[str, Any], artifacts: list[dict[str, Any]], field: str | None, value: Any) -> dict[str, Any]:
    """A valid module with some random artifacts (maybe own-code images) and at most one field spoilt."""
    data = {**data, "artifact": data.get("artifact", []) + artifacts}
    if field and field.startswith("bundle.") and data.get("bundle"):
        data["bundle"] = [{**data["bundle"][0], field.removeprefix("bundle."): value}, *data["bundle"][1:]]
    elif field and not field.startswith("bundle."):
        data[field] = value
    return data


# Well-formed image artifacts the record 0188 check has to judge: built in or out of the module, on any base.
IMAGE = st.fixed_dictionaries(
    {"kind": st.just("image"), "ref": st.sampled_from(["x/y:1", "postgres:16", "mesh-node:2"])},
    optional={
        "build": st.sampled_from([".", "src", "Dockerfile", "../ctx", "/ctx", "", "a/../.."]),
        "base": st.sampled_from(["debian:12", "ghcr.io/acme/mesh-node:1.2", "mesh/node"]),
    },
)
NEARLY_VALID = st.builds(
    spoil,
    VALID_MODULE,
    st.lists(st.one_of(IMAGE, IMAGE, ARTIFACT), max_size=2),
    st.none() | st.sampled_from(SPOILABLE),
    st.one_of(PATHS, NAMES, ANY),
)
TOML_BYTES = st.one_of(MODULE, NEARLY_VALID, NEARLY_VALID, NEARLY_VALID).map(toml_document).map(str.encode)
MANIFEST = st.one_of(
    TOML_BYTES,
    TOML_BYTES,
    st.binary(max_size=200),
    TOML_BYTES.flatmap(lambda b: st.integers(0, len(b)).map(lambda i: b[:i])),  # cut short
)


def assert_one_line_problems(problems: list[Problem], file: Path) -> None:
    assert problems and all(isinstance(p, Problem) for p in problems)
    for p in problems:
        assert str(file) in str(p) and "\n" not in str(p), str(p)


# tmp_path is shared by the examples of one test; each example overwrites the one module.toml.
# No example database: a failure prints the example that reproduces it.
PROPERTY = settings(
    deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)


@settings(PROPERTY, max_examples=300)
@given(raw=MANIFEST)
def test_random_manifests_load_or_fail_with_problems(tmp_path: Path, raw: bytes) -> None:
    file = write_module(tmp_path / "m", raw)
    try:
        loaded = load_module(file.parent)
    except ManifestError as e:
        assert_one_line_problems(e.problems, file)
    else:
        assert isinstance(loaded, LoadedModule)
        m = loaded.module
        assert NAME_RE.fullmatch(m.name)
        assert len({b.name for b in m.bundle}) == len(m.bundle)
        for b in m.bundle:
            source = loaded.source_dir(b)
            assert b.entry and 1 <= b.timeout_ms and (source == loaded.root or loaded.root in source.parents)
    problems = check_path(file.parent)
    assert isinstance(problems, list)
    if problems:
        assert_one_line_problems(problems, file)


@settings(PROPERTY, max_examples=150)
@given(data=VALID_MODULE)
def test_random_valid_manifests_load_and_pass(tmp_path: Path, data: dict[str, Any]) -> None:
    file = write_module(tmp_path / "v", toml_document(data))
    module = load_module(file).module
    assert module.name == data["name"]
    assert [b.name for b in module.bundle] == [b["name"] for b in data.get("bundle", [])]
    for b, raw in zip(module.bundle, data.get("bundle", [])):
        assert b.entry == raw["entry"] and b.env == raw.get("env", {}) and b.timeout_ms == raw.get("timeout_ms", 30_000)
    assert check_path(file.parent) == []
