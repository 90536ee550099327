"""The operator commands on every real broker: lbg status, lbg route and lbg move under load."""

import asyncio
import subprocess
import time
from pathlib import Path

import orjson

from lbg.broker import connect_broker
from lbg.devstack.deployment import Daemon, LocalDeployment, script
from lbg.model.destinations import OutputKind
from lbg.model.messages import Processed, decode_processed
from lbg.settings import BrokerSettings

MEMBERS = ("client-a", "client-b", "client-c")


def lbg(deployment: LocalDeployment, command: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run `lbg COMMAND --broker-url URL --group GROUP ARGS` to completion."""
    return subprocess.run(
        [
            script("lbg"),
            command,
            "--broker-url",
            deployment.broker_url,
            "--group",
            deployment.group,
            *(["--admin-url", deployment.admin_url] if deployment.admin_url else []),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )


def status(deployment: LocalDeployment) -> dict:
    result = lbg(deployment, "status", "--json")
    assert result.returncode == 0, result.stderr
    return orjson.loads(result.stdout)


def settled(deployment: LocalDeployment, members: int, timeout: float = 15.0) -> dict:
    """Wait until `members` members are heard and every queue is served where it is assigned."""
    deadline = time.monotonic() + timeout
    while True:
        current = status(deployment)
        queues = current["queues"]
        if len(current["members"]) == members and all(
            q["serving"] and q["serving"] == q["assigned"] for q in queues
        ):
            return current
        assert time.monotonic() < deadline, f"the group never settled: {current}"
        time.sleep(0.2)


def start_members(deployment: LocalDeployment, names=MEMBERS) -> None:
    """Start dynamic members and wait until each is heard: under the load that follows, every
    queue goes straight to its assigned member."""
    for name in names:
        deployment.start(name, "lbg-client", "--id", name)
    deadline = time.monotonic() + 15
    while len(status(deployment)["members"]) < len(names):
        assert time.monotonic() < deadline, "the members were never heard"
        time.sleep(0.2)


def load(deployment: LocalDeployment, seconds: float, *args: str) -> Daemon:
    return deployment.start_publisher(
        "pub", "--keys", "40", "--rate", "400", "--duration", str(seconds), *args
    )


def test_status_lists_the_members_and_every_queues_owner(
    make_group, deployment: LocalDeployment
) -> None:
    make_group()
    start_members(deployment)
    publisher = load(deployment, 4)

    current = settled(deployment, members=3)

    assert [m["member"] for m in current["members"]] == list(MEMBERS)
    assert {m["state"] for m in current["members"]} == {"active"}
    queues = current["queues"]
    assert [q["queue"] for q in queues] == [0, 1, 2, 3]
    assert {q["serving"] for q in queues} == set(MEMBERS), "3 members share 4 queues"
    for q in queues:
        assert q["buckets"] == list(range(q["queue"], 32, 4))
        assert q["broker_active"] in (None, q["serving"]), "heartbeats and the broker disagree"
        served = next(m for m in current["members"] if m["member"] == q["serving"])
        assert q["queue"] in served["serves"]
    text = lbg(deployment, "status")
    assert text.returncode == 0, text.stderr
    assert "members (3 heard" in text.stdout
    for name in MEMBERS:
        assert name in text.stdout

    refused = [
        lbg(deployment, "move", "9", "client-a"),
        lbg(deployment, "move", "0", "client-z"),
    ]
    assert [r.returncode for r in refused] == [2, 2]
    assert [r.stderr.count("\n") for r in refused] == [1, 1]
    assert "queue 9 is outside 0..3" in refused[0].stderr
    assert "unknown member 'client-z'" in refused[1].stderr
    assert publisher.running or publisher.wait(1) == 0, publisher.log_tail()


def test_status_of_a_static_group_shows_the_brokers_active_client(
    make_group, deployment: LocalDeployment
) -> None:
    make_group()
    deployment.start_client("static-0", 0, 1, 600)
    publisher = deployment.start_publisher(
        "pub", "--keys", "100", "--rate", "200", "--duration", "10"
    )
    deadline = time.monotonic() + 15
    while True:
        current = status(deployment)
        if all(q["serving"] == "static-0" for q in current["queues"]):
            break
        assert time.monotonic() < deadline, current
        time.sleep(0.2)
    assert current["members"] == [] and not current["dynamic"]
    text = lbg(deployment, "status").stdout
    assert "no dynamic members heard" in text
    moved = lbg(deployment, "move", "0", "static-0")
    assert moved.returncode == 2 and "no dynamic members heard" in moved.stderr
    assert publisher.running or publisher.wait(1) == 0, publisher.log_tail()


async def processed_records(url: str, group: str, expected: int) -> list[Processed]:
    broker = await connect_broker(BrokerSettings(url=url), "test-reader")
    records: list[Processed] = []
    try:
        async with asyncio.timeout(20):
            async for message in broker.read_output(group):
                if message.kind is OutputKind.VALIDATION:
                    records.append(decode_processed(message.body))
                    if len(records) >= expected:
                        break
    finally:
        await broker.close()
    return records


def test_route_agrees_with_what_the_clients_processed(
    make_group, deployment: LocalDeployment, validate, tmp_path: Path
) -> None:
    make_group()
    keys = [f"order-{i}" for i in range(20)]
    events = tmp_path / "events.jsonl"
    events.write_bytes(
        b"".join(orjson.dumps({"key": k, "data": i}) + b"\n" for i in range(60) for k in keys)
    )
    start_members(deployment, MEMBERS[:2])
    publisher = deployment.start_publisher("pub", "--input", str(events), "--rate", "500")
    settled(deployment, members=2)

    routed = lbg(deployment, "route", *keys)
    assert routed.returncode == 0, routed.stderr
    assert publisher.wait(30) == 0, publisher.log_tail()
    report = validate()
    records = await_records(deployment, report["unique"])

    lines = [line.split("\t") for line in routed.stdout.splitlines()]
    assert [line[0] for line in lines] == keys
    last = {r.key: r for r in records}
    for key, bucket, queue, owner in lines:
        assert int(bucket) == last[key].bucket
        assert int(queue) == last[key].queue
        assert owner == last[key].client, f"{key}: routed to {owner}, processed by {last[key]}"
    as_json = orjson.loads(lbg(deployment, "route", "--json", keys[0]).stdout)
    assert as_json[0]["key"] == keys[0] and as_json[0]["queue"] == last[keys[0]].queue
    bad = lbg(deployment, "route", "")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1


def await_records(deployment: LocalDeployment, expected: int) -> list[Processed]:
    return asyncio.run(processed_records(deployment.broker_url, deployment.group, expected))


def test_move_hands_a_queue_to_the_chosen_member_with_nothing_lost_or_duplicated(
    make_group, deployment: LocalDeployment, validate
) -> None:
    make_group()
    start_members(deployment)
    # Long enough that the queue still has traffic when the move comes, even on a busy
    # machine (an idle queue counts as moved with nobody serving it).
    publisher = load(deployment, 15)
    before = settled(deployment, members=3)
    serves = {m["member"]: m["serves"] for m in before["members"]}
    busiest = max(serves, key=lambda m: (len(serves[m]), m))
    target = min(serves, key=lambda m: (len(serves[m]), m))
    queue = serves[busiest][0]

    moved = lbg(deployment, "move", str(queue), target, "--json")

    assert moved.returncode == 0, moved.stderr
    result = orjson.loads(moved.stdout)
    assert result["done"] and result["was"] == busiest and result["now"] == target
    assert result["seconds"] < 5
    after = status(deployment)
    row = after["queues"][queue]
    assert row["serving"] == target and row["pinned"] == target
    assert after["overrides"] == {str(queue): target}
    assert publisher.wait(30) == 0, publisher.log_tail()

    report = validate()

    assert report["lost"] == 0
    assert report["reordered"] == 0
    assert report["duplicates"] == 0, "a planned move duplicated events"
    assert "override: queue" in deployment.daemons[target].log_path.read_text()
