"""The LBG group configuration: JSON form, validation and bucket striping."""

import itertools

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lbg.model.group import (
    MAX_GENERATION,
    MAX_QUEUE_SIZE_MB,
    MAX_REPLICAS,
    GroupConfig,
    GroupConfigError,
    validate_group_name,
)
from lbg.model.hashing import bucket_for, messagedb_bucket

ORIGINAL = '{"HP":"hash1","HC":100,"QC":12,"QS":100,"CU":"lg_cu1","CP":"pw12345"}'


def test_original_json_parses_and_drops_the_password() -> None:
    config = GroupConfig.from_json(ORIGINAL)
    assert config == GroupConfig(
        hash_prefix="hash1",
        hash_count=100,
        queue_count=12,
        queue_size_mb=100,
        client_username="lg_cu1",
        hash_function="java",
        exclusive=True,
    )
    assert "pw12345" not in config.to_json()
    assert "CP" not in config.to_json()


def test_from_json_accepts_bytes_and_applies_defaults() -> None:
    config = GroupConfig.from_json(b'{"HP":"h","HC":4,"QC":2}')
    assert (config.queue_size_mb, config.client_username) == (100, "lbg-client")
    assert (config.hash_function, config.exclusive) == ("java", True)


def test_to_json_is_compact_and_ordered() -> None:
    config = GroupConfig("hash1", 100, 12, 100, "lg_cu1", "murmur2")
    assert config.to_json() == (
        '{"HP":"hash1","HC":100,"QC":12,"QS":100,"CU":"lg_cu1","HF":"murmur2"}'
    )


def test_to_json_writes_ex_only_when_not_exclusive() -> None:
    config = GroupConfig("h", 4, 2, exclusive=False)
    assert config.to_json().endswith(',"HF":"java","EX":0}')
    assert GroupConfig.from_json(config.to_json()).exclusive is False
    assert GroupConfig.from_json('{"HP":"h","HC":4,"QC":2,"EX":1}').exclusive is True


def test_longest_valid_config_fits_the_jndi_physical_name_limit() -> None:
    config = GroupConfig(
        "h" * 40,
        100_000,
        1,
        MAX_QUEUE_SIZE_MB,
        "u" * 32,
        "messagedb",
        False,
        MAX_REPLICAS,
        MAX_GENERATION,
    )
    assert len(config.to_json()) == 169


def test_to_json_writes_rf_only_when_replicated() -> None:
    assert '"RF"' not in GroupConfig("h", 4, 2).to_json()
    config = GroupConfig("h", 4, 2, replicas=3)
    assert config.to_json().endswith(',"RF":3}')
    assert GroupConfig.from_json(config.to_json()).replicas == 3


def test_to_json_writes_gn_only_once_resized() -> None:
    assert '"GN"' not in GroupConfig("h", 4, 2).to_json()
    config = GroupConfig("h", 4, 2, generation=7)
    assert config.to_json().endswith(',"GN":7}')
    assert GroupConfig.from_json(config.to_json()).generation == 7


@pytest.mark.parametrize("generation", [-1, MAX_GENERATION + 1, "2", True])
def test_a_generation_outside_its_range_is_refused_naming_gn(generation: object) -> None:
    with pytest.raises(GroupConfigError, match=r"^GN \(size generation\): "):
        GroupConfig("h", 4, 2, generation=generation)  # type: ignore[arg-type]


@pytest.mark.parametrize("replicas", [0, MAX_REPLICAS + 1, "3", True])
def test_replicas_outside_one_to_five_are_refused_naming_rf(replicas: object) -> None:
    with pytest.raises(GroupConfigError, match=r"^RF \(replicas\): "):
        GroupConfig("h", 4, 2, replicas=replicas)  # type: ignore[arg-type]


