"""Event ids (JetStream's `Nats-Msg-Id`, Message DB's message id): a resent event is dropped,
a different event never is."""

from hypothesis import given
from hypothesis import strategies as st

from lbg.model.messages import SEQ_HEADER, TIME_HEADER, event_digest

SUBJECT = "orders.3.order-7"
seqs = st.integers(min_value=1, max_value=2**40).map(str)
times = st.floats(min_value=0, max_value=4e9, allow_nan=False).map(lambda t: f"{t:.6f}")
bodies = st.binary(max_size=64)


@given(seqs, times, times, bodies)
def test_a_sequenced_event_sent_again_later_has_the_same_id(
    seq: str, first: str, again: str, body: bytes
) -> None:
    """A retried Spark task resends (key, seq) with a new publish time: the stream drops it."""
    sent = event_digest(SUBJECT, {SEQ_HEADER: seq, TIME_HEADER: first}, body)
    resent = event_digest(SUBJECT, {SEQ_HEADER: seq, TIME_HEADER: again}, body)
    assert sent == resent


@given(seqs, seqs, times, bodies)
def test_two_sequences_of_one_key_never_share_an_id(
    seq: str, other: str, at: str, body: bytes
) -> None:
    if seq != other:
        assert event_digest(SUBJECT, {SEQ_HEADER: seq, TIME_HEADER: at}, body) != event_digest(
            SUBJECT, {SEQ_HEADER: other, TIME_HEADER: at}, body
        )


@given(times, times, bodies)
def test_without_a_sequence_the_time_tells_equal_bodies_apart(
    first: str, second: str, body: bytes
) -> None:
    if first != second:
        assert event_digest(SUBJECT, {TIME_HEADER: first}, body) != event_digest(
            SUBJECT, {TIME_HEADER: second}, body
        )


@given(seqs, bodies, bodies)
def test_the_body_and_subject_count(seq: str, body: bytes, other: bytes) -> None:
    headers = {SEQ_HEADER: seq}
    if body != other:
        assert event_digest(SUBJECT, headers, body) != event_digest(SUBJECT, headers, other)
    assert event_digest(SUBJECT, headers, body) != event_digest("orders.3.order-8", headers, body)
