"""A group over an existing Message DB category, on a real PostgreSQL: a writer that knows
nothing of lbg (plain `write_message` SQL) fills `account-<id>` streams, two lbg-clients
process every stream once and in order, each message as its writer wrote it."""

import asyncio
import os
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import orjson
import pytest
from tests.support.processes import cli, wait_for_log

from lbg.broker import connect_broker
from lbg.broker.base import UndeliverableEvent
from lbg.devstack.brokers import BrokerEndpoint
from lbg.devstack.deployment import LocalDeployment
from lbg.model.destinations import event_destination
from lbg.model.group import GroupConfig
from lbg.settings import BrokerSettings

WRITE = "SELECT message_store.write_message($1, $2, $3, $4::jsonb, $5::jsonb)"
SEARCH_PATH = {"search_path": "message_store,public"}  # Message DB's functions need it
STREAMS = 30
MESSAGES = 200
RECORDER = '''\
"""Test handler: appends (key, body, headers, client) to $CATEGORY_RECORDS, one line each."""

import os

import orjson


def handle(event, context):
    line = orjson.dumps(
        {
            "key": event.key,
            "body": event.body.decode(),
            "headers": dict(event.headers),
            "client": context.client,
        }
    )
    fd = os.open(os.environ["CATEGORY_RECORDS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line + b"\\n")
    finally:
        os.close(fd)
'''
# Stream ids with compound ('+') parts, non-ASCII and a '-' of their own.
IDS = [[f"{i}", f"{i}+eu", f"ünï{i}+ça+va", f"客户{i}", f"{i}-x"][i % 5] for i in range(STREAMS)]


def _message(n: int) -> tuple[str, str, str, str | None, dict[str, str]]:
    """The n-th message: stream id, type, data and metadata as written, and the headers a
    handler must see (the metadata's fields as text, plus Message-Type)."""
    stream_id = IDS[n % STREAMS]
    kind = "Deposited" if n % 2 else "Withdrawn"
    data = f'{{"n":{n},  "amount": {n}.50, "note":"ü{n}"}}'
    if n % 50 == 7:
        data = '{"text": "looks like our wrapper"}'
    if n % 4 == 0:
        return stream_id, kind, data, None, {"Message-Type": kind}
    metadata = (
        f'{{"correlationStreamName": "teller-{n}", "schemaVersion": 2, "replayed": '
        f'{str(n % 3 == 0).lower()}, "origin": {{"app":"teller","ids":[1,2]}}, "rate": 12.50, '
        '"causationMessageStreamName": null}'
    )
    headers = {
        "correlationStreamName": f"teller-{n}",
        "schemaVersion": "2",
        "replayed": str(n % 3 == 0).lower(),
        "origin": '{"app": "teller", "ids": [1, 2]}',
        "rate": "12.50",
        "causationMessageStreamName": "null",
        "Message-Type": kind,
    }
    return stream_id, kind, data, metadata, headers


async def _write(url: str, category: str, numbers: range) -> dict[int, str]:
    """Write messages with plain SQL; what PostgreSQL returns as each one's data."""
    conn = await asyncpg.connect(url, server_settings=SEARCH_PATH)
    stored = {}
    try:
        for n in numbers:
            stream_id, kind, data, metadata, _ = _message(n)
            message_id = str(uuid.uuid4())
            await conn.execute(WRITE, message_id, f"{category}-{stream_id}", kind, data, metadata)
            stored[n] = await conn.fetchval(
                "SELECT data FROM message_store.messages WHERE id = $1::uuid", message_id
            )
    finally:
        await conn.close()
    return stored


def _sql(url: str, query: str, *args: object) -> object:
    """One value from a query, on a connection of its own."""
    return asyncio.run(_fetchval(url, query, *args))


async def _fetchval(url: str, query: str, *args: object) -> object:
    conn = await asyncpg.connect(url, server_settings=SEARCH_PATH)
    try:
        return await conn.fetchval(query, *args)
    finally:
        await conn.close()


def _records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def _wait_for(path: Path, count: int, deployment: LocalDeployment, timeout: float = 40) -> None:
    deadline = time.monotonic() + timeout
    while len(_records(path)) < count:
        for daemon in deployment.daemons.values():
            assert daemon.running, daemon.log_tail()
        assert time.monotonic() < deadline, f"{len(_records(path))} of {count} handled"
        time.sleep(0.2)


async def _publish_ours(url: str, group: str) -> list[tuple[str, dict[str, str]]]:
    """Events our publisher writes into the category: JSON bodies, our headers kept."""
    broker = await connect_broker(BrokerSettings(url=url), "test-publisher")
    try:
        config = await broker.read_group(group)
        sent = [
            ("ours+1", b'{"ours":1,"x":[1, 2]}', {"Lbg-Seq": "1", "Message-Type": "Opened"}),
            ("ours+1", b'"just a string"', {"Lbg-Seq": "2", "note": "ünï"}),
        ]
        for key, body, headers in sent:
            destination = event_destination(config.hash_prefix, config.bucket_for_key(key), key)
            await broker.publish(destination, body, headers)
        for bad in (b"not json", b"\xff{}", b'{"a":'):
            destination = event_destination(config.hash_prefix, 0, "ours+1")
            with pytest.raises(UndeliverableEvent) as refused:
                await broker.publish(destination, bad, {})
            assert "\n" not in str(refused.value) and "json" in str(refused.value).lower()
    finally:
        await broker.close()
    return [(key, headers) for key, _, headers in sent]


