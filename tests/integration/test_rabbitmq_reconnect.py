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


def drop_connections(rabbitmq: BrokerEndpoint, names: set[str]) -> int:
    """Close, through the management API, the connections the named clients opened."""
    url = urllib.parse.urlsplit(rabbitmq.url)
    auth = (urllib.parse.unquote(url.username or ""), urllib.parse.unquote(url.password or ""))
    with httpx.Client(base_url=f"{rabbitmq.admin_url}/api", auth=auth, trust_env=False) as api:
        dropped = 0
        for connection in api.get("/connections").raise_for_status().json():
            if connection["client_properties"].get("connection_name") in names:
                path = "/connections/" + urllib.parse.quote(connection["name"], safe="")
                api.delete(path).raise_for_status()
                dropped += 1
    return dropped


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
    assert drop_connections(rabbitmq, {"client-a", "client-b"}) == 2

    assert publisher.wait(60) == 0, publisher.log_tail()
    report = validate()

    assert report["lost"] == 0
    assert report["reordered"] == 0
    assert report["unique"] == report["published"]
    logs = "".join(d.log_path.read_text() for n, d in deployment.daemons.items() if "client" in n)
    assert "reconnected to the broker" in logs
