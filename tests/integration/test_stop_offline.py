"""A client told to stop while its broker is unreachable exits in bounded time: it hands over
what it can and leaves the rest to the broker (what it had not acked is delivered again),
rather than waiting for a connection that may never come back (seen on RabbitMQ: "leaving"
logged, the process still retrying its connection 20 minutes later)."""

import signal
import time

from tests.integration.test_dynamic import log_of, member, wait_for
from tests.support.partition import Partition

from lbg.devstack.brokers import BrokerEndpoint
from lbg.devstack.deployment import LocalDeployment

# The leave's heartbeat and the handover each give up after a bounded wait, well inside
# systemd's default stop timeout (90 s).
STOP_WITHIN = 20.0


def test_a_client_cut_off_from_its_broker_stops_on_sigterm(
    broker: BrokerEndpoint, make_group, deployment: LocalDeployment
) -> None:
    make_group()
    partition = Partition(broker.url)
    closed = False
    try:
        client = member(deployment, "client-a", "--broker-url", partition.url)
        wait_for(lambda: " joined" in log_of(deployment, "client-a"), 30, "client-a never joined")
        partition.close()  # its connections drop, new ones are refused
        closed = True
        time.sleep(2.0)
        client.send(signal.SIGTERM)
        code = client.wait(STOP_WITHIN)
        assert code == 0, f"not stopped {STOP_WITHIN:g} s after SIGTERM:\n{client.log_tail(30)}"
        assert "Traceback" not in client.log_path.read_text(), client.log_tail(60)
    finally:
        if not closed:
            partition.close()
