"""How groups map onto Message DB names and data, without a database."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lbg.broker.messagedb import naming
from lbg.destinations import event_destination
from lbg.group import GroupConfig
from lbg.hashing import messagedb_bucket


@given(st.binary(max_size=300))
def test_any_body_survives_the_jsonb_data_round_trip(body: bytes) -> None:
    assert naming.decode_data(naming.encode_data(body)) == body


def test_text_bodies_stay_readable_in_the_database() -> None:
    assert naming.encode_data(b'{"k":"a","s":1}') == '{"text":"{\\"k\\":\\"a\\",\\"s\\":1}"}'
    assert "base64" in naming.encode_data(b"a\x00b")


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


def test_subject_is_spelled_like_the_other_brokers() -> None:
    assert naming.subject(event_destination("hp", 3, "a.b c")) == "hp.3.a%2Eb%20c"
