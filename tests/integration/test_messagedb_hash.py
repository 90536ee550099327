"""The `messagedb` hash function selects exactly the consumer-group members that the installed
Message DB's own SQL selects, and the adapter's streams land on the member of their queue."""

import asyncio
import uuid

import asyncpg
import pytest

from lbg.broker.messagedb import naming
from lbg.devstack.brokers import BrokerEndpoint
from lbg.model.group import GroupConfig
from lbg.model.hashing import messagedb_bucket

STREAMS = [
    "account-123",
    "account-123+deposit",
    "account:command-42",
    "order-a-b-c",
    "cat-+compound",
    "unicode-ÿ😀",
    *(f"thing-{uuid.UUID(int=i * 7919)}" for i in range(300)),
]
SIZES = [1, 2, 3, 4, 7, 12, 100, 32767]


@pytest.fixture(scope="module")
def messagedb_url(messagedb: BrokerEndpoint) -> str:
    return messagedb.url


async def _members_by_sql(url: str, streams: list[str], size: int) -> list[int]:
    """Ask the installed functions which member of a group of `size` reads each stream."""
    conn = await asyncpg.connect(url, server_settings={"search_path": "message_store,public"})
    try:
        rows = await conn.fetch(
            "SELECT MOD(@message_store.hash_64(message_store.cardinal_id(s)), $2::smallint) AS m "
            "FROM unnest($1::text[]) WITH ORDINALITY AS t(s, i) ORDER BY i",
            streams,
            size,
        )
    finally:
        await conn.close()
    return [int(row["m"]) for row in rows]


@pytest.mark.parametrize("size", SIZES)
def test_messagedb_bucket_matches_the_installed_sql(messagedb_url: str, size: int) -> None:
    expected = asyncio.run(_members_by_sql(messagedb_url, STREAMS, size))
    assert [messagedb_bucket(s, size) for s in STREAMS] == expected


async def _read_members(url: str, category: str, size: int) -> dict[str, int]:
    """Which member's get_category_messages returns each written stream."""
    conn = await asyncpg.connect(url, server_settings={"search_path": "message_store,public"})
    try:
        seen: dict[str, int] = {}
        for member in range(size):
            rows = await conn.fetch(
                "SELECT stream_name FROM message_store.get_category_messages"
                "($1, 1, -1, NULL, $2, $3)",
                category,
                member,
                size,
            )
            for row in rows:
                assert row["stream_name"] not in seen, "a stream was read by two members"
                seen[row["stream_name"]] = member
        return seen
    finally:
        await conn.close()


async def _write(url: str, streams: list[str]) -> None:
    conn = await asyncpg.connect(url, server_settings={"search_path": "message_store,public"})
    try:
        for stream in streams:
            await conn.execute(
                "SELECT message_store.write_message($1, $2, 'Event', '{}'::jsonb)",
                str(uuid.uuid4()),
                stream,
            )
    finally:
        await conn.close()


@pytest.mark.parametrize(
    ("function", "hash_count", "queue_count"),
    [("messagedb", 24, 6), ("java", 24, 6), ("murmur2", 24, 6), ("java", 10, 3)],
)
def test_event_streams_are_read_by_the_member_of_their_queue(
    messagedb_url: str, function: str, hash_count: int, queue_count: int
) -> None:
    prefix = f"h{uuid.uuid4().hex[:8]}"
    config = GroupConfig(prefix, hash_count, queue_count, hash_function=function)
    keys = [f"{uuid.uuid4()}/{uuid.uuid4()}" for _ in range(200)] + ["acct-7+x", "a-b"]
    streams = {naming.event_stream(config, config.bucket_for_key(k), k): k for k in keys}
    asyncio.run(_write(messagedb_url, list(streams)))
    category = naming.event_category(prefix)
    members = asyncio.run(_read_members(messagedb_url, category, queue_count))
    assert set(members) == set(streams)
    for stream, member in members.items():
        assert member == config.queue_for_key(streams[stream]), stream


def test_a_messagedb_group_whose_queue_count_does_not_divide_the_hash_count_is_refused() -> None:
    naming.check_layout(GroupConfig("p", 10, 4))
    with pytest.raises(naming.LayoutError, match=r"HC \(hash count\) 10 .* QC \(queue count\) 4"):
        naming.check_layout(GroupConfig("p", 10, 4, hash_function="messagedb"))
