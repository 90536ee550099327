"""A JetStream cluster on loopback: several nats-server processes routed to each other.

For the node-loss tests and soak: the group's streams and consumers are replicated over the
nodes, so killing the node that leads a queue's consumer must lose nothing. Each node is an
EmbeddedNats with its own store, client port and cluster port.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import nats

from lbg.devstack.embedded import BrokerStartError, EmbeddedNats, free_port

CLUSTER_NAME = "lbg"
POLL_SECONDS = 0.2


class LocalNatsCluster:
    """`size` routed nats-server nodes named n0, n1, ...; `url` lists every node's address."""

    def __init__(self, data_dir: str | Path, size: int = 3) -> None:
        if size < 1:
            raise ValueError(f"a cluster needs at least one node, got {size}")
        folder = Path(data_dir).absolute()
        cluster_ports = [free_port() for _ in range(size)]
        routes = ",".join(f"nats://127.0.0.1:{port}" for port in cluster_ports)
        self.nodes = [
            EmbeddedNats(
                folder / f"n{index}",
                port=free_port(),
                extra_args=(
                    *("--name", f"n{index}", "--cluster_name", CLUSTER_NAME),
                    *("--cluster", f"nats://127.0.0.1:{cluster_ports[index]}"),
                    *("--routes", routes),
                ),
            )
            for index in range(size)
        ]

    @property
    def url(self) -> str:
        """Every node's client URL, comma-separated: clients fail over between them."""
        return ",".join(node.url for node in self.nodes)

    def node(self, name: str) -> EmbeddedNats:
        """The node with server name `name` (n0, n1, ...)."""
        return self.nodes[int(name.removeprefix("n"))]

    def start(self, timeout: float = 30.0) -> str:
        """Start every node and wait until JetStream has a meta leader; return `url`."""
        for node in self.nodes:
            node.start(timeout)
        self.wait_ready(timeout)
        return self.url

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Wait until every running node reports itself healthy (JetStream current) and
        answers a JetStream API request: /healthz can pass before, and a stream created then
        found no responders (test_nats_cluster, once)."""
        deadline = time.monotonic() + timeout
        while not self._ready():
            if time.monotonic() >= deadline:
                raise BrokerStartError(f"NATS cluster not healthy after {timeout:g} s")
            time.sleep(POLL_SECONDS)

    def _ready(self) -> bool:
        running = [node for node in self.nodes if node.running]
        return all(node.healthy() for node in running) and asyncio.run(
            _jetstream_answers([node.url for node in running])
        )

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


async def _jetstream_answers(urls: list[str]) -> bool:
    """Whether the JetStream API answers without an error through each of `urls`."""
    for url in urls:
        try:
            nc = await nats.connect(url, connect_timeout=1, allow_reconnect=False)
        except Exception:  # nats-py raises several kinds while a server starts
            return False
        try:
            reply = await nc.request("$JS.API.INFO", b"", timeout=1.0)
        except Exception:
            return False
        finally:
            await nc.close()
        if b'"error"' in reply.data:
            return False
    return True
