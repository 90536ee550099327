"""The Message DB reader's positions: acked in order, and recorded without falling behind."""

from hypothesis import given
from hypothesis import strategies as st

from lbg.broker.messagedb.positions import Positions


def handed_out(*positions: int, recorded: int = 0) -> Positions:
    tracker = Positions()
    tracker.start(recorded)
    for position in positions:
        tracker.hand_out(position)
    return tracker


def test_only_positions_acked_in_order_are_done() -> None:
    tracker = handed_out(3, 5, 8)
    tracker.ack(5)
    assert tracker.due() is None, "5 is acked but 3 is not"
    tracker.ack(3)
    assert tracker.due() == 5 and not tracker.all_acked
    tracker.ack(8)
    assert tracker.due() == 8 and tracker.all_acked


def test_acks_that_land_during_a_write_stay_due() -> None:
    tracker = handed_out(10, 11, 12)
    tracker.ack(10)
    writing = tracker.due()
    tracker.ack(11)  # lands while the write of 10 is in flight
    tracker.ack(12)
    tracker.wrote(writing)
    assert tracker.recorded == 10
    assert tracker.due() == 12, "the stream holds 10: 11 and 12 must still be recorded"


def test_a_new_stint_resumes_after_the_recorded_position_and_forgets_the_old_one() -> None:
    tracker = handed_out(1, 2)
    tracker.ack(2)
    tracker.start(7)
    assert (tracker.done, tracker.fetched, tracker.recorded, tracker.outstanding) == (7, 7, 7, 0)
    assert tracker.due() is None


@given(st.data(), st.lists(st.integers(1, 5), min_size=1, max_size=30, unique=True))
def test_whatever_the_order_of_acks_and_writes_the_stream_ends_at_the_last_position(
    data: st.DataObject, gaps: list[int]
) -> None:
    positions = [sum(gaps[: i + 1]) for i in range(len(gaps))]
    tracker = handed_out(*positions)
    stream = 0
    in_flight: list[int] = []
    for position in data.draw(st.permutations(positions)):
        tracker.ack(position)
        if data.draw(st.booleans()) and (due := tracker.due()) is not None:
            in_flight.append(due)  # a write starts; it may finish after later acks
        if in_flight and data.draw(st.booleans()):
            written = in_flight.pop(0)
            stream = written
            tracker.wrote(written)
        assert stream <= tracker.done, "recorded past an unacked position"
    for written in in_flight:
        stream = written
        tracker.wrote(written)
    if (due := tracker.due()) is not None:
        stream = due
        tracker.wrote(due)
    assert stream == positions[-1] == tracker.recorded
