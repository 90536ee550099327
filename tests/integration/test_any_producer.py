"""Any producer, any payload: events published with nothing but the broker's own client library
(nats-py, aio-pika: no import of lbg), arbitrary JSON and non-JSON bodies, keys with separators
and non-ASCII characters, reach a user's handler with their body and headers byte for byte,
each key in publish order, through a kill -9 and a planned handover.

Also the shipped examples: the nats-py producer and the in-process API.
"""

from __future__ import annotations

import asyncio
import importlib.util
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import aio_pika
import asyncpg
import nats
import orjson
import pytest
from tests.support.processes import cli, wait_for_log
from tests.support.recorder import read_records

from lbg.devstack.brokers import BrokerEndpoint
from lbg.devstack.deployment import LocalDeployment

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
HANDLER = "tests.support.recorder:record"

_spec = importlib.util.spec_from_file_location("foreign_producer", EXAMPLES / "foreign_producer.py")
assert _spec is not None and _spec.loader is not None
producer = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(producer)

KEYS = [f"order-{i}" for i in range(30)] + [
    "EU.order.31",
    "a/b c",
    "Grüße",
    "键-33",
    "50%",
    "x*y>z#",
    "tab\there",
    "émoji 🎉",
]
EVENTS_PER_KEY = 15
RATE = 100.0  # production outlasts the third member's join (about 1 s) by 2 s


def body_of(key: str, n: int) -> bytes:
    """JSON, text, binary and empty bodies in turn."""
    return [
        orjson.dumps({"order_id": key, "step": n}),
        f"step {n} of {key}: plain text, ünïcode".encode(),
        bytes([0, 255, n % 256]) + b"\x89PNG",
        b"",
    ][n % 4]


def plan(hash_prefix: str, hash_count: int) -> list[tuple[str, str, bytes, dict[str, str]]]:
    """(key, routing subject, body, headers) of every event, in publish order."""
    events = []
    for n in range(EVENTS_PER_KEY):
        for key in KEYS:
            bucket = producer.java_bucket(key, hash_count)
            target = f"{hash_prefix}.{bucket}.{producer.key_token(key)}"
            headers = {"trace-id": f"{KEYS.index(key)}-{n}", "content-type": "x/test"}
            events.append((key, target, body_of(key, n), headers))
    return events


async def pace(i: int, started: float) -> None:
    """Hold event i until its time at RATE events/s."""
    await asyncio.sleep(max(0.0, started + i / RATE - time.monotonic()))


async def publish_with_nats(url: str, events: list) -> None:
    nc = await nats.connect(url)
    started = time.monotonic()
    try:
        js = nc.jetstream()
        for i, (_key, target, body, headers) in enumerate(events):
            await js.publish(target, body, headers=headers)
            await pace(i, started)
    finally:
        await nc.close()


async def publish_with_aio_pika(url: str, group: str, events: list) -> None:
    connection = await aio_pika.connect(url)
    started = time.monotonic()
    try:
        channel = await connection.channel(publisher_confirms=True)
        exchange = await channel.get_exchange(f"lbg.{group}", ensure=False)
        for i, (_key, target, body, headers) in enumerate(events):
            message = aio_pika.Message(
                body, headers=headers, delivery_mode=aio_pika.DeliveryMode.PERSISTENT
            )
            await exchange.publish(message, routing_key=target)
            await pace(i, started)
    finally:
        await connection.close()


def producer_thread(broker: BrokerEndpoint, group: str, events: list) -> threading.Thread:
    """The foreign producer, to run in its own thread and event loop, paced at RATE events/s."""

    def produce() -> None:
        if broker.kind == "nats":
            asyncio.run(publish_with_nats(broker.url, events))
        else:
            asyncio.run(publish_with_aio_pika(broker.url, group, events))

    return threading.Thread(target=produce, name="foreign-producer")


def key_order_faults(published: list[str], processed: list[str]) -> tuple[int, int, int]:
    """(reordered, skipped, duplicates) of one key's processed ids against its publish order:
    an id processed before an earlier unseen one, published ids never processed, repeats."""
    position = {ident: i for i, ident in enumerate(published)}
    seen: set[str] = set()
    highest = -1
    reordered = duplicates = 0
    for ident in processed:
        if ident in seen:
            duplicates += 1
            continue
        if position[ident] < highest:
            reordered += 1
        highest = max(highest, position[ident])
        seen.add(ident)
    return reordered, len(published) - len(seen), duplicates


