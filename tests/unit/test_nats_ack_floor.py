"""The AckAll floor: it names a delivery only once every earlier one of the stint finished."""

from lbg.broker.nats.ackfloor import AckFloor


def reply(sequence: int, delivered: int = 1) -> str:
    return f"$JS.ACK.LBG_g.q0.{delivered}.{sequence}.{sequence}.1700000000000000000.0"


def test_the_floor_waits_for_the_first_unfinished_delivery() -> None:
    floor = AckFloor()
    for sequence in (3, 5, 8):
        floor.delivered(reply(sequence))
    assert not floor.finish(reply(5))
    assert not floor.finish(reply(8))
    assert floor.take() is None
    assert floor.finish(reply(3))
    assert floor.take() == reply(8)
    assert floor.take() is None


def test_a_redelivery_behind_later_sequences_does_not_lower_the_ack() -> None:
    floor = AckFloor()
    for item in (reply(4), reply(9), reply(4, delivered=2)):
        floor.delivered(item)
    for item in (reply(4, delivered=2), reply(9), reply(4)):
        floor.finish(item)
    assert floor.take() == reply(9)
