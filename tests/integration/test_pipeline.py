"""The four daemons end to end on a real nats-server: order, exclusivity, crash and handover."""

import signal
import time

from lbg.devstack.deployment import LocalDeployment


def wait_for(predicate, timeout: float, message: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, message
        time.sleep(0.1)


def served_queues(deployment: LocalDeployment, client: str) -> int:
    """How many times the client's log says it started serving a queue."""
    return deployment.daemons[client].log_path.read_text().count("now serves queue")


def test_every_event_arrives_once_and_in_order(
    make_group, deployment: LocalDeployment, validate
) -> None:
    make_group()
    deployment.start_client("client-a", 0, 2, 60)
    deployment.start_client("client-b", 1, 2, 60)
    publisher = deployment.start_publisher("pub", "--keys", "40", "--count", "4000")
    assert publisher.wait(60) == 0, publisher.log_tail()

    report = validate()

    assert report["published"] == 4000
    assert report["unique"] == 4000
    assert report["lost"] == 0
    assert report["reordered"] == 0
    assert report["duplicates"] == 0


def test_one_active_consumer_per_queue(make_group, deployment: LocalDeployment, validate) -> None:
    """With three clients bound to every queue, each queue is served by exactly one of them."""
    make_group()
    for i, name in enumerate(("client-a", "client-b", "client-c")):
        deployment.start_client(name, i, 4, 600)
    publisher = deployment.start_publisher("pub", "--keys", "64", "--count", "3000")
    assert publisher.wait(60) == 0, publisher.log_tail()

    report = validate()

    assert report["lost"] == 0 and report["reordered"] == 0
    assert report["reassignments"] == 0, "a key moved although no client came or went"
    assert sum(report["per_client"].values()) == 3000
    assert sum(served_queues(deployment, c) for c in ("client-a", "client-b", "client-c")) == 4


def test_kill_9_of_the_active_client_loses_and_reorders_nothing(
    make_group, deployment: LocalDeployment, validate
) -> None:
    make_group()
    victim = deployment.start_client("client-a", 0, 1, 600)
    publisher = deployment.start_publisher(
        "pub", "--keys", "50", "--rate", "1500", "--duration", "8"
    )
    wait_for(lambda: served_queues(deployment, "client-a") == 4, 15, "client-a never got active")
    time.sleep(1.0)
    deployment.start_client("client-b", 0, 1, 600)
    time.sleep(1.0)
    victim.send(signal.SIGKILL)
    assert publisher.wait(60) == 0, publisher.log_tail()

    report = validate()

    assert report["lost"] == 0
    assert report["reordered"] == 0
    assert report["per_client"].get("client-b", 0) > 0, "nobody took over"


def test_sigterm_hands_over_without_duplicates(
    make_group, deployment: LocalDeployment, validate
) -> None:
    make_group()
    leaving = deployment.start_client("client-a", 0, 1, 600)
    publisher = deployment.start_publisher(
        "pub", "--keys", "50", "--rate", "1500", "--duration", "8"
    )
    wait_for(lambda: served_queues(deployment, "client-a") == 4, 15, "client-a never got active")
    deployment.start_client("client-b", 0, 1, 600)
    time.sleep(2.0)
    leaving.send(signal.SIGTERM)
    assert leaving.wait(20) == 0, leaving.log_tail()
    assert publisher.wait(60) == 0, publisher.log_tail()

    report = validate()

    assert report["lost"] == 0
    assert report["reordered"] == 0
    assert report["duplicates"] == 0
    assert report["per_client"].get("client-b", 0) > 0, "nobody took over"
