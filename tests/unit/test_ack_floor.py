"""Cumulative acks: the floor names a delivery only once every earlier one of the stint
finished, and one turn of the event loop sends one ack however many finished in it."""

import asyncio

from hypothesis import given
from hypothesis import strategies as st

from lbg.broker.ackfloor import AckFloor, FloorAcks
from lbg.broker.nats.acksubject import stream_sequence


def reply(sequence: int, delivered: int = 1) -> str:
    return f"$JS.ACK.LBG_g.q0.{delivered}.{sequence}.{sequence}.1700000000000000000.0"


def test_the_floor_waits_for_the_first_unfinished_delivery() -> None:
    floor = AckFloor(stream_sequence)
    for sequence in (3, 5, 8):
        floor.delivered(reply(sequence))
    assert not floor.finish(reply(5))
    assert not floor.finish(reply(8))
    assert floor.take() is None
    assert floor.finish(reply(3))
    assert floor.take() == reply(8)
    assert floor.take() is None


def test_a_redelivery_behind_later_sequences_does_not_lower_the_ack() -> None:
    floor = AckFloor(stream_sequence)
    for item in (reply(4), reply(9), reply(4, delivered=2)):
        floor.delivered(item)
    for item in (reply(4, delivered=2), reply(9), reply(4)):
        floor.finish(item)
    assert floor.take() == reply(9)


@given(st.permutations(range(1, 30)), st.integers(0, 29), st.data())
def test_no_ack_ever_covers_an_unfinished_delivery(
    finish_order: list[int], finished_count: int, data: st.DataObject
) -> None:
    """Delivery tags in arrival order (AMQP's `multiple` acks every tag up to the one sent)."""
    floor: AckFloor[int] = AckFloor(lambda tag: tag)
    for tag in range(1, 30):
        floor.delivered(tag)
    finished: set[int] = set()
    acked = 0
    for tag in finish_order[:finished_count]:
        floor.finish(tag)
        finished.add(tag)
        if data.draw(st.booleans()) and (taken := floor.take()) is not None:
            assert taken > acked
            acked = taken
            assert set(range(1, acked + 1)) <= finished
    contiguous = next((t for t in range(1, 30) if t not in finished), 30) - 1
    final = floor.take()
    assert (final if final is not None else acked) == contiguous


def test_one_ack_per_turn_of_the_loop_and_none_for_a_dropped_stint() -> None:
    sent: list[int] = []

    async def send(tag: int) -> None:
        sent.append(tag)

    async def scenario() -> None:
        acks: FloorAcks[int] = FloorAcks(0, lambda tag: tag, send)
        for tag in range(1, 6):
            acks.delivered(tag)
        for tag in (2, 1, 3):
            acks.finish(tag)
        await asyncio.sleep(0.01)
        assert sent == [3]
        acks.finish(5)
        acks.restart()
        acks.finish(4)
        await asyncio.sleep(0.01)
        assert sent == [3]
        acks.delivered(1)
        acks.finish(1)
        await acks.flush()
        assert sent == [3, 1]

    asyncio.run(scenario())


@given(st.sets(st.integers(1, 20)))
def test_a_closing_stint_acks_exactly_what_it_finished(finished: set[int]) -> None:
    """Before a handover closes the channel: the floor in one ack, each finished delivery
    above it alone, nothing unfinished (those still waiting go to the next owner)."""
    floor_acks: list[int] = []
    single_acks: list[int] = []

    async def send(tag: int) -> None:
        floor_acks.append(tag)

    async def send_one(tag: int) -> None:
        single_acks.append(tag)

    async def scenario() -> None:
        acks: FloorAcks[int] = FloorAcks(0, lambda tag: tag, send, send_one)
        for tag in range(1, 21):
            acks.delivered(tag)
        for tag in sorted(finished):
            acks.finish(tag)
        await asyncio.sleep(0.01)  # the floor's own ack, sent at the end of the turn
        await acks.flush(every_finished=True)
        await acks.flush(every_finished=True)  # a second flush sends nothing again

    asyncio.run(scenario())
    floor = max(floor_acks, default=0)
    assert set(range(1, floor + 1)) | set(single_acks) == finished
    assert all(tag > floor for tag in single_acks) and len(set(single_acks)) == len(single_acks)


@given(st.permutations(range(1, 20)), st.integers(0, 19))
def test_a_floor_is_settled_once_every_delivery_finished_and_its_ack_was_taken(
    finish_order: list[int], finished_count: int
) -> None:
    """What a quiet NATS owner checks before it gives its pin back: nothing it was sent is
    unfinished, and no ack waits to be sent."""
    floor = AckFloor(stream_sequence)
    assert floor.settled
    for sequence in range(1, 20):
        floor.delivered(reply(sequence))
    for sequence in finish_order[:finished_count]:
        floor.finish(reply(sequence))
    assert not floor.settled
    for sequence in finish_order[finished_count:]:
        floor.finish(reply(sequence))
    assert not floor.settled, "settled with the floor's ack not yet taken"
    floor.take()
    assert floor.settled
