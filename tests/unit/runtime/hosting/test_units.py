"""systemd units: the node's own unit and one per `service` bundle, checked by systemd itself.

`systemd-analyze verify` reads the units as systemd would and checks that each ExecStart
program exists and is executable, so the paths below are real ones. Any line it prints
(an unknown key, a bad quote) counts as a failure, not only its exit code.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from manifests import load_module
from runtime.hosting.placement import from_source
from runtime.hosting.units import (
    NODE_UNIT,
    UnitError,
    build_services,
    environment_line,
    exec_line,
    node_unit,
    path_value,
    quote_word,
    service_units,
    unit_name,
)
from toolchains.base import ToolchainMissing

REPO = Path(__file__).resolve().parents[4]
MESHCTL = Path(sys.executable).parent / "meshctl"


def verify(*units: Path) -> None:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze not installed: run scripts/setup-systemd.sh")
    done = subprocess.run([tool, "verify", "--man=no", *map(str, units)], capture_output=True, text=True, timeout=60)
    output = (done.stdout + done.stderr).strip()
    assert done.returncode == 0 and not output, f"systemd-analyze verify: exit {done.returncode}\n{output}"


def settings(text: str) -> list[tuple[str, str]]:
    pairs = (line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))
    return [(key, value) for key, value in pairs]


def service_module(root: Path, *, entry: str = '["python", "service.py", "--port", "8080"]') -> Path:
    """A module with a tools bundle (no unit) and a Python service bundle (a unit)."""
    module = root / "svc"
    (module / "src").mkdir(parents=True)
    (module / "src" / "service.py").write_text(
        "import os, time\n"
        "open(os.path.join(os.environ['MESH_DATA_DIR'], 'up'), 'w').write('up')\n"
        "while True:\n    time.sleep(60)\n"
    )
    (module / "module.toml").write_text(
        textwrap.dedent(
            f"""\
            name = "svc"
            version = "1.2.3"

            [[bundle]]
            name = "tools"
            kind = "tools"
            language = "python"
            source = "src"
            entry = ["python", "main.py"]

            [[bundle]]
            name = "daemon"
            kind = "service"
            language = "python"
            source = "src"
            entry = {entry}
            env = {{ LOG_LEVEL = "info", GREETING = 'say "hi" \\ 100% of $HOME' }}
            pass_env = ["HTTP_PROXY"]
            """
        )
    )
    return module


# --- quoting ------------------------------------------------------------------------------
def test_quote_word_leaves_plain_words_alone() -> None:
    assert quote_word("/usr/bin/python3") == "/usr/bin/python3"
    assert quote_word("--port=8080") == "--port=8080"


def test_quote_word_escapes_what_systemd_reads_specially() -> None:
    assert quote_word("a b") == '"a b"'
    assert quote_word('say "hi"') == '"say \\"hi\\""'
    assert quote_word("back\\slash") == '"back\\\\slash"'
    assert quote_word("it's") == '"it\'s"'
    assert quote_word("100%") == "100%%"  # specifiers are expanded everywhere, quoted or not
    assert quote_word("two\nlines") == '"two\\nlines"'
    assert quote_word("") == '""'


def test_dollar_is_doubled_in_exec_arguments_only() -> None:
    # Exec lines substitute $VAR and ${VAR}; Environment= gives `$` no meaning at all.
    assert quote_word("$HOME", exec_arg=True) == "$$HOME"
    assert quote_word("$HOME") == "$HOME"
    assert environment_line({"A": "cost $5 at 10%"}) == '"A=cost $5 at 10%%"'


def test_exec_line_quotes_arguments_and_keeps_a_lone_semicolon_literal() -> None:
    line = exec_line(["/opt/my app/run", "a b", "$x", ";", "50%"])
    assert line == '"/opt/my app/run" "a b" $$x \\; 50%%'


def test_exec_line_needs_an_absolute_program() -> None:
    with pytest.raises(UnitError, match="absolute"):
        exec_line(["python3", "x.py"])


def test_environment_names_are_checked_and_nul_refused() -> None:
    with pytest.raises(UnitError, match="variable name"):
        environment_line({"BAD-NAME": "x"})
    with pytest.raises(UnitError, match="NUL"):
        environment_line({"A": "x\0y"})


def test_path_value_takes_the_path_as_is_with_percent_doubled() -> None:
    assert path_value('/srv/a "b"/100%') == '/srv/a "b"/100%%'
    with pytest.raises(UnitError):
        path_value("relative/dir")
    with pytest.raises(UnitError):
        path_value("/srv/line\nbreak")


# --- the node's unit ----------------------------------------------------------------------
def test_node_unit_runs_meshctl_node_run_and_lets_the_node_drain(tmp_path: Path) -> None:
    config = Path("/etc/mesh/node.toml")  # only written into the unit, never read
    text = node_unit(meshctl=str(MESHCTL), config=str(config), name="node-a", state_dir="/var/lib/mesh-node", user=None)
    s = dict(settings(text))
    assert s["ExecStart"] == f"{MESHCTL} node run --config {config} --name node-a --state-dir /var/lib/mesh-node"
    assert s["Type"] == "simple"
    assert s["Restart"] == "on-failure" and s["RestartSec"] == "1"
    # SIGTERM to the node alone (it drains up to 30 s, then stops its children); SIGKILL to
    # whatever is left in the cgroup after that.
    assert s["KillMode"] == "mixed" and s["KillSignal"] == "SIGTERM" and s["TimeoutStopSec"] == "45"
    assert s["StateDirectory"] == "mesh-node"
    assert s["LimitNOFILE"] == "65536"
    assert s["NoNewPrivileges"] == "true" and s["PrivateTmp"] == "true" and s["ProtectSystem"] == "full"
    assert s["WantedBy"] == "multi-user.target"
    assert s["After"] == s["Wants"] == "network-online.target"
    assert "User" not in s
    unit = tmp_path / NODE_UNIT
    unit.write_text(text)
    verify(unit)


def test_node_unit_outside_var_lib_names_the_folder_and_the_user() -> None:
    state = Path("/srv/mesh/state dir")  # only written into the unit, never made
    text = node_unit(meshctl=str(MESHCTL), config=None, name=None, state_dir=str(state), user="mesh")
    s = dict(settings(text))
    assert s["ExecStart"] == f'{MESHCTL} node run --state-dir "{state}"'
    assert s["User"] == "mesh"
    assert "StateDirectory" not in s
    with pytest.raises(UnitError, match="absolute"):
        node_unit(meshctl="meshctl", config=None, name=None, state_dir=str(state), user=None)
    with pytest.raises(UnitError, match="User="):
        node_unit(meshctl=str(MESHCTL), config=None, name=None, state_dir=str(state), user="no such user")


@pytest.mark.parametrize(
    "option, where",
    [
        ("--state-dir", "/tmp/mesh-state"),
        ("--state-dir", "/var/tmp/m"),
        ("--config", "/tmp/n.toml"),
        ("--manifests", "/tmp"),
    ],
)
def test_node_unit_refuses_a_folder_its_private_tmp_would_hide(option: str, where: str) -> None:
    args: dict[str, str | None] = {"config": None, "manifests": None, "state_dir": "/var/lib/mesh-node"}
    args[{"--state-dir": "state_dir", "--config": "config", "--manifests": "manifests"}[option]] = where
    with pytest.raises(UnitError, match=f"^{option} {where} is under /.*PrivateTmp=true.*choose a folder outside"):
        node_unit(meshctl=str(MESHCTL), name=None, user=None, **args)  # type: ignore[arg-type]


# --- service bundles ----------------------------------------------------------------------
def test_a_unit_per_service_bundle_with_the_childs_environment(tmp_path: Path) -> None:
    loaded = load_module(service_module(tmp_path))
    state = tmp_path / "state"
    out = tmp_path / "units"
    paths = service_units([from_source(loaded)], node="node-a", state_dir=state, out_dir=out)
    assert [p.name for p in paths] == [unit_name("svc", "daemon")] == ["mesh-svc-daemon.service"]
    text = paths[0].read_text()
    s = settings(text)
    one = dict(s)
    src = tmp_path / "svc" / "src"
    assert one["WorkingDirectory"] == str(src)
    assert one["ExecStart"] == f"{sys.executable} service.py --port 8080"
    assert one["Restart"] == "on-failure" and one["RestartSec"] == "1"
    assert one["PassEnvironment"] == "HTTP_PROXY"
    env = [v for k, v in s if k == "Environment"]
    assert env == [
        "LOG_LEVEL=info",
        '"GREETING=say \\"hi\\" \\\\ 100%% of $HOME"',
        "MESH_NODE=node-a",
        "MESH_MODULE=svc",
        "MESH_BUNDLE=daemon",
        f"MESH_BUNDLE_DIR={src}",
        f"MESH_DATA_DIR={state / 'data' / 'svc'}",
        "PYTHONUNBUFFERED=1",
    ]
    assert (state / "data" / "svc").is_dir()  # outside /var/lib nobody else would make it
    verify(*paths)


def test_paths_with_blanks_and_percent_survive_systemds_parser(tmp_path: Path) -> None:
    # verify checks that ExecStart's program exists: it only passes when systemd read back
    # exactly this path, so this proves the quoting against systemd's own parser.
    module = service_module(tmp_path / "odd dir 100%", entry='["bin/run me"]')
    program = module / "src" / "bin" / "run me"
    program.parent.mkdir()
    program.write_text("#!/bin/sh\nexec sleep 60\n")
    program.chmod(0o755)
    paths = service_units(
        [from_source(load_module(module))], node="n", state_dir=tmp_path / "s", out_dir=tmp_path / "u"
    )
    s = dict(settings(paths[0].read_text()))
    assert s["ExecStart"] == f'"{tmp_path}/odd dir 100%%/svc/src/bin/run me"'
    assert s["WorkingDirectory"] == f"{tmp_path}/odd dir 100%%/svc/src"
    verify(*paths)


def test_a_program_path_systemd_refuses_is_named_before_writing(tmp_path: Path) -> None:
    # systemd will not run a program whose path holds a quote or a backslash, quoted or not.
    module = service_module(tmp_path / 'it\'s "here"', entry='["bin/run"]')
    (module / "src" / "bin").mkdir()
    (module / "src" / "bin" / "run").write_text("#!/bin/sh\n")
    (module / "src" / "bin" / "run").chmod(0o755)
    with pytest.raises(UnitError, match="quotes, backslashes"):
        service_units([from_source(load_module(module))], node="n", state_dir=tmp_path / "s", out_dir=tmp_path / "u")
    assert not (tmp_path / "u").exists()


def test_an_entry_that_is_not_in_the_bundle_is_named(tmp_path: Path) -> None:
    module = service_module(tmp_path, entry='["bin/missing"]')
    out = tmp_path / "units"
    with pytest.raises(UnitError, match=r"svc/daemon: entry 'bin/missing' is not an executable file"):
        service_units([from_source(load_module(module))], node="n", state_dir=tmp_path / "s", out_dir=out)
    assert not out.exists() or not any(out.iterdir())


def test_a_module_without_service_bundles_writes_nothing() -> None:
    loaded = load_module(REPO / "bundles" / "hello-python")
    assert service_units([from_source(loaded)], node="n", state_dir="/tmp/unused", out_dir="/tmp/unused-units") == []


@pytest.mark.toolchain("c")
def test_a_compiled_service_is_built_from_source_into_the_state_folder(tmp_path: Path) -> None:
    module = tmp_path / "csvc"
    (module / "src").mkdir(parents=True)
    (module / "src" / "main.c").write_text("#include <unistd.h>\nint main(void) { for (;;) pause(); return 0; }\n")
    (module / "module.toml").write_text(
        'name = "csvc"\nversion = "0.1.0"\n\n[[bundle]]\nname = "daemon"\nkind = "service"\n'
        'language = "c"\nsource = "src"\nentry = ["bin/daemon"]\n'
    )
    state = tmp_path / "state"
    # The C toolchain takes the SDK from the project's checkout holding the module: give the
    # module a checkout of its own whose sdk/c is this one.
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "mesh-node"\n')
    (tmp_path / "sdk").mkdir()
    (tmp_path / "sdk" / "c").symlink_to(REPO / "sdk" / "c")
    try:
        placement = build_services(from_source(load_module(module)), state, progress=lambda _: None)
    except ToolchainMissing as e:  # reported as a failure, never skipped: CI installs it
        pytest.fail(f"{e} (run scripts/setup-c.sh)")
    target = state / "from-source" / "csvc" / "daemon"
    assert placement.dirs["daemon"] == target
    paths = service_units([placement], node="n", state_dir=state, out_dir=tmp_path / "units")
    s = dict(settings(paths[0].read_text()))
    assert s["ExecStart"] == str(target / "bin" / "daemon")
    assert s["WorkingDirectory"] == str(target)
    verify(*paths)


def test_node_and_service_units_verify_together(tmp_path: Path) -> None:
    out = tmp_path / "units"
    paths = service_units(
        [from_source(load_module(service_module(tmp_path)))], node="n", state_dir="/var/lib/mesh-node", out_dir=out
    )
    s = dict(settings(paths[0].read_text()))
    assert s["StateDirectory"] == "mesh-node/data/svc"  # systemd makes it, owned by User=
    node = out / NODE_UNIT
    node.write_text(node_unit(meshctl=str(MESHCTL), config=None, name="n", state_dir="/var/lib/mesh-node", user=None))
    verify(node, *paths)


@pytest.fixture
def outside_tmp() -> Iterator[Path]:
    """A scratch folder outside /tmp and /var/tmp (the node's unit refuses folders its PrivateTmp
    would hide): in the checkout, or under the user's home when the checkout is in /tmp."""
    private = (Path("/tmp"), Path("/var/tmp"))
    bases = [REPO / ".cache", Path.home() / ".cache" / "mesh-tests"]
    base = next((b for b in bases if not any(t == b or t in b.parents for t in private)), None)
    if base is None:
        pytest.fail(
            f"no scratch folder outside /tmp and /var/tmp: the checkout and HOME ({Path.home()}) are both in one"
        )
    base.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="units-", dir=base))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_meshctl_node_units_writes_the_units_of_a_manifests_folder(
    outside_tmp: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from runtime.meshctl.cli import main

    assert (
        main(["node", "unit", "--manifests", str(tmp_path), "--state-dir", "/var/lib/m", "--out", str(tmp_path)]) == 1
    )
    assert "is under /tmp: the unit runs with PrivateTmp=true" in capsys.readouterr().err
    tmp_path = outside_tmp
    manifests = tmp_path / "modules"
    service_module(manifests)
    out, state = tmp_path / "units", tmp_path / "state"
    common = ["--name", "node-a", "--state-dir", str(state), "--out", str(out)]
    assert main(["node", "units", "--manifests", str(manifests), *common]) == 0
    assert "wrote" in capsys.readouterr().out
    assert main(["node", "unit", "--manifests", str(manifests), *common]) == 0
    assert sorted(p.name for p in out.iterdir()) == [NODE_UNIT, "mesh-svc-daemon.service"]
    assert f"--manifests {manifests} --name node-a --state-dir {state}" in (out / NODE_UNIT).read_text()
    verify(*sorted(out.iterdir()))
    # A missing modules folder is one clear line, not a traceback.
    assert main(["node", "units", *common]) == 1
    assert capsys.readouterr().err.startswith("meshctl: which modules?")


def test_two_bundles_that_would_share_a_unit_name_are_refused(tmp_path: Path) -> None:
    placements = []
    for module, bundle in (("a-b", "c"), ("a", "b-c")):
        folder = tmp_path / module
        folder.mkdir()
        (folder / "s.py").write_text("")
        (folder / "module.toml").write_text(
            f'name = "{module}"\nversion = "1"\n[[bundle]]\nname = "{bundle}"\nkind = "service"\n'
            'language = "python"\nsource = "."\nentry = ["python", "s.py"]\n'
        )
        placements.append(from_source(load_module(folder)))
    with pytest.raises(UnitError, match=r"a-b/c and a/b-c would both be mesh-a-b-c.service"):
        service_units(placements, node="n", state_dir=tmp_path / "s", out_dir=tmp_path / "u")


@pytest.mark.toolchain("go")
def test_the_node_writes_hello_services_unit_as_meshctl_node_units_does(tmp_path: Path) -> None:
    """The unit a node under systemd writes for a service bundle (runtime/hosting/services.py) is the one
    `meshctl node units` writes, and systemd reads it clean. Starting it needs systemd as PID 1:
    tests/test_services.py says when that could not run."""
    from runtime.config import NodeConfig, ServicesConfig
    from runtime.hosting.services import SystemdService

    state = tmp_path / "state"
    placement = from_source(load_module(REPO / "bundles" / "hello-service"))
    [spec] = placement.loaded.module.service_bundles()
    config = NodeConfig(name="n", state_dir=str(state), services=ServicesConfig(unit_dir=str(tmp_path / "units")))
    try:
        text = SystemdService(placement, spec, config).unit_text()
    except ToolchainMissing as e:  # reported as a failure, never skipped: CI installs it
        pytest.fail(f"{e} (run scripts/setup.sh)")
    [written] = service_units([build_services(placement, state)], node="n", state_dir=state, out_dir=tmp_path / "u")
    assert text == written.read_text()
    s = dict(settings(text))
    assert s["ExecStart"] == str(state / "from-source" / "hello-service" / "daemon" / "bin" / "hello-service")
    env = [v for k, v in settings(text) if k == "Environment"]
    assert "HEARTBEAT_INTERVAL_MS=1000" in env and f"MESH_DATA_DIR={state / 'data' / 'hello-service'}" in env
    verify(written)


@pytest.mark.toolchain("go")
def test_a_delivered_service_gets_its_unit_from_the_unpacked_artifact(tmp_path: Path) -> None:
    """Delivered, a compiled service is not built again: the unit runs the artifact's binary."""
    from runtime.config import NodeConfig, ServicesConfig
    from runtime.hosting.placement import Placement
    from runtime.hosting.services import SystemdService
    from toolchains.build import build_module
    from toolchains.verify import verify_and_unpack

    try:
        [artifact] = build_module(REPO / "bundles" / "hello-service", tmp_path / "out", progress=lambda _: None)
    except ToolchainMissing as e:
        pytest.fail(f"{e} (run scripts/setup.sh)")
    unpacked = tmp_path / "bundles" / "hello-service" / "0.1.0" / "daemon"
    meta = verify_and_unpack(artifact, unpacked)
    module_dir = tmp_path / "module"
    module_dir.mkdir()
    (module_dir / "module.toml").write_text(meta.manifest)
    placement = Placement(load_module(module_dir), {"daemon": unpacked}, {"daemon": dict(meta.env)})
    state = tmp_path / "state"
    config = NodeConfig(name="n", state_dir=str(state), services=ServicesConfig(unit_dir=str(tmp_path / "units")))
    [spec] = placement.loaded.module.service_bundles()
    unit = tmp_path / "mesh-hello-service-daemon.service"
    unit.write_text(SystemdService(placement, spec, config).unit_text())
    s = dict(settings(unit.read_text()))
    assert s["ExecStart"] == str(unpacked / "bin" / "hello-service") and s["WorkingDirectory"] == str(unpacked)
    assert not (state / "from-source").exists()
    verify(unit)
