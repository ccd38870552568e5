"""`/metrics` of a real node: scraped over HTTP, parsed with prometheus_client's own parser."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import anyio
from prometheus_client.parser import text_string_to_metric_families

from runtime.config import MetricsConfig
from tests.support.fake_child import Behaviour, Script, echo
from tests.support.inproc import Mesh, module_folder


def _failing(tool: str, arguments: dict[str, Any]) -> Any:
    return {"content": [{"type": "text", "text": "no"}], "isError": True} if tool == "fail" else echo(tool, arguments)


def _get(url: str, method: str = "GET") -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=5) as reply:
            return reply.status, reply.headers["Content-Type"], reply.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read().decode()


async def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    status, kind, text = await anyio.to_thread.run_sync(_get, f"http://127.0.0.1:{port}/metrics")
    assert status == 200 and kind.startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def test_a_scrape_counts_the_calls_made_by_code_and_keeps_unknown_subjects_in_one_series(
    tmp_path: Path, m: Mesh, script: Script
) -> None:
    script.modules["alpha"] = [Behaviour(tools=("greet", "fail"), answer=_failing)]
    script.modules["broken"] = [Behaviour(unstartable=True)]
    node = await m.start(
        "n1",
        module_folder(tmp_path, "alpha"),
        module_folder(tmp_path, "broken"),
        metrics=MetricsConfig(listen="127.0.0.1:0"),
    )
    assert node.metrics is not None
    await m.bundle_state("n1", "broken/tools", "failed")
    for _ in range(3):
        assert (await m.call("mesh.tool.alpha.greet", {}))[1] is None
    assert (await m.call("mesh.tool.alpha.fail", {}))[0]["isError"] is True
    assert (await m.call("mesh.tool.alpha.nope", {}))[1] == "404"
    assert (await m.call("mesh.tool.broken.greet", {}))[1] == "503"
    for i in range(5):  # subjects a caller makes up: none may become a series of its own
        assert (await m.call(f"mesh.tool.alpha.made-up-{i}", {}))[1] == "404"

    got = await scrape(node.metrics.port)
    calls = {labels: v for (name, labels), v in got.items() if name == "mesh_calls_total"}
    assert calls[(("code", "ok"), ("subject", "mesh.tool.alpha.greet"))] == 3
    assert calls[(("code", "tool_error"), ("subject", "mesh.tool.alpha.fail"))] == 1
    # a 404 for a module's unknown tool and the broken bundle's 503 have no route either: "other"
    assert calls[(("code", "404"), ("subject", "other"))] == 6
    assert calls[(("code", "503"), ("subject", "other"))] == 1
    assert {dict(labels)["subject"] for labels in calls} == {"mesh.tool.alpha.greet", "mesh.tool.alpha.fail", "other"}
    count = got[("mesh_call_duration_seconds_count", (("subject", "mesh.tool.alpha.greet"),))]
    assert count == 3
    assert got[("mesh_bundle_up", (("bundle", "alpha/tools"),))] == 1
    assert got[("mesh_bundle_up", (("bundle", "broken/tools"),))] == 0
    assert got[("mesh_bundle_state", (("bundle", "broken/tools"), ("state", "failed")))] == 1
    assert got[("mesh_bundle_state", (("bundle", "broken/tools"), ("state", "ready")))] == 0
    assert got[("mesh_bundle_restarts_total", (("bundle", "broken/tools"),))] >= 3
    assert got[("process_resident_memory_bytes", ())] > 0


async def test_a_killed_childs_restart_is_counted(tmp_path: Path, m: Mesh, script: Script) -> None:
    node = await m.start("n1", module_folder(tmp_path, "alpha"), metrics=MetricsConfig(listen="127.0.0.1:0"))
    assert node.metrics is not None
    before = (await scrape(node.metrics.port))[("mesh_bundle_restarts_total", (("bundle", "alpha/tools"),))]
    script.started[-1].kill()
    with anyio.fail_after(5):
        while (await m.status("n1")).bundle("alpha/tools").restarts == 0:  # type: ignore[union-attr]
            await anyio.sleep(0.01)
    await m.bundle_state("n1", "alpha/tools", "ready")
    after = (await scrape(node.metrics.port))[("mesh_bundle_restarts_total", (("bundle", "alpha/tools"),))]
    assert (before, after) == (0, 1)


async def test_only_get_metrics_is_served(tmp_path: Path, m: Mesh) -> None:
    node = await m.start("n1", module_folder(tmp_path, "alpha"), metrics=MetricsConfig(listen="127.0.0.1:0"))
    assert node.metrics is not None
    base = f"http://127.0.0.1:{node.metrics.port}"
    assert (await anyio.to_thread.run_sync(_get, f"{base}/"))[0] == 404
    assert (await anyio.to_thread.run_sync(_get, f"{base}/metrics", "POST"))[0] == 405


async def test_every_metric_the_dashboard_draws_is_one_the_node_serves(tmp_path: Path, m: Mesh, script: Script) -> None:
    import json
    import re

    dashboard = json.loads((Path(__file__).resolve().parents[2] / "docs" / "grafana" / "mesh-nodes.json").read_text())
    drawn = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"\b((?:mesh|process)_[a-z_]+)\{", target["expr"])
    }
    node = await m.start("n1", module_folder(tmp_path, "alpha"), metrics=MetricsConfig(listen="127.0.0.1:0"))
    assert node.metrics is not None
    await m.call("mesh.tool.alpha.greet", {})
    _, _, text = await anyio.to_thread.run_sync(_get, f"http://127.0.0.1:{node.metrics.port}/metrics")
    # Every family the node describes, with its samples' names (a seat or a delivery may have none yet).
    served: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            served |= {name, f"{name}_total"} if kind == "counter" else {name}
            if kind == "histogram":
                served |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    assert drawn - served == set(), f"the dashboard draws metrics no node serves: {sorted(drawn - served)}"
    assert len(drawn) >= 12
