"""The redelivery count read from a JetStream ack subject, in both of its formats."""

import pytest

from lbg.broker.nats.binding import delivery_count


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
