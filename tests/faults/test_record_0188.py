"""Record 0188 (a module's own code is bundles, never an image) is enforced where code enters the
mesh, not only by `meshctl module check`: `bundle build`, `bundle deliver`, and the node, both for
modules served from source and for delivered ones.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import nats
import pytest

from tests.faults.conftest import meshctl
from tests.faults.delivery_support import (
    manifest_text,
    module_ref,
    put_membership,
    upload,
    wait_problem,
    write_artifact,
)
from tests.support.mesh import RAW_CHILD, call, client, make_module, wait_state
from toolchains.artifact import ArtifactRefused, read_meta

OWN_IMAGE = '\n[[artifact]]\nkind = "image"\nref = "example/own:1"\nbuild = "."\n'


def _image_module(root: Path, name: str = "boxed") -> Path:
    folder = root / name
    (folder / "src").mkdir(parents=True)
    shutil.copy(RAW_CHILD, folder / "src" / "raw_child.py")
    (folder / "module.toml").write_text(manifest_text(name, "1.0.0", extra=OWN_IMAGE))
    return folder


def test_bundle_build_refuses_an_own_code_image_naming_0188_the_file_and_the_field(tmp_path: Path) -> None:
    folder = _image_module(tmp_path / "mods")
    r = meshctl("bundle", "build", str(folder), "--out", str(tmp_path / "out"))
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    assert "record 0188" in r.stderr and "module.toml" in r.stderr and "artifact[0].build" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert not list((tmp_path / "out").glob("*.tar.gz")) if (tmp_path / "out").exists() else True


def test_bundle_deliver_refuses_an_artifact_whose_manifest_has_an_own_code_image(tmp_path: Path, nats_server) -> None:
    artifact = write_artifact(
        tmp_path / "out" / "boxed.tar.gz", "boxed", "1.0.0", manifest=manifest_text("boxed", "1.0.0", extra=OWN_IMAGE)
    )
    r = meshctl("bundle", "deliver", str(artifact), "--node", "n0188", "--nats", nats_server.url)
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    assert "record 0188" in r.stderr and "module.toml" in r.stderr and "artifact[0].build" in r.stderr, r.stderr
    assert "uploaded" not in r.stdout


def test_a_bundle_json_with_an_image_field_is_refused_naming_0188(tmp_path: Path, nats_server) -> None:
    artifact = write_artifact(tmp_path / "out" / "img.tar.gz", "img", "1.0.0", meta_extra={"image": "example/own:1"})
    with pytest.raises(ArtifactRefused) as refused:
        read_meta(artifact)
    assert "record 0188" in str(refused.value) and "image" in str(refused.value), refused.value
    r = meshctl("bundle", "deliver", str(artifact), "--node", "n0188", "--nats", nats_server.url)
    assert r.returncode == 1 and "record 0188" in r.stderr, r.stderr


async def test_the_node_refuses_an_own_code_image_from_source_and_delivered(
    tmp_path: Path, node_factory, nats_server
) -> None:
    mods = tmp_path / "mods"
    make_module(mods, "plain")
    _image_module(mods)
    node = node_factory(mods)
    nc = await client(nats_server.url)
    await wait_state(nc, node.name, "plain/tools", "ready")
    problem = await wait_problem(nc, node.name, "record 0188", "artifact[0].build")
    assert "boxed" in problem and "module.toml" in problem, problem
    with pytest.raises(nats.errors.NoRespondersError):  # never served: nobody answers its subjects
        await call(nc, "mesh.tool.boxed.echo", {}, timeout=2)
    # Delivered, written straight into KV (deliver itself refuses it): refused by the node too.
    artifact = write_artifact(
        tmp_path / "out" / "boxed2.tar.gz",
        "boxed2",
        "1.0.0",
        manifest=manifest_text("boxed2", "1.0.0", extra=OWN_IMAGE),
    )
    await put_membership(nc, node.name, {"boxed2": module_ref("1.0.0", {"tools": await upload(nc, artifact)})})
    problem = await wait_problem(nc, node.name, "boxed2", "refused", "record 0188")
    assert "artifact[0].build" in problem, problem
    with pytest.raises(nats.errors.NoRespondersError):
        await call(nc, "mesh.tool.boxed2.echo", {}, timeout=2)
    code, _ = await call(nc, "mesh.tool.plain.echo", {})
    assert code == 200
    await nc.close()
