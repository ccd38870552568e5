"""Record 0188's "Live" row: every hello-<language> bundle, built by its toolchain, delivered
over JetStream to a fresh node on its embedded bus, answers its tool over the bus."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.support.mesh import MESHCTL, ROOT

pytestmark = pytest.mark.slow

LANGUAGES = ("c", "go", "python", "rust", "typescript")


def test_meshctl_smoke_every_language_answers() -> None:
    env = dict(os.environ)
    env.setdefault("MESH_TOOLCHAIN_CACHE", str(ROOT / ".cache" / "toolchains"))
    r = subprocess.run([*MESHCTL, "smoke"], cwd=ROOT, capture_output=True, text=True, timeout=1500, env=env)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    rows = [line.split() for line in r.stdout.splitlines() if line.split()[:1] and line.split()[0] in LANGUAGES]
    assert sorted(row[0] for row in rows) == sorted(LANGUAGES), r.stdout
    for row in rows:
        language, module = row[0], row[1]
        assert module == f"hello-{language}"
        assert "Hello, mesh!" in " ".join(row), row
        assert row[-1] == "ms"
    # hello-service has no tool: the node runs it (supervised here: no systemd), and it stays up.
    services = [line.split() for line in r.stdout.splitlines() if line.startswith("hello-service/daemon")]
    assert services and services[0][1] == "go" and services[0][3] == "running", r.stdout
    assert "smoke: every tool answered, every service runs" in r.stdout
