"""A RabbitMQ standby that is not preferred counts the queue's consumers every poll, unless a
coordinator keeps some member preferred (dynamic membership): then it leaves the queue to it
and asks only every COORDINATED_LOOK_SECONDS (issue 25); one its coordinator steered into
the line steps out when its coordinator says so (issue 19)."""

import asyncio

import pytest

from lbg.broker.rabbitmq.binding import RabbitQueueBinding

POLL = 0.01


async def counts_while_idle(coordinated: bool) -> int:
    counted = 0

    async def count_consumers(_queue: str) -> int:
        nonlocal counted
        counted += 1
        return 1  # the preferred member is in the line

    async def open_channel():  # never needed: this standby stays out of the line
        raise AssertionError("the standby joined the line")

    binding = RabbitQueueBinding(
        0, "q0", "tag", open_channel, count_consumers, True, POLL, lambda: 0.0, 60.0,
        preferred=False,
    )  # fmt: skip
    if coordinated:
        binding.set_coordinated()
    await asyncio.sleep(30 * POLL)
    await binding.close()
    return counted


@pytest.mark.parametrize(("coordinated", "most"), [(False, None), (True, 0)])
def test_a_coordinated_standby_does_not_count_consumers_every_poll(
    coordinated: bool, most: int | None
) -> None:
    counted = asyncio.run(counts_while_idle(coordinated))
    if most is None:
        assert counted >= 10, f"an uncoordinated standby looks every poll, counted {counted}"
    else:
        assert counted <= most, f"a coordinated standby counted {counted} times"


class FakeChannel:
    """A channel whose queue takes a consumer and never delivers (another owner is active)."""

    def __init__(self) -> None:
        self.is_closed = False

    async def set_qos(self, prefetch_count: int) -> None:
        pass

    async def get_queue(self, name: str, ensure: bool) -> "FakeChannel":
        return self

    async def consume(self, callback: object, consumer_tag: str) -> None:
        pass

    async def close(self) -> None:
        self.is_closed = True


def test_a_standby_steps_out_of_the_line_when_its_coordinator_says_so() -> None:
    channels: list[FakeChannel] = []

    async def open_channel() -> FakeChannel:
        channels.append(FakeChannel())
        return channels[-1]

    async def count_consumers(_queue: str) -> int:
        return 1  # what the owner's queue said while a standby waited behind it

    async def steps() -> None:
        binding = RabbitQueueBinding(
            0, "q0", "tag", open_channel, count_consumers, True, POLL, lambda: 0.0, 60.0,
            preferred=False,
        )  # fmt: skip
        binding.set_coordinated()
        binding.set_preferred(True)
        await asyncio.sleep(5 * POLL)
        assert binding.waiting and len(channels) == 1, "a preferred standby waits in line"
        binding.set_preferred(False)
        await asyncio.sleep(5 * POLL)
        assert not channels[0].is_closed, "left to the count, it would stay in line"
        binding.step_out()
        assert binding.waiting, "it counts as waiting until it has left the line"
        await asyncio.sleep(5 * POLL)
        assert channels[0].is_closed and not binding.waiting, "it left the line"
        assert len(channels) == 1, "and stays out"
        await binding.close()

    asyncio.run(steps())
