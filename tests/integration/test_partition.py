"""No two processors on one key when a member is cut off from the broker (issue 27).

Three dynamic members under a slow handler (0.1 s per event) that writes every event to a
shared store; member client-a is cut off from the broker (the process lives on, its sockets
stay open) and later healed, in two ways: behind a proxy that the test freezes
(tests/support/partition.py), and by iptables dropping its packets on loopback
(tests/support/blackhole.py: the broker's own socket faces the black hole, as in issue 27).
The store must show no write by client-a to a key after its successor wrote it, the
validator nothing lost or reordered, and client-a must serve queues again after the heal.
The same with static clients on NATS, where the broker's priority timeout, not a peer,
moves the cut-off client's queues.
"""

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.integration.test_dynamic import log_of, member, serving, times_of, wait_for
from tests.support.blackhole import Blackhole, Unavailable
from tests.support.partition import Partition
from tests.support.store import (
    DIRECT_URL_ENV,
    STORE_ENV,
    read_writes,
    stale_epoch_writes,
    zombie_writes,
)

from lbg.devstack.brokers import BrokerEndpoint
from lbg.devstack.deployment import LocalDeployment

CUT_AFTER = 3.0
# 600 events/s over 30 keys against 300/s of handler capacity: by the cut, client-a holds
# seconds of work (RabbitMQ moves its queues only ~3 s after the cut; at 400/s client-a's
# backlog ran out first there, and the unfenced code showed no overlap to catch).
RATE = "600"
CUT_FOR = 4.0
PUBLISH_SECONDS = 13.0
HANDLER = ("--handler", "tests.support.store:handle")
# Static mode: secondaries go back this often, so client-a gets its primaries back after the heal.
STATIC_CYCLE_SECONDS = 2.0
Cut = Partition | Blackhole
# Brokers whose deliveries carry a queue's ownership epoch (the fencing token).
BROKERS_WITH_EPOCHS = {"nats", "rabbitmq", "messagedb", "solace"}


