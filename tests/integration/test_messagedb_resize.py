"""Resizing a Message DB group at run time, under load: old members drain up to the switch
position, new ones start after them, running clients follow the new size, and the validator
finds nothing lost or reordered."""

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import orjson
import pytest
from tests.support.processes import cli, resizable_group, run_validator, wait_for_log

from lbg.broker.messagedb import generations
from lbg.devstack.brokers import BrokerEndpoint
from lbg.devstack.deployment import LocalDeployment


@pytest.fixture
def group(messagedb: BrokerEndpoint) -> Iterator[str]:
    with resizable_group(messagedb.url, 2) as name:
        yield name


@pytest.fixture
def deployment(messagedb: BrokerEndpoint, group: str, tmp_path: Path) -> Iterator[LocalDeployment]:
    local = LocalDeployment(messagedb.url, group, tmp_path / "daemons")
    yield local
    local.stop_all()


def _members_that_read(url: str, group: str) -> dict[tuple[int, int], int]:
    """(generation, member) -> recorded position, for every position stream written."""

    async def read() -> dict[tuple[int, int], int]:
        conn = await asyncpg.connect(url, server_settings={"search_path": "message_store,public"})
        try:
            history = await generations.load(conn, group)
            found = {}
            for generation in history:
                for member in range(generation.size):
                    stream = generations.position_stream(group, member, generation.index)
                    row = await conn.fetchrow(
                        "SELECT data FROM get_last_stream_message($1)", stream
                    )
                    if row is not None:
                        found[generation.index, member] = orjson.loads(row["data"])["position"]
            return found
        finally:
            await conn.close()

    return asyncio.run(read())


def _status(url: str, group: str) -> dict:
    result = cli("lbg", "status", "--broker-url", url, "--group", group, "--json")
    return orjson.loads(result.stdout)


def _shares(url: str, group: str, queue_count: int, timeout: float = 15.0) -> dict[str, list]:
    """Wait until every queue of the new size is served where it is assigned; who serves what."""
    deadline = time.monotonic() + timeout
    while True:
        status = _status(url, group)
        queues = status["queues"]
        if len(queues) == queue_count and all(
            q["serving"] and q["serving"] == q["assigned"] for q in queues
        ):
            return {m["member"]: m["serves"] for m in status["members"]}
        assert time.monotonic() < deadline, f"the group never settled on {queue_count}: {status}"
        time.sleep(0.3)


def test_running_clients_follow_a_grow_and_a_shrink_under_load(
    messagedb: BrokerEndpoint, group: str, deployment: LocalDeployment
) -> None:
    """Only the clients that ran before the grow serve the grown group: they hear of the new
    size through the membership mechanism and bind its new members. A client that joins later
    runs it from the start; after a shrink the same processes retire the queues it lost."""
    clients = [deployment.start(name, "lbg-client", "--id", name) for name in ("a", "b")]
    publisher = deployment.start_publisher(
        "pub", "--keys", "40", "--rate", "300", "--duration", "16"
    )
    wait_for_log(publisher, "-> group")
    time.sleep(3)
    grown = cli("cg-admin", "--broker-url", messagedb.url, "resize", group, "--queues", "4")
    assert "QC 2 -> 4" in grown.stdout and "generation 1" in grown.stdout, grown.stdout
    for client in clients:
        wait_for_log(client, "resized, QC 2 -> 4 (generation 1)", timeout=3)
    assert sorted(map(len, _shares(messagedb.url, group, 4).values())) == [2, 2]

    clients.append(deployment.start("c", "lbg-client", "--id", "c"))
    wait_for_log(clients[-1], "joined")
    time.sleep(2)
    shrunk = cli("cg-admin", "--broker-url", messagedb.url, "resize", group, "--queues", "2")
    assert "QC 4 -> 2" in shrunk.stdout, shrunk.stdout
    for client in clients:
        wait_for_log(client, "resized, QC 4 -> 2 (generation 2)", timeout=3)
    assert sorted(map(len, _shares(messagedb.url, group, 2).values())) == [0, 1, 1]
    assert publisher.wait(40) == 0, publisher.log_tail()

    report = run_validator(deployment, timeout=90)

    assert all(client.running for client in clients), "a client restarted or died"
    assert report["published"] > 3000
    assert report["lost"] == 0
    assert report["reordered"] == 0
    assert report["duplicates"] == 0
    read = _members_that_read(messagedb.url, group)
    assert {(1, 0), (1, 1), (1, 2), (1, 3)} <= set(read), f"the grown members never read: {read}"
    assert {(2, 0), (2, 1)} <= set(read), f"the shrunk generation never read: {read}"
    show = cli("cg-admin", "--broker-url", messagedb.url, "show", group)
    assert '"QC":2' in show.stdout.replace(" ", ""), show.stdout


def test_resize_refuses_a_size_that_does_not_divide_the_hash_count(
    messagedb: BrokerEndpoint, group: str
) -> None:
    result = cli(
        "cg-admin", "--broker-url", messagedb.url, "resize", group, "--queues", "5", check=False
    )
    assert result.returncode != 0
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert "QC (queue count) 5" in result.stderr and "HC (hash count) 24" in result.stderr
