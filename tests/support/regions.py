"""Test support: NATS clusters on 127.0.0.1 joined by gateways (a supercluster), JetStream one domain.

Each cluster is one server here (a route to itself satisfies JetStream's clustered mode), with a
gateway to every other cluster; the JetStream meta group spans them all, so a bucket made in one
cluster is read and written from every other, over the gateways.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import nats

from runtime.bus.embedded import free_port
from tests.faults.security_support import ConfiguredServer


class Supercluster:
    def __init__(self, root: Path, clusters: tuple[str, ...] = ("east", "west")) -> None:
        self.root, self.clusters = root, clusters
        self.route_ports = {c: free_port() for c in clusters}
        self.gateway_ports = {c: free_port() for c in clusters}
        self.servers: dict[str, ConfiguredServer] = {}

    def url(self, cluster: str) -> str:
        return self.servers[cluster].url

    def start(self) -> Supercluster:
        for c in self.clusters:
            gateways = ", ".join(
                f'{{ name: {other}, urls: ["nats://127.0.0.1:{self.gateway_ports[other]}"] }}'
                for other in self.clusters
                if other != c
            )
            route = f"nats://127.0.0.1:{self.route_ports[c]}"
            body = (
                f"server_name: {c}-1\n"
                f"cluster {{ name: {c}, listen: 127.0.0.1:{self.route_ports[c]}, routes: [{json.dumps(route)}] }}\n"
                f"gateway {{ name: {c}, listen: 127.0.0.1:{self.gateway_ports[c]}, gateways: [ {gateways} ] }}\n"
            )
            self.servers[c] = ConfiguredServer(self.root / c, body).start()
        return self

    async def wait_jetstream(self, timeout: float = 60) -> None:
        """Until every cluster's JetStream answers (its meta leader elected across the gateways)."""
        deadline = time.monotonic() + timeout
        for c in self.clusters:
            nc = await nats.connect(self.url(c))
            try:
                while True:
                    try:
                        await nc.jetstream().account_info()
                        break
                    except Exception as e:  # no meta leader yet: JetStream answers once there is one
                        if time.monotonic() > deadline:
                            raise AssertionError(
                                f"JetStream of cluster {c} did not answer within {timeout} s: {e}"
                            ) from None
                        await asyncio.sleep(0.2)
            finally:
                await nc.close()

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop()
