"""The in-process node tier: one nats-server for the session, an account of its own per test."""

from __future__ import annotations

from pathlib import Path
from typing import AsyncIterator, Iterator

import pytest

from tests.support.fake_child import Script, script  # noqa: F401 (the fixture every node test uses)
from tests.support.inproc import AccountsServer, Mesh, mesh


@pytest.fixture(scope="session")
def accounts_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AccountsServer]:
    server = AccountsServer(tmp_path_factory.mktemp("bus")).start()
    yield server
    server.stop()


@pytest.fixture
async def m(tmp_path: Path, accounts_server: AccountsServer, script: Script) -> AsyncIterator[Mesh]:  # noqa: F811
    async with mesh(tmp_path, accounts_server.account()) as running:
        yield running
