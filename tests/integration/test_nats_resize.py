"""Resizing a NATS JetStream group at run time, under load: the old consumers drain up to the
switch marker, the new generation's start after it, running clients follow the new size, a
client killed and one joining during a resize change nothing, and the validator finds nothing
lost or reordered."""

import asyncio
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import nats
import orjson
import pytest
from tests.support.processes import cli, resizable_group, run_validator, wait_for_log

from lbg.broker.nats.adapter import events_stream
from lbg.devstack.deployment import LocalDeployment


@pytest.fixture
def group(nats_url: str) -> Iterator[str]:
    with resizable_group(nats_url, 4) as name:
        yield name


@pytest.fixture
def deployment(nats_url: str, group: str, tmp_path: Path) -> Iterator[LocalDeployment]:
    local = LocalDeployment(nats_url, group, tmp_path / "daemons")
    yield local
    local.stop_all()


def _consumers(url: str, group: str) -> list[str]:
    """The names of the consumers on the group's events stream."""

    async def names() -> list[str]:
        nc = await nats.connect(url)
        try:
            return sorted(
                info.name for info in await nc.jetstream().consumers_info(events_stream(group))
            )
        finally:
            await nc.close()

    return asyncio.run(names())


def _settled(url: str, group: str, queue_count: int, timeout: float = 30.0) -> dict:
    """Wait until every queue of the new size is served where it is assigned and no old
    consumer is left; the status then."""
    deadline = time.monotonic() + timeout
    while True:
        status = orjson.loads(
            cli("lbg", "status", "--broker-url", url, "--group", group, "--json").stdout
        )
        queues = status["queues"]
        if (
            len(queues) == queue_count
            and all(q["serving"] and q["serving"] == q["assigned"] for q in queues)
            and len(_consumers(url, group)) == queue_count
        ):
            return status
        assert time.monotonic() < deadline, f"the group never settled on {queue_count}: {status}"
        time.sleep(0.3)


def test_clients_follow_a_grow_and_a_shrink_under_load_through_a_kill_and_a_join(
    nats_url: str, group: str, deployment: LocalDeployment
) -> None:
    """4 -> 8 -> 2 queues with the publisher running at 300 events/s: a client is killed
    (SIGKILL) during the grow and one joins during the shrink; nothing is lost or reordered,
    and the only duplicates are the killed client's unacked work."""
    clients = {name: deployment.start(name, "lbg-client", "--id", name) for name in "abc"}
    publisher = deployment.start_publisher(
        "pub", "--keys", "60", "--rate", "300", "--duration", "60"
    )
    wait_for_log(publisher, "-> group")
    time.sleep(3)
    grown = cli("cg-admin", "--broker-url", nats_url, "resize", group, "--queues", "8")
    assert "QC 4 -> 8" in grown.stdout and "generation 1" in grown.stdout, grown.stdout
    clients["b"].send(signal.SIGKILL)
    for name in "ac":
        wait_for_log(clients[name], "resized, QC 4 -> 8 (generation 1)", timeout=5)
    _settled(nats_url, group, 8)
    assert _consumers(nats_url, group) == [f"g1q{q}" for q in range(8)]

    time.sleep(2)
    shrunk = cli("cg-admin", "--broker-url", nats_url, "resize", group, "--queues", "2")
    assert "QC 8 -> 2" in shrunk.stdout, shrunk.stdout
    clients["d"] = deployment.start("d", "lbg-client", "--id", "d")
    for name in "ac":
        wait_for_log(clients[name], "resized, QC 8 -> 2 (generation 2)", timeout=5)
    wait_for_log(clients["d"], "joined")
    _settled(nats_url, group, 2)
    assert publisher.running, "the load ended before the shrink was over: lengthen it"
    assert _consumers(nats_url, group) == ["g2q0", "g2q1"]
    assert publisher.wait(60) == 0, publisher.log_tail()

    report = run_validator(deployment, timeout=90)
    print({k: report[k] for k in ("published", "lost", "reordered", "duplicates")})

    for name in "acd":
        assert clients[name].running, f"client {name} died: {clients[name].log_tail(40)}"
    assert report["published"] > 15000
    assert report["lost"] == 0
    assert report["reordered"] == 0
    # The kill's unacked work comes again (at most one pull batch per queue it served).
    assert report["duplicates"] <= 8 * 200, report


def test_resize_refuses_more_queues_than_buckets(nats_url: str, group: str) -> None:
    result = cli(
        "cg-admin", "--broker-url", nats_url, "resize", group, "--queues", "25", check=False
    )
    assert result.returncode != 0
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert "QC (queue count) 25" in result.stderr and "HC (hash count) 24" in result.stderr


def _status(url: str, group: str, *flags: str) -> str:
    return cli("lbg", "status", "--broker-url", url, "--group", group, *flags).stdout


def test_status_shows_the_old_queues_draining_until_a_client_has_drained_them(
    nats_url: str, group: str, deployment: LocalDeployment
) -> None:
    """Events published before a resize with no client running wait in the old consumers,
    which `lbg status` lists as draining; the first client drains them, in order, and they go."""
    publisher = deployment.start_publisher(
        "pub", "--keys", "20", "--rate", "200", "--duration", "2"
    )
    assert publisher.wait(30) == 0, publisher.log_tail()
    cli("cg-admin", "--broker-url", nats_url, "resize", group, "--queues", "2")
    draining = orjson.loads(_status(nats_url, group, "--json"))["draining"]
    assert [d["name"].split()[0] for d in draining] == [f"{group}/q{q}" for q in range(4)]
    assert sum(d["backlog"] for d in draining) > 400
    text = _status(nats_url, group)
    assert "generation 1" in text.splitlines()[0]
    assert f"draining: {group}/q0 (generation 0, acked up to 0 of " in text

    client = deployment.start("a", "lbg-client", "--id", "a")
    deadline = time.monotonic() + 20
    while orjson.loads(_status(nats_url, group, "--json"))["draining"]:
        assert time.monotonic() < deadline, _status(nats_url, group)
        time.sleep(0.3)
    assert _consumers(nats_url, group) == ["g1q0", "g1q1"]
    report = run_validator(deployment, timeout=60)
    assert client.running
    assert (report["lost"], report["reordered"], report["duplicates"]) == (0, 0, 0), report