def test_to_json_refuses_json_longer_than_the_jndi_physical_name_limit() -> None:
    # No validated config exceeds 200 characters today; bypass validation to exercise the guard.
    config = GroupConfig("h", 4, 2)
    object.__setattr__(config, "client_username", "u" * 200)
    with pytest.raises(
        GroupConfigError,
        match=r"200-character limit of the Solace JNDI physical name, got 253 characters$",
    ):
        config.to_json()


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"hash_prefix": ""}, r"^HP \(hash prefix\)"),
        ({"hash_prefix": "_sys"}, r"^HP \(hash prefix\)"),
        ({"hash_prefix": "a.b"}, r"^HP \(hash prefix\)"),
        ({"hash_prefix": "a" * 41}, r"^HP \(hash prefix\)"),
        ({"hash_count": 2, "queue_count": 4}, r"^HC \(hash count\): must be >= QC \(4\), got 2$"),
        ({"hash_count": 100_001}, r"^HC \(hash count\): must be <= 100000"),
        ({"hash_count": True}, r"^HC \(hash count\): must be an integer, got True"),
        ({"queue_count": 0}, r"^QC \(queue count\): must be >= 1, got 0"),
        ({"queue_size_mb": 0}, r"^QS \(queue size MB\): must be >= 1"),
        ({"queue_size_mb": 2**43}, r"^QS \(queue size MB\): must be <= 2199023255551 with QC 4"),
        ({"client_username": ""}, r"^CU \(client username\)"),
        ({"client_username": "a b"}, r"^CU \(client username\)"),
        ({"client_username": "u" * 33}, r"^CU \(client username\)"),
        ({"hash_function": "crc32"}, r"^HF \(hash function\): must be one of java, murmur2"),
        ({"exclusive": 1}, r"^EX \(exclusive\)"),
    ],
)
def test_invalid_field_is_named(fields: dict[str, object], message: str) -> None:
    arguments: dict[str, object] = {"hash_prefix": "h", "hash_count": 8, "queue_count": 4}
    arguments.update(fields)
    with pytest.raises(GroupConfigError, match=message):
        GroupConfig(**arguments)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[1, 2]", r"^group config JSON: must be a JSON object"),
        ("{not json", r"^group config JSON: not valid JSON"),
        ('{"HC":4,"QC":2}', r"^HP \(hash prefix\): missing"),
        ('{"HP":"h","QC":2}', r"^HC \(hash count\): missing"),
        ('{"HP":"h","HC":4}', r"^QC \(queue count\): missing"),
        ('{"HP":"h","HC":"ten","QC":2}', r"^HC \(hash count\): must be an integer, got 'ten'"),
        ('{"HP":"h","HC":true,"QC":2}', r"^HC \(hash count\): must be an integer, got True"),
        ('{"HP":"h","HC":4.0,"QC":2}', r"^HC \(hash count\): must be an integer"),
        ('{"HP":7,"HC":4,"QC":2}', r"^HP \(hash prefix\)"),
        ('{"HP":"h","HC":4,"QC":2,"QS":"big"}', r"^QS \(queue size MB\)"),
        ('{"HP":"h","HC":4,"QC":2,"EX":2}', r"^EX \(exclusive\): must be 0 or 1"),
        ('{"HP":"h","HC":4,"QC":2,"XX":1}', r"^XX: unknown key"),
    ],
)
def test_invalid_json_is_named(text: str, message: str) -> None:
    with pytest.raises(GroupConfigError, match=message):
        GroupConfig.from_json(text)


def test_password_never_appears_in_errors() -> None:
    with pytest.raises(GroupConfigError) as caught:
        GroupConfig.from_json('{"HP":"h","HC":"x","QC":2,"CP":"s3cret"}')
    assert "s3cret" not in str(caught.value)


@pytest.mark.parametrize("name", ["a", "group-1", "G_2", "9" * 64])
def test_valid_group_names(name: str) -> None:
    assert validate_group_name(name) == name


@pytest.mark.parametrize("name", ["", "-a", "_a", "a b", "a.b", "a" * 65, "é"])
def test_invalid_group_names(name: str) -> None:
    with pytest.raises(GroupConfigError, match=r"^group name"):
        validate_group_name(name)


name_chars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-"


