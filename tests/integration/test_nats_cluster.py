"""Broker node loss: a 3-node NATS cluster on loopback, the group replicated x3 (RF 3); the
node that leads a queue's consumer is killed (-9) under load, and nothing is lost or
reordered. The clustered-broker row of the WSO2 seed, on an existing distributed engine."""

import asyncio
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest
from tests.support.processes import cli, parked_lines, under_load

from lbg.broker.nats import jsapi
from lbg.broker.nats.adapter import consumer_name, events_stream
from lbg.devstack.deployment import LocalDeployment
from lbg.devstack.nats_cluster import LocalNatsCluster

GROUP = "ha"
# A new stream or consumer leader takes a few seconds to be elected; publishers retry meanwhile,
# so the load goes on long enough after the kill to publish well past that.
LOAD_SECONDS = 8.0


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalNatsCluster]:
    nodes = LocalNatsCluster(tmp_path / "cluster", size=3)
    nodes.start()
    yield nodes
    nodes.stop()


async def consumer_cluster(url: str, queue: int) -> dict:
    """The cluster section of a queue's consumer info: its leader and replicas."""
    nc = await nats.connect(servers=url.split(","))
    try:
        info = await jsapi.consumer_info(nc, events_stream(GROUP), consumer_name(queue))
    finally:
        await nc.close()
    return info["cluster"]


def test_killing_the_leader_of_a_queue_loses_and_reorders_nothing(
    cluster: LocalNatsCluster, tmp_path: Path
) -> None:
    cli("cg-admin", "--broker-url", cluster.url, "create", "--group", GROUP,
        "--hash-count", "16", "--queue-count", "4", "--replicas", "3")  # fmt: skip
    placement = asyncio.run(consumer_cluster(cluster.url, 0))
    assert len(placement.get("replicas", [])) == 2, placement  # the leader plus two followers
    local = LocalDeployment(cluster.url, GROUP, tmp_path / "daemons")
    killed: list[str] = []

    def kill_the_leader() -> None:
        killed.append(asyncio.run(consumer_cluster(cluster.url, 0))["leader"])
        cluster.node(killed[0]).kill()

    report = under_load(local, kill_the_leader, LOAD_SECONDS)
    assert asyncio.run(consumer_cluster(cluster.url, 0))["leader"] != killed[0]

    assert report["lost"] == 0
    assert report["reordered"] == 0
    assert report["unique"] == report["published"] > 400, (report, parked_lines(local)[:5])
