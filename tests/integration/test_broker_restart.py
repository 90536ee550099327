"""The broker restarts under load (a private one per test: embedded NATS with its file store,
a RabbitMQ node): the publisher and clients reconnect by themselves, say so in their logs,
and the validator counts 0 lost and 0 reordered."""

from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.conftest import BROKERS
from tests.support.processes import cli, under_load

from lbg.devstack.brokers import LOCAL_BROKERS, BrokerEndpoint, local_broker
from lbg.devstack.deployment import LocalDeployment

LOAD_SECONDS = 4.0


@pytest.fixture(params=[kind for kind in BROKERS if kind in LOCAL_BROKERS])
def private_broker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BrokerEndpoint]:
    """A broker of its own, which the test may restart without disturbing other tests."""
    with local_broker(request.param, tmp_path / "broker") as endpoint:
        yield endpoint


def test_a_broker_restart_under_load_loses_and_reorders_nothing(
    private_broker: BrokerEndpoint, tmp_path: Path
) -> None:
    endpoint = private_broker
    assert endpoint.restart is not None
    cli("cg-admin", "--broker-url", endpoint.url, *endpoint.admin_args(), "create",
        "--group", "restart", "--hash-count", "16", "--queue-count", "4")  # fmt: skip
    local = LocalDeployment(
        endpoint.url, "restart", tmp_path / "daemons", admin_url=endpoint.admin_url
    )
    report = under_load(local, endpoint.restart, LOAD_SECONDS)

    assert report["lost"] == 0
    assert report["reordered"] == 0
    assert report["unique"] == report["published"] > 400
    for name in ("pub", "client-a", "client-b"):
        log = local.daemons[name].log_path.read_text()
        assert "reconnected to the broker" in log, name
        assert "Traceback" not in log, name
