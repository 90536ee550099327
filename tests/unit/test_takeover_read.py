"""What a queue taken over or handed over does with the parked keys: the registry read starts
at the takeover, and a replay left unstarted at a handover is handed out again."""

import asyncio

from lbg.client.parking import KeyParking
from lbg.model.parking import parked, replay_requested


class SlowLot:
    """A parking lot whose registry reads each wait for `gate`, counted."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.reads = 0

    async def records(self, current: bool = True) -> dict[str, bytes]:
        self.reads += 1
        await self.gate.wait()
        return {"k": parked("k", "why", 1, "member-1").to_json()}


class LotBroker:
    def __init__(self, lot: SlowLot) -> None:
        self.lot = lot

    def parking(self, group: str) -> SlowLot:
        return self.lot


def test_the_read_started_at_takeover_is_the_one_awaited() -> None:
    async def scenario() -> tuple[int, bool]:
        lot = SlowLot()
        parking = KeyParking(LotBroker(lot), "g", "member-2")  # type: ignore[arg-type]
        parking.start_takeover_read(3)
        await asyncio.sleep(0)
        assert lot.reads == 1
        lot.gate.set()
        await asyncio.wait_for(parking.takeover_read(3), 1)
        return lot.reads, parking.is_parked("k")

    assert asyncio.run(scenario()) == (1, True)


def test_a_queue_lost_before_its_first_event_lets_its_read_finish_and_reads_anew() -> None:
    """Not cancelled: a read cancelled halfway could leave the broker's reader half set up."""

    async def scenario() -> tuple[bool, int]:
        lot = SlowLot()
        parking = KeyParking(LotBroker(lot), "g", "member-2")  # type: ignore[arg-type]
        parking.start_takeover_read(3)
        await asyncio.sleep(0)
        parking.drop_takeover_read(3)
        lot.gate.set()
        await asyncio.sleep(0.01)
        finished = parking.is_parked("k")
        await asyncio.wait_for(parking.takeover_read(3), 1)
        return finished, lot.reads

    assert asyncio.run(scenario()) == (True, 2)


def test_a_replay_left_unstarted_at_a_handover_is_handed_out_again() -> None:
    lot = SlowLot()
    parking = KeyParking(LotBroker(lot), "g", "member-2")  # type: ignore[arg-type]
    parking.records = {
        key: replay_requested(parked(key, "why", 1, "member-1"), "operator", 0) for key in "ab"
    }
    queue_of = {"a": 3, "b": 4}.get

    assert parking.replays_due(lambda key: True) == ["a", "b"]
    parking.forget_unstarted_replays(queue_of, 3)

    assert parking.replays_due(lambda key: True) == ["a"]
