"""What a JetStream ack subject says: the redelivery count and the stream sequence."""

import pytest

from lbg.broker.nats.acksubject import (
    consumer_sequence,
    delivery_count,
    stored_at,
    stream_sequence,
)


@pytest.mark.parametrize(
    ("reply", "count"),
    [
        ("$JS.ACK.LBG_g.q0.1.10.7.1700000000000000000.5", 1),
        ("$JS.ACK.LBG_g.q0.3.10.7.1700000000000000000.5", 3),
        ("$JS.ACK._.ACCHASH.LBG_g.q0.2.10.7.1700000000000000000.5.token", 2),
        ("", 1),
        ("_INBOX.abc", 1),
    ],
)
def test_delivery_count_reads_the_delivered_token(reply: str, count: int) -> None:
    assert delivery_count(reply) == count


def test_stream_sequence_reads_both_formats() -> None:
    assert stream_sequence("$JS.ACK.LBG_g.q0.1.10.7.1700000000000000000.5") == 10
    assert stream_sequence("$JS.ACK._.ACCHASH.LBG_g.q0.2.11.7.1700000000000000000.5.t") == 11
    assert stream_sequence("_INBOX.abc") == 0


def test_stored_at_is_the_ack_subjects_timestamp_in_seconds() -> None:
    assert stored_at("$JS.ACK.LBG_g.q0.1.10.7.1700000000500000000.5") == 1700000000.5
    assert stored_at("_INBOX.abc") is None


def test_consumer_sequence_reads_both_formats() -> None:
    assert consumer_sequence("$JS.ACK.LBG_g.q0.1.10.7.1700000000000000000.5") == 7
    assert consumer_sequence("$JS.ACK._.ACCHASH.LBG_g.q0.2.11.8.1700000000000000000.5.t") == 8
    assert consumer_sequence("_INBOX.abc") is None
