"""RabbitMQ only: the broker drops every client connection under load (as a node restart or a
network cut would); the clients reconnect by themselves and nothing is lost or reordered."""

import os
import time
import urllib.parse

import httpx
import pytest

from lbg.devstack.brokers import BrokerEndpoint
from lbg.devstack.deployment import LocalDeployment

pytestmark = pytest.mark.skipif(
    "rabbitmq" not in os.environ.get("LBG_TEST_BROKERS", "nats,rabbitmq"),
    reason="RabbitMQ is not among LBG_TEST_BROKERS",
)


def drop_connections(rabbitmq: BrokerEndpoint, names: set[str], timeout: float = 30.0) -> list[str]:
    """Close, through the management API, every connection the named clients opened (their
    queues' and their heartbeats'), once every name has one listed (a client starting on a
    busy machine connects late); the connections' names."""
    url = urllib.parse.urlsplit(rabbitmq.url)
    auth = (urllib.parse.unquote(url.username or ""), urllib.parse.unquote(url.password or ""))
    deadline = time.monotonic() + timeout
    with httpx.Client(base_url=f"{rabbitmq.admin_url}/api", auth=auth, trust_env=False) as api:
        while True:
            ours = [
                connection
                for connection in api.get("/connections").raise_for_status().json()
                if _client(connection) in names
            ]
            listed = {_client(c) for c in ours}
            if listed == names or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        for connection in ours:
            path = "/connections/" + urllib.parse.quote(connection["name"], safe="")
            api.delete(path).raise_for_status()
    return sorted(c["client_properties"]["connection_name"] for c in ours)


def _client(connection: dict) -> str:
    """The client a connection belongs to: its name's first word ("client-a heartbeats")."""
    return str(connection["client_properties"].get("connection_name", "")).partition(" ")[0]


def test_clients_reconnect_after_the_broker_drops_them(
    rabbitmq: BrokerEndpoint, make_group, deployment: LocalDeployment, validate, broker
) -> None:
    if broker.kind != "rabbitmq":
        pytest.skip("drops RabbitMQ connections")
    make_group()
    for name in ("client-a", "client-b"):
        deployment.start(name, "lbg-client", "--id", name)
    time.sleep(2)
    publisher = deployment.start_publisher(
        "pub", "--keys", "50", "--rate", "300", "--duration", "10"
    )
    time.sleep(4)
    # Each client's heartbeats have a connection of their own, never queued behind its queues'.
    assert drop_connections(rabbitmq, {"client-a", "client-b"}) == [
        "client-a",
        "client-a heartbeats",
        "client-b",
        "client-b heartbeats",
    ]

    assert publisher.wait(60) == 0, publisher.log_tail()
    report = validate()

    assert report["lost"] == 0
    assert report["reordered"] == 0
    assert report["unique"] == report["published"]
    logs = "".join(d.log_path.read_text() for n, d in deployment.daemons.items() if "client" in n)
    assert "reconnected to the broker" in logs