@pytest.fixture
def recorder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "record_handler.py").write_text(RECORDER)
    inherited = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), inherited])))
    records = tmp_path / "records.jsonl"
    monkeypatch.setenv("CATEGORY_RECORDS", str(records))
    return records


@pytest.fixture
def category_group(messagedb: BrokerEndpoint) -> Iterator[tuple[str, str]]:
    """A group over a fresh category `account<random>`: (group, category)."""
    suffix = uuid.uuid4().hex[:8]
    group, category = f"accounts-{suffix}", f"account{suffix}"
    created = cli(
        "cg-admin",
        "--broker-url",
        messagedb.url,
        "create",
        *("--group", group, "--hash-prefix", group, "--category", category),
        *("--hash-count", "24", "--queue-count", "4"),
    )
    assert f'"HF":"messagedb","CA":"{category}"' in created.stdout, created.stdout
    yield group, category
    cli("cg-admin", "--broker-url", messagedb.url, "delete", group, check=False)


def test_two_clients_process_a_category_any_writer_fills_once_and_in_order(
    messagedb: BrokerEndpoint,
    category_group: tuple[str, str],
    recorder: Path,
    tmp_path: Path,
) -> None:
    group, category = category_group
    url = messagedb.url
    half = MESSAGES // 2
    stored = asyncio.run(_write(url, category, range(half)))
    deployment = LocalDeployment(url, group, tmp_path / "daemons")
    try:
        # Dynamic members: the second one is given its share whenever it comes up, where a
        # static one started late under load finds every lock taken and stands by.
        clients = [
            deployment.start(name, "lbg-client", "--id", name, "--handler", "record_handler:handle")
            for name in ("client-a", "client-b")
        ]
        _wait_for(recorder, half // 2, deployment)
        for client in clients:
            wait_for_log(client, "now serves")
        stored |= asyncio.run(_write(url, category, range(half, MESSAGES)))
        ours = asyncio.run(_publish_ours(url, group))
        _wait_for(recorder, MESSAGES + len(ours), deployment)
        time.sleep(1.0)  # nothing more may come
    finally:
        deployment.stop_all()

    records = _records(recorder)
    assert len(records) == MESSAGES + len(ours), "a message was handled twice"
    by_key: dict[str, list[tuple[str, dict]]] = defaultdict(list)
    for record in records:
        by_key[record["key"]].append((record["body"], record["headers"]))
    expected: dict[str, list[tuple[str, dict]]] = defaultdict(list)
    for n in range(MESSAGES):
        stream_id, _, data, _, headers = _message(n)
        assert orjson.loads(stored[n]) == orjson.loads(data)
        expected[stream_id].append((stored[n], headers))
    for stream_id in IDS:
        assert by_key[stream_id] == expected[stream_id], f"stream {category}-{stream_id}"
    assert [headers for _, headers in by_key["ours+1"]] == [headers for _, headers in ours]
    assert [body for body, _ in by_key["ours+1"]] == ['{"x": [1, 2], "ours": 1}', '"just a string"']
    assert {record["client"] for record in records} == {"client-a", "client-b"}

    first = "SELECT type FROM messages WHERE stream_name = $1 AND position = 0"
    assert _sql(url, first, f"{category}-ours+1") == "Opened"
    streams = "SELECT count(DISTINCT stream_name) FROM messages WHERE category(stream_name) = $1"
    assert _sql(url, streams, f"{category}:position") == 0, "a position where Eventide's go"
    assert _sql(url, streams, f"lbg:{group.replace('-', '~')}:position") == 4
    cli("cg-admin", "--broker-url", url, "delete", group)
    in_category = "SELECT count(*) FROM messages WHERE category(stream_name) = $1"
    assert _sql(url, in_category, category) == MESSAGES + len(ours), "delete touched the category"


def test_a_foreign_row_in_a_groups_own_category_yields_its_key_and_data(
    messagedb: BrokerEndpoint,
) -> None:
    async def scenario() -> None:
        group = f"own{uuid.uuid4().hex[:8]}"
        config = GroupConfig(group, 8, 1)
        broker = await connect_broker(BrokerSettings(url=messagedb.url), "test-own")
        await broker.create_group(group, config)
        binding = None
        try:
            await _fetchval(
                messagedb.url,
                "SELECT message_store.write_message($1, $2, 'Opened', $3::jsonb)",
                str(uuid.uuid4()),
                f"lbg:{group}-t3+acct+7",
                '{"text":"x",  "more": 1}',
            )
            binding = await broker.bind(group, config, 0, "client-a")
            delivery = await asyncio.wait_for(binding.next(), 10)
            assert broker.event_address(delivery.subject).key == "acct+7"
            assert delivery.body == b'{"more": 1, "text": "x"}'
            assert delivery.headers == {"Message-Type": "Opened"}
        finally:
            if binding is not None:
                await binding.close()
            await broker.delete_group(group)
            await broker.close()

    asyncio.run(scenario())


def test_a_group_cannot_read_a_category_the_groups_keep_their_own_streams_in(
    messagedb: BrokerEndpoint,
) -> None:
    result = cli(
        "cg-admin",
        *("--broker-url", messagedb.url, "create", "--group", "bad", "--category", "lbg:x"),
        check=False,
    )

    assert result.returncode != 0
    assert result.stderr.strip().count("\n") == 0
    assert "CA (category) 'lbg:x'" in result.stderr
