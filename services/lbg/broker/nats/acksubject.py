"""What a JetStream delivery's ack subject says about it, read without nats-py's `Msg.metadata`
(which parses every field and builds a datetime for each message).

`$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>` without a domain;
with one, the domain and the account hash come before the stream (nats-py's `Msg.Ack`).
"""

from __future__ import annotations

from nats.aio.msg import Msg

V1_TOKENS = 9
V1_DELIVERED = 4
V1_STREAM_SEQ = 5
V1_CONSUMER_SEQ = 6
V1_TIMESTAMP = 7
NANOS = 1_000_000_000


def _field(reply: str, v1_index: int, v2_index: int) -> int | None:
    tokens = reply.split(".")
    try:
        return int(tokens[v1_index if len(tokens) == V1_TOKENS else v2_index])
    except (IndexError, ValueError):
        return None


def delivery_count(reply: str) -> int:
    """How often the server has delivered the message; 1 if the subject is not an ack subject."""
    return _field(reply, V1_DELIVERED, Msg.Ack.NumDelivered) or 1


def stream_sequence(reply: str) -> int:
    """The message's stream sequence; 0 if the subject is not an ack subject."""
    return _field(reply, V1_STREAM_SEQ, Msg.Ack.StreamSeq) or 0


def consumer_sequence(reply: str) -> int | None:
    """The consumer's delivery counter for this delivery; None if not an ack subject."""
    return _field(reply, V1_CONSUMER_SEQ, Msg.Ack.ConsumerSeq)


def stored_at(reply: str) -> float | None:
    """When the stream stored the message, in epoch seconds; None if not an ack subject."""
    nanos = _field(reply, V1_TIMESTAMP, Msg.Ack.Timestamp)
    return nanos / NANOS if nanos is not None else None
