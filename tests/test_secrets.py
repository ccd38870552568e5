"""Secrets from the node's secrets file: one bundle's environment only, a file others can read is refused."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from runtime.hosting.secrets import SecretsError, bundle_secrets
from tests.support.mesh import FAST_CONFIG, call, client, make_module, wait_state
from toolchains.artifact import ArtifactMeta, platform_problem


def write(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


def test_a_bundles_table_is_its_secrets_and_no_other_bundles(tmp_path: Path) -> None:
    path = write(tmp_path / "s.toml", '["a/tools"]\nKEY = "one"\n["b/tools"]\nKEY = "two"\n')
    assert bundle_secrets(path, "a", "tools") == {"KEY": "one"}
    assert bundle_secrets(path, "c", "tools") == {}


@pytest.mark.parametrize(
    ("text", "mode", "said"),
    [
        ('["a/tools"]\nKEY = "v"\n', 0o644, "chmod 600"),
        ('["a/tools"]\nMESH_NODE = "v"\n', 0o600, "MESH_NODE"),
        ('["a/tools"]\nKEY = 3\n', 0o600, "is not a string"),
        ('["a/tools"]\nKEY = "sekrit\n', 0o600, "not valid TOML"),
    ],
)
def test_an_untrustworthy_or_broken_file_is_refused_without_quoting_a_value(
    tmp_path: Path, text: str, mode: int, said: str
) -> None:
    path = write(tmp_path / "s.toml", text, mode)
    with pytest.raises(SecretsError, match=said) as e:
        bundle_secrets(path, "a", "tools")
    assert "sekrit" not in str(e.value) and '"v"' not in str(e.value)


def test_a_bundle_built_for_another_python_or_platform_is_refused_by_name() -> None:
    here = f"cp{sys.version_info.major}{sys.version_info.minor}"
    base = dict(module="m", bundle="tools", version="1", kind="tools", language="python", entry=["python", "x.py"])
    assert platform_problem(ArtifactMeta(**base, python_abi=here, os="linux", arch="amd64")) is None  # type: ignore[arg-type]
    other = platform_problem(ArtifactMeta(**base, python_abi="cp399"))  # type: ignore[arg-type]
    assert other is not None and "cp399" in other and here in other
    arm = platform_problem(ArtifactMeta(**base, os="linux", arch="riscv64"))  # type: ignore[arg-type]
    assert arm is not None and "riscv64" in arm


async def test_secrets_reach_their_bundle_only_and_an_open_file_gives_none(tmp_path: Path, node_factory) -> None:
    secrets = write(tmp_path / "secrets.toml", '["keyed/tools"]\nAPI_KEY = "k-123-secret"\n')
    make_module(tmp_path / "mods", "keyed")
    make_module(tmp_path / "mods", "plain")
    node = node_factory(tmp_path / "mods", config=f'secrets = "{secrets}"\n' + FAST_CONFIG)
    nc = await client(node.bus_url())
    for module in ("keyed", "plain"):
        await wait_state(nc, node.name, f"{module}/tools", "ready")
    code, keyed = await call(nc, "mesh.tool.keyed.env", {})
    code2, plain = await call(nc, "mesh.tool.plain.env", {})
    assert code == code2 == 200
    assert keyed["structuredContent"]["API_KEY"] == "k-123-secret"
    assert "API_KEY" not in plain["structuredContent"]
    assert "k-123-secret" not in node.log()
    await nc.close()
    node.terminate()  # the next node alone serves `keyed` (one queue group on the shared bus)
    secrets.chmod(0o644)  # now every user could read it: refused, named, and no bundle gets it
    other = node_factory(tmp_path / "mods", config=f'secrets = "{secrets}"\n' + FAST_CONFIG)
    nc = await client(other.bus_url())
    await wait_state(nc, other.name, "keyed/tools", "ready")
    code, keyed = await call(nc, "mesh.tool.keyed.env", {})
    assert code == 200 and "API_KEY" not in keyed["structuredContent"]
    assert "chmod 600" in other.log() and "k-123-secret" not in other.log()
    await nc.close()