@pytest.fixture
def store(broker: BrokerEndpoint, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The shared store file; the daemons import the handler from tests.support.store."""
    path = tmp_path / "store.jsonl"
    monkeypatch.setenv(STORE_ENV, str(path))
    monkeypatch.setenv(DIRECT_URL_ENV, broker.url)
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[2]))
    return path


@pytest.fixture(params=["proxy", "iptables"])
def partition(broker: BrokerEndpoint, request: pytest.FixtureRequest) -> Iterator[Cut]:
    """What cuts client-a off: the frozen proxy, or iptables DROP (skipped, with the reason,
    where iptables cannot run); only a broker on this machine can be partitioned here."""
    try:
        cut: Cut = Partition(broker.url) if request.param == "proxy" else Blackhole(broker.url)
    except (ValueError, Unavailable) as exc:
        pytest.skip(f"{request.param} partition not possible here: {exc}")
    yield cut
    cut.close()


def served_after(deployment: LocalDeployment, name: str, since: float) -> bool:
    """The member's log says it took a queue after `since` (a wall-clock time)."""
    return any(t > since for t in times_of(log_of(deployment, name), "now serves queue"))


def test_a_partitioned_member_stops_before_its_successor_starts(
    broker: BrokerEndpoint,
    make_group,
    deployment: LocalDeployment,
    validate,
    store: Path,
    partition: Cut,
) -> None:
    make_group("--queue-count", "6")
    for name in ("client-a", "client-b", "client-c"):
        url = ("--broker-url", partition.url) if name == "client-a" else ()
        member(deployment, name, *url, *HANDLER)
    cut_off_and_healed(broker, deployment, validate, store, partition)


ECONOMY = Path(__file__).resolve().parents[2] / "config" / "lbg-client-idle-economy.toml"


@pytest.mark.parametrize("partition", ["proxy"], indirect=True)
def test_a_partitioned_member_on_a_longer_lease_than_its_peers_stops_before_its_successor(
    broker: BrokerEndpoint,
    make_group,
    deployment: LocalDeployment,
    validate,
    store: Path,
    partition: Cut,
) -> None:
    """client-a runs the idle-economy lease (1.4 s, margin 0.3: it fences 1.1 s after its
    last confirmed heartbeat), its peers the default (0.7 s, 0.15), as in a rolling change of
    the lease: its peers must wait out its lease, not theirs."""
    make_group("--queue-count", "6")
    economy = ("--config", str(ECONOMY))
    member(deployment, "client-a", "--broker-url", partition.url, *economy, *HANDLER)
    for name in ("client-b", "client-c"):
        member(deployment, name, *HANDLER)
    cut_off_and_healed(broker, deployment, validate, store, partition)


def test_a_partitioned_static_client_stops_before_the_broker_moves_its_queues(
    broker: BrokerEndpoint,
    make_group,
    deployment: LocalDeployment,
    validate,
    store: Path,
    partition: Cut,
) -> None:
    """Static mode on NATS: no lease, no eviction; the broker unpins the cut-off client's
    queues after the priority timeout, and the client must have stopped by then."""
    if broker.kind != "nats":
        pytest.skip("on the other brokers a static client's queue moves as a dynamic one's")
    make_group("--queue-count", "6")
    for index, name in enumerate(("client-a", "client-b", "client-c")):
        url = ("--broker-url", partition.url) if name == "client-a" else ()
        deployment.start_client(name, index, 3, STATIC_CYCLE_SECONDS, *url, *HANDLER)
    # Its primaries come back only on the others' release cycles, each handover draining a
    # saturated backlog first: seconds each.
    cut_off_and_healed(broker, deployment, validate, store, partition, rejoin_within=40)


def cut_off_and_healed(
    broker: BrokerEndpoint,
    deployment: LocalDeployment,
    validate,
    store: Path,
    partition: Cut,
    rejoin_within: float = 30,
) -> None:
    """Load the group, cut client-a off, heal it; then check the store and the validator.
    client-a must serve again within `rejoin_within` s of the heal: each queue it gets back
    comes only after its holder finished what it had taken of the saturated backlog."""
    publisher = deployment.start_publisher(
        "pub", "--keys", "30", "--rate", RATE, "--duration", str(PUBLISH_SECONDS)
    )
    wait_for(lambda: serving(deployment, "client-a"), 15, "client-a never became active")
    time.sleep(CUT_AFTER)
    cut_at = time.monotonic()
    partition.cut()
    time.sleep(CUT_FOR)
    healed_at, healed_wall = time.monotonic(), time.time()
    partition.heal()
    assert publisher.wait(60) == 0, publisher.log_tail()
    wait_for(
        lambda: served_after(deployment, "client-a", healed_wall),
        rejoin_within,
        "client-a did not rejoin after the heal",
    )

    report = validate()

    writes = read_writes(store)
    by_a = [w for w in writes if w.writer == "client-a"]
    zombies = zombie_writes(writes, "client-a", cut_at, healed_at)
    last_a = max((w.at for w in by_a if cut_at <= w.at < healed_at), default=cut_at)
    keys_a = {w.key for w in by_a if cut_at - 1 <= w.at < cut_at}  # what it served at the cut
    taken_at = min(
        (w.at for w in writes if w.writer != "client-a" and w.at >= cut_at and w.key in keys_a),
        default=healed_at,
    )
    print(
        f"\nclient-a wrote {len(by_a)} events, {sum(cut_at <= w.at < healed_at for w in by_a)}"
        f" during the cut (the last {last_a - cut_at:.2f} s after it; a successor wrote one"
        f" of its keys {taken_at - cut_at:.2f} s after it); writes to a key its successor"
        f" already had: {len(zombies)}; under an older epoch: {len(stale_epoch_writes(writes))}"
    )
    assert any(w.at < cut_at for w in by_a), "client-a processed nothing before the cut"
    assert zombies == [], f"client-a went on after its successor: {zombies[:5]}"
    assert report["lost"] == 0
    assert report["reordered"] == 0
    assert stale_epoch_writes(writes) == [], "a key was written under an older owner's epoch"
    if broker.kind in BROKERS_WITH_EPOCHS:
        assert all(w.epoch > 0 for w in writes), "a write carried no fencing token"
