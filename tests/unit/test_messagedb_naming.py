"""How groups map onto Message DB names, and keys back out of them, without a database."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lbg.broker.messagedb import naming
from lbg.model.group import GroupConfig
from lbg.model.hashing import messagedb_bucket


@pytest.mark.parametrize(("hash_count", "queue_count"), [(32, 4), (10, 3), (64, 64), (7, 1)])
def test_every_bucket_tag_hashes_to_its_bucket_and_queue(hash_count: int, queue_count: int) -> None:
    config = GroupConfig("p", hash_count, queue_count)
    tags = naming.bucket_tags(hash_count, naming.tag_modulus(config))
    assert len(tags) == len(set(tags)) == hash_count
    for bucket, tag in enumerate(tags):
        assert messagedb_bucket(f"x-{tag}", hash_count) == bucket
        assert messagedb_bucket(f"x-{tag}", queue_count) == config.queue_for_bucket(bucket)


def test_names_keep_message_db_categories_apart_from_ids() -> None:
    config = GroupConfig("my-prefix", 8, 2, hash_function="messagedb")
    stream = naming.event_stream(config, config.bucket_for_key("acct-12+x"), "acct-12+x")
    assert stream == "lbg:my~prefix-12+acct-12+x"
    assert stream.partition("-")[0] == naming.event_category("my-prefix")
    assert naming.position_stream("my-prefix", 1) == "lbg:my~prefix:position-1"
    assert naming.config_stream("g-1") == "lbgconfig-g-1"
    assert naming.group_of_config_stream("lbgconfig-g-1") == "g-1"


keys = st.text(st.characters(exclude_characters="\x00", exclude_categories=["Cs"]), min_size=1)


@given(keys, st.sampled_from(["java", "murmur2", "messagedb"]), st.sampled_from(["p", "a-b"]))
def test_the_key_reads_back_from_its_stream_in_a_groups_own_category(
    key: str, hash_function: str, prefix: str
) -> None:
    config = GroupConfig(prefix, 12, 4, hash_function=hash_function)
    if hash_function == "messagedb":  # its keys are stream names
        key = f"account-{key}"
    stream = naming.event_stream(config, config.bucket_for_key(key), key)
    assert naming.key_of_stream(stream) == key


@given(st.from_regex(r"[a-z][A-Za-z0-9:+]{0,15}", fullmatch=True), keys)
def test_the_key_of_another_writers_stream_is_its_id(category: str, stream_id: str) -> None:
    assert naming.key_of_stream(f"{category}-{stream_id}") == stream_id


def test_a_stream_in_a_groups_category_without_a_cardinal_id_keeps_its_whole_id() -> None:
    assert naming.key_of_stream("lbg:p-123") == "123"
    assert naming.key_of_stream("lbg:p-t7+account-1+x") == "account-1+x"
    assert naming.key_of_stream("account") == ""


def test_a_group_over_a_category_writes_and_reads_it_and_keeps_its_own_names() -> None:
    config = GroupConfig("acc-1", 12, 4, hash_function="messagedb", category="account")
    assert naming.event_stream(config, config.bucket_for_key("12+eu"), "12+eu") == "account-12+eu"
    assert naming.source_category(config) == "account"
    assert naming.source_category(GroupConfig("acc-1", 12, 4)) == "lbg:acc~1"
    assert naming.position_stream(config.hash_prefix, 3) == "lbg:acc~1:position-3"
    assert messagedb_bucket("account-12+eu", 4) == config.queue_for_key("12+eu")
    naming.check_layout(config)


@pytest.mark.parametrize("category", ["lbg:x", "lbgout:g", "lbgconfig"])
def test_a_group_cannot_read_the_groups_own_categories(category: str) -> None:
    config = GroupConfig("p", 12, 4, hash_function="messagedb", category=category)
    with pytest.raises(naming.LayoutError, match=rf"^CA \(category\) '{category}' is where"):
        naming.check_layout(config)
