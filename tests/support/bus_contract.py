"""The call contract's fixture tools (tests/support/call_contract.py) reached over the bus through a
real node (docs/bus.md): Mesh-Progress frames come from the SDK's progress helper in order, and a
bus cancel reaches the handler's cancel (its `wait_cancel` marker says "cancelled").
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Callable

import anyio

from runtime.client import MeshClient
from runtime.wire.callproto import ProgressFrame
from tests.support.mesh import NodeProcess, client, wait_state


def fixture_module(
    root: Path,
    name: str,
    entry: list[str],
    program: Path | None = None,
    write: list[Path] | None = None,
    read: list[Path] | None = None,
) -> Path:
    """A module folder serving an SDK's contract fixture as it is (already built: no build step,
    which is what language "python" means to a node serving from source). A compiled `program` is
    copied into the folder (an entry must be inside its bundle) and run as the entry.

    The child is confined: a script named by absolute path lives outside its bundle folder, so its
    folder is declared readable, as is `read` (what the script imports from around it); `write`:
    the folders the fixture writes for the test (a marker)."""
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    if program is not None:
        shutil.copy2(program, folder / program.name)
        entry = [program.name]
    scripts = {str(Path(a).parent) for a in entry[1:] if a.startswith("/") and Path(a).is_file()}
    readable = sorted(scripts | {str(r) for r in read or []})
    (folder / "module.toml").write_text(
        f'name = "{name}"\nversion = "0.1.0"\n\n[[bundle]]\nname = "tools"\nkind = "tools"\nlanguage = "python"\n'
        f'source = "."\nentry = {json.dumps(entry)}\ntimeout_ms = 20000\n'
        f"read = {json.dumps(readable)}\nwrite = {json.dumps(sorted(str(w) for w in write or []))}\n"
    )
    return root


async def check_progress_and_cancel_over_the_bus(
    node_factory: Callable[..., NodeProcess],
    root: Path,
    entry: list[str],
    marker: Path,
    program: Path | None = None,
    read: list[Path] | None = None,
) -> None:
    node = node_factory(fixture_module(root, "fixture", entry, program, write=[marker.parent], read=read))
    nc = await client(node.bus_url())
    await wait_state(nc, node.name, "fixture/tools", "ready")
    caller = MeshClient(nc)
    seen: list[ProgressFrame] = []
    result = json.loads(await caller.call("mesh.tool.fixture.count", {"steps": 5}, on_progress=seen.append))
    assert result["content"][0]["text"] == "counted 5"
    assert [(f.progress, f.total, f.message) for f in seen] == [(i, 5, f"step {i}") for i in range(1, 6)]
    with anyio.move_on_after(15):
        async with anyio.create_task_group() as tg:
            tg.start_soon(caller.call, "mesh.tool.fixture.wait_cancel", {"marker": str(marker)})
            while "started" not in (marker.read_text() if marker.exists() else ""):
                await anyio.sleep(0.01)
            tg.cancel_scope.cancel()  # the client library publishes mesh.cancel.<id>
    deadline = time.monotonic() + 5
    while "cancelled" not in marker.read_text() and time.monotonic() < deadline:
        await anyio.sleep(0.01)
    assert marker.read_text().split() == ["started", "cancelled"]
    await caller.close()
    await nc.close()