def test_the_fault_count_of_a_key_can_fail() -> None:
    assert key_order_faults(["a", "b", "c"], ["a", "b", "c"]) == (0, 0, 0)
    assert key_order_faults(["a", "b", "c"], ["a", "c", "b"]) == (1, 0, 0)
    assert key_order_faults(["a", "b", "c"], ["a", "b", "a", "b", "c"]) == (0, 0, 2)
    assert key_order_faults(["a", "b", "c"], ["a", "c"]) == (0, 1, 0)


def start_member(deployment: LocalDeployment, name: str):
    return deployment.start(name, "lbg-client", "--id", name, "--handler", HANDLER)


@pytest.fixture
def recording(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where the recording handler writes; its module is importable by the daemons."""
    folder = tmp_path / "records"
    folder.mkdir()
    monkeypatch.setenv("LBG_TEST_RECORD_DIR", str(folder))
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    return folder


def wait_for_records(folder: Path, count: int, timeout: float = 40.0) -> list[dict]:
    deadline = time.monotonic() + timeout
    while True:
        records = read_records(folder)
        if len({(r["key"], r["headers"].get("trace-id", r["t"])) for r in records}) >= count:
            return records
        if time.monotonic() > deadline:
            return records
        time.sleep(0.5)


def through_failures(
    deployment: LocalDeployment, produce: threading.Thread, folder: Path, count: int
) -> list[dict]:
    """Two members; while `produce` publishes: kill -9 one, start a third, SIGTERM the
    second (a planned handover). Every record the handler wrote, in processing order."""
    members = {name: start_member(deployment, name) for name in ("client-a", "client-b")}
    for member in members.values():
        wait_for_log(member, "joined")
    time.sleep(1.0)  # the members see each other (heartbeats) and share the queues
    produce.start()
    time.sleep(1.5)
    members["client-a"].send(signal.SIGKILL)
    time.sleep(1.0)
    members["client-c"] = start_member(deployment, "client-c")
    time.sleep(1.5)
    members["client-b"].send(signal.SIGTERM)
    assert members["client-b"].wait(15) == 0, members["client-b"].log_tail()
    produce.join(60)
    records = wait_for_records(folder, count)
    log = deployment.daemons["client-c"].log_path.read_text()
    assert "dead-lettered" not in log and "Traceback" not in log
    assert {r["client"] for r in records} >= {"client-a", "client-b", "client-c"}
    return records


def assert_in_order_and_complete(events: list, records: list[dict]) -> None:
    """Each key's events were all processed, in publish order; the only repeats are events
    the killed member had processed but not acked."""
    faults: Counter[str] = Counter()
    for key in dict.fromkeys(key for key, *_ in events):
        published = [h["trace-id"] for k, _t, _b, h in events if k == key]
        processed = [r["headers"]["trace-id"] for r in records if r["key"] == key]
        reordered, skipped, duplicates = key_order_faults(published, processed)
        faults.update(reordered=reordered, skipped=skipped, duplicates=duplicates)
    assert faults["skipped"] == 0, f"events never processed: {faults}"
    assert faults["reordered"] == 0, f"keys processed out of order: {faults}"
    first_by: dict[tuple[str, str], str] = {}
    for item in records:
        ident = (item["key"], item["headers"]["trace-id"])
        if ident in first_by:
            assert first_by[ident] == "client-a", f"duplicate not caused by the kill -9: {item}"
        first_by.setdefault(ident, item["client"])


MISROUTED = "misrouted-1"


def test_a_foreign_producer_reaches_the_handler_byte_for_byte_in_order_through_failures(
    make_group,
    deployment: LocalDeployment,
    broker: BrokerEndpoint,
    group_name: str,
    recording: Path,
) -> None:
    if broker.kind not in ("nats", "rabbitmq"):
        pytest.skip("this producer speaks NATS or AMQP (Message DB: the test below)")
    make_group()
    events = plan(group_name, 32)
    wrong = (producer.java_bucket(MISROUTED, 32) + 1) % 32
    events += [
        (MISROUTED, f"{group_name}.{wrong}.{MISROUTED}", b"%d" % n, {"trace-id": f"m-{n}"})
        for n in range(10)
    ]

    produce = producer_thread(broker, group_name, events)
    records = through_failures(deployment, produce, recording, len(events))

    sent = {(key, headers["trace-id"]): (body, headers) for key, _t, body, headers in events}
    for item in records:
        body, headers = sent[(item["key"], item["headers"]["trace-id"])]
        assert item["body"] == body, item
        assert item["headers"].items() >= headers.items(), item
        bucket = wrong if item["key"] == MISROUTED else producer.java_bucket(item["key"], 32)
        assert item["bucket"] == bucket, item
    assert_in_order_and_complete(events, records)
    warnings = sum(
        daemon.log_path.read_text().count(f"key '{MISROUTED}' came in bucket {wrong}")
        for daemon in deployment.daemons.values()
    )
    assert 1 <= warnings <= 3, "a misrouted key is logged once per member that served it"


MESSAGE_DB_WRITE = "SELECT message_store.write_message($1, $2, 'Event', $3::jsonb, $4::jsonb)"


async def write_with_sql(url: str, category: str, events: list) -> None:
    """Another Message DB writer: plain SQL, a stream `<category>-<key>` per key."""
    conn = await asyncpg.connect(url, server_settings={"search_path": "message_store,public"})
    started = time.monotonic()
    try:
        for i, (key, _target, body, headers) in enumerate(events):
            stream = f"{category}-{key}"
            await conn.execute(
                MESSAGE_DB_WRITE, str(uuid.uuid4()), stream, body, orjson.dumps(headers).decode()
            )
            await pace(i, started)
    finally:
        await conn.close()


def test_a_foreign_message_db_writer_reaches_the_handler_in_order_through_failures(
    messagedb: BrokerEndpoint, tmp_path: Path, recording: Path
) -> None:
    suffix = uuid.uuid4().hex[:8]
    group, category = f"writers-{suffix}", f"account{suffix}"
    cli(
        "cg-admin",
        *("--broker-url", messagedb.url, "create", "--group", group, "--hash-prefix", group),
        *("--category", category, "--hash-count", "32", "--queue-count", "4"),
    )
    events = [
        (key, "", orjson.dumps({"key": key, "n": n, "note": "ünï"}).decode(), headers)
        for key, _target, _body, headers in plan(group, 32)
        for n in [int(headers["trace-id"].split("-")[1])]
    ]
    deployment = LocalDeployment(messagedb.url, group, tmp_path / "daemons")
    produce = threading.Thread(
        target=lambda: asyncio.run(write_with_sql(messagedb.url, category, events))
    )
    try:
        records = through_failures(deployment, produce, recording, len(events))
    finally:
        deployment.stop_all()
        cli("cg-admin", "--broker-url", messagedb.url, "delete", group, check=False)

    sent = {(key, headers["trace-id"]): (body, headers) for key, _t, body, headers in events}
    for item in records:
        body, headers = sent[(item["key"], item["headers"]["trace-id"])]
        assert orjson.loads(item["body"]) == orjson.loads(body), "jsonb keeps the value"
        assert item["headers"] == {**headers, "Message-Type": "Event"}, item
    assert_in_order_and_complete(events, records)


def run_example(
    script: str, url: str, group: str, *python_flags: str
) -> subprocess.CompletedProcess[str]:
    """Run one of examples/ against the test's broker and group, for 20 events."""
    return subprocess.run(
        [
            sys.executable,
            *python_flags,
            EXAMPLES / script,
            "--url",
            url,
            "--group",
            group,
            "--count",
            "20",
        ],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


def test_the_example_producer_needs_nothing_of_lbg(
    make_group,
    deployment: LocalDeployment,
    broker: BrokerEndpoint,
    group_name: str,
    recording: Path,
) -> None:
    if broker.kind != "nats":
        pytest.skip("the example producer speaks NATS")
    make_group()
    wait_for_log(start_member(deployment, "client-a"), "joined")
    result = run_example("foreign_producer.py", broker.url, group_name, "-I")
    assert result.returncode == 0, result.stderr
    records = wait_for_records(recording, 20, timeout=20)
    assert len(records) == 20
    assert all(r["headers"].get("source") == "example" for r in records)
    steps = {
        (orjson.loads(r["body"])["order_id"], orjson.loads(r["body"])["step"]) for r in records
    }
    assert steps == {(f"order-{n % 5}", n // 5) for n in range(20)}


def test_the_in_process_example_publishes_and_consumes(
    make_group, broker: BrokerEndpoint, group_name: str
) -> None:
    if broker.kind not in ("nats", "rabbitmq"):
        pytest.skip("the example takes a broker URL only")
    make_group()
    result = run_example("in_process.py", broker.url, group_name)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith("queue ")]
    assert len(lines) >= 20, result.stdout
    for n in range(4):
        mine = [line for line in lines if f"order-{n} #" in line]
        assert [int(line.split("#")[1].split()[0]) for line in mine][:4] == [1, 2, 3, 4]
