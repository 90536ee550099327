"""A RabbitMQ standby that is not preferred counts the queue's consumers every poll, unless a
coordinator keeps some member preferred (dynamic membership): then it leaves the queue to it
and asks only every COORDINATED_LOOK_SECONDS (issue 25)."""

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
