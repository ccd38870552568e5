from __future__ import annotations

import itertools
from pathlib import Path
from typing import Iterator

import pytest

from tests.support.mesh import NatsServer, NodeProcess

_names = itertools.count()


@pytest.fixture
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    # One bus per test: seat leases and homes are mesh-wide state that must not leak between tests.
    server = NatsServer(tmp_path_factory.mktemp("nats")).start()
    yield server
    server.stop()


@pytest.fixture
def node_factory(tmp_path: Path, nats_server: NatsServer) -> Iterator:
    """Start nodes on the shared bus (or another); every one is ended after the test."""
    nodes: list[NodeProcess] = []

    def start(manifests: Path, *, url: str | None = "default", name: str | None = None, **kw) -> NodeProcess:
        node = NodeProcess(
            tmp_path,
            manifests,
            nats_server.url if url == "default" else url,
            name or f"t{next(_names)}-{tmp_path.name[-12:].replace('_', '-').lower()}",
            **kw,
        )
        nodes.append(node)
        node.wait_log("serving on")
        return node

    yield start
    for node in nodes:
        node.kill()