@st.composite
def configs(draw: st.DrawFn) -> GroupConfig:
    queue_count = draw(st.integers(min_value=1, max_value=300))
    return GroupConfig(
        hash_prefix=draw(
            st.text(name_chars, min_size=1, max_size=40).filter(lambda s: s[0] != "_")
        ),
        hash_count=draw(st.integers(min_value=queue_count, max_value=2000)),
        queue_count=queue_count,
        queue_size_mb=draw(st.integers(min_value=1, max_value=10**9)),
        client_username=draw(st.text(name_chars + ".@", min_size=1, max_size=32)),
        hash_function=draw(st.sampled_from(["java", "murmur2", "messagedb"])),
        exclusive=draw(st.booleans()),
    )


@given(configs())
def test_json_round_trip(config: GroupConfig) -> None:
    text = config.to_json()
    assert GroupConfig.from_json(text) == config
    assert list(orjson.loads(text))[:6] == ["HP", "HC", "QC", "QS", "CU", "HF"]


@given(configs())
def test_queues_partition_the_buckets(config: GroupConfig) -> None:
    lists = [config.buckets_for_queue(q) for q in range(config.queue_count)]
    every = sorted(bucket for buckets in lists for bucket in buckets)
    assert every == list(range(config.hash_count))
    for queue, buckets in enumerate(lists):
        assert buckets[0] == queue
        assert all(b - a == config.queue_count for a, b in itertools.pairwise(buckets))
        assert all(config.queue_for_bucket(bucket) == queue for bucket in buckets)
    sizes = [len(buckets) for buckets in lists]
    assert max(sizes) - min(sizes) <= 1


def test_original_striping() -> None:
    config = GroupConfig.from_json(ORIGINAL)
    assert config.buckets_for_queue(0) == [0, 12, 24, 36, 48, 60, 72, 84, 96]
    assert config.buckets_for_queue(11) == [11, 23, 35, 47, 59, 71, 83, 95]


@pytest.mark.parametrize("queue", [-1, 12])
def test_buckets_for_queue_rejects_unknown_queue(queue: int) -> None:
    with pytest.raises(ValueError, match=f"queue {queue} is outside 0..11"):
        GroupConfig.from_json(ORIGINAL).buckets_for_queue(queue)


@pytest.mark.parametrize("bucket", [-1, 100])
def test_queue_for_bucket_rejects_unknown_bucket(bucket: int) -> None:
    with pytest.raises(ValueError, match=f"bucket {bucket} is outside 0..99"):
        GroupConfig.from_json(ORIGINAL).queue_for_bucket(bucket)


@given(configs(), st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=30))
def test_key_routing_follows_the_hash_function(config: GroupConfig, key: str) -> None:
    key = "stream-" + key
    bucket = bucket_for(config.hash_function, key, config.hash_count)
    assert config.bucket_for_key(key) == bucket
    assert config.queue_for_key(key) == bucket % config.queue_count


def test_a_group_over_a_category_stores_it_and_hashes_keys_as_its_streams() -> None:
    config = GroupConfig("accounts", 12, 4, hash_function="messagedb", category="account:command")
    assert config.to_json().endswith(',"HF":"messagedb","CA":"account:command"}')
    assert GroupConfig.from_json(config.to_json()) == config
    for key in ("123", "123+x", "12-3", "ünïcode+1"):
        stream_bucket = messagedb_bucket(f"account:command-{key}", 12)
        assert config.bucket_for_key(key) == stream_bucket
        assert config.bucket_for_key(key) == messagedb_bucket(f"other-{key.partition('+')[0]}", 12)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"category": "account"}, r"^HF \(hash function\): must be messagedb in a group over a"),
        ({"category": "account", "hash_function": "murmur2"}, r"^HF \(hash function\): "),
        ({"category": "acc-ount", "hash_function": "messagedb"}, r"^CA \(category\): must be "),
        ({"category": "", "hash_function": "messagedb"}, r"^CA \(category\): must be "),
        (
            {"category": "a" * 64, "hash_function": "messagedb", "client_username": "u" * 32},
            r"^CA \(category\): with it the config JSON is 2\d\d characters, over the 200",
        ),
    ],
)
def test_a_group_over_a_category_is_refused_naming_the_field(
    fields: dict[str, object], message: str
) -> None:
    with pytest.raises(GroupConfigError, match=message):
        GroupConfig("h" * 40, 64, 4, **fields)
