"""A RabbitMQ standby that is not preferred counts the queue's consumers every poll, unless a
coordinator keeps some member preferred (dynamic membership): then it leaves the queue to it
and asks only every 30 s or more (issue 25); one its coordinator steered into
the line steps out when its coordinator says so (issue 19). A binding in the line and
preferred does not wake on a timer, yet sees its channel close at once (issue 25)."""

import asyncio

import pytest

from lbg.broker.rabbitmq import binding as binding_module
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
    """A channel whose queue takes a consumer and never delivers (another owner is active);
    it counts how often its state is read (each round of a binding's loop reads it)."""

    def __init__(self) -> None:
        self.closed = False
        self.reads = 0
        self.close_callbacks: set = set()

    @property
    def is_closed(self) -> bool:
        self.reads += 1
        return self.closed

    def broker_closes(self) -> None:
        """What aio-pika does when the broker or a lost connection closes the channel."""
        self.closed = True
        for callback in list(self.close_callbacks):
            callback(self, None)

    async def set_qos(self, prefetch_count: int) -> None:
        pass

    async def get_queue(self, name: str, ensure: bool) -> "FakeChannel":
        return self

    async def consume(self, callback: object, consumer_tag: str) -> None:
        pass

    async def close(self) -> None:
        self.broker_closes()


def test_a_standby_steps_out_of_the_line_when_its_coordinator_says_so() -> None:
    channels: list[FakeChannel] = []

    async def open_channel() -> FakeChannel:
        channels.append(FakeChannel())
        return channels[-1]

    async def count_consumers(_queue: str) -> int:
        return 1  # what the owner's queue said while a standby waited behind it

    told: list[bool] = []

    async def steps() -> None:
        binding = RabbitQueueBinding(
            0, "q0", "tag", open_channel, count_consumers, True, POLL, lambda: 0.0, 60.0,
            preferred=False,
        )  # fmt: skip
        binding.tell_when_waiting(lambda _queue: told.append(binding.waiting))
        binding.set_coordinated()
        binding.set_preferred(True)
        await asyncio.sleep(5 * POLL)
        assert binding.waiting and len(channels) == 1, "a preferred standby waits in line"
        assert told == [True], "its coordinator was told it stands ready"
        binding.set_preferred(False)
        await asyncio.sleep(5 * POLL)
        assert not channels[0].is_closed, "left to the count, it would stay in line"
        binding.step_out()
        assert binding.waiting, "it counts as waiting until it has left the line"
        await asyncio.sleep(5 * POLL)
        assert channels[0].is_closed and not binding.waiting, "it left the line"
        assert told == [True, False], "and its coordinator was told it no longer waits"
        assert len(channels) == 1, "and stays out"
        await binding.close()

    asyncio.run(steps())


async def preferred_in_line(channels: list[FakeChannel], poll: float) -> RabbitQueueBinding:
    """A preferred binding that has joined the queue's line (on the channel it opened)."""

    async def open_channel() -> FakeChannel:
        channels.append(FakeChannel())
        return channels[-1]

    async def count_consumers(_queue: str) -> int:
        raise AssertionError("a preferred binding never counts")

    binding = RabbitQueueBinding(
        0, "q0", "tag", open_channel, count_consumers, True, poll, lambda: 0.0, 60.0,
        preferred=True,
    )  # fmt: skip
    async with asyncio.timeout(5):
        while not binding.waiting:
            await asyncio.sleep(0.001)
    return binding


def test_a_preferred_binding_in_line_does_not_wake_on_a_timer() -> None:
    async def idle() -> None:
        channels: list[FakeChannel] = []
        binding = await preferred_in_line(channels, POLL)
        await asyncio.sleep(POLL)
        reads = channels[0].reads
        await asyncio.sleep(30 * POLL)
        assert channels[0].reads == reads, f"{channels[0].reads - reads} rounds in 30 polls"
        assert binding.waiting and len(channels) == 1
        await binding.close()

    asyncio.run(idle())


def test_a_closed_channel_is_seen_at_once_without_polling() -> None:
    async def crash() -> None:
        channels: list[FakeChannel] = []
        binding = await preferred_in_line(channels, poll=60.0)  # a poll would take a minute
        channels[0].broker_closes()
        async with asyncio.timeout(1.0):
            while len(channels) < 2 or not binding.waiting:
                await asyncio.sleep(0.001)
        assert not channels[1].closed, "it left the closed channel and joined the line again"
        await binding.close()

    asyncio.run(crash())


def test_a_coordinated_standby_no_longer_preferred_leaves_an_idle_line(monkeypatch) -> None:
    monkeypatch.setattr(binding_module, "LINE_SETTLE_SECONDS", 10 * POLL)

    async def demoted() -> None:
        channels: list[FakeChannel] = []
        binding = await preferred_in_line(channels, POLL)
        binding.set_coordinated()
        binding.set_preferred(False)  # nobody holds the queue: the coordinator says nothing
        await asyncio.sleep(5 * POLL)
        assert not channels[0].closed, "it stays while the views of a mass start settle"
        await asyncio.sleep(10 * POLL)
        assert channels[0].closed and len(channels) == 1, "then it leaves, and stays out"
        await binding.close()

    asyncio.run(demoted())


class SlowChannel(FakeChannel):
    """A channel whose opening and closing take a moment; `changing` counts the changes in
    flight across every channel of the test, `most` the highest count seen."""

    changing = 0
    most = 0

    @classmethod
    async def change(cls) -> None:
        cls.changing += 1
        cls.most = max(cls.most, cls.changing)
        await asyncio.sleep(POLL)
        cls.changing -= 1

    async def close(self) -> None:
        await self.change()
        self.broker_closes()


def test_a_clients_bindings_change_lines_a_few_at_a_time() -> None:
    """Forty standbys steered into their lines at once, then out again: at most the gate's
    width of channels opens or closes at a time (a joiner at QC 1024 opened ~400 at once)."""

    async def open_channel() -> SlowChannel:
        await SlowChannel.change()
        return SlowChannel()

    async def count_consumers(_queue: str) -> int:
        return 1

    async def steer() -> tuple[int, int, int]:
        gate = asyncio.Semaphore(3)
        bindings = [
            RabbitQueueBinding(
                *(q, f"q{q}", "tag", open_channel, count_consumers, True, POLL, lambda: 0.0),
                stall_limit=60.0,
                preferred=False,
                line_gate=gate,
            )
            for q in range(40)
        ]
        for binding in bindings:
            binding.set_coordinated()
            binding.set_preferred(True)
        await asyncio.sleep(40 * POLL)
        waiting, opened_at_once = sum(b.waiting for b in bindings), SlowChannel.most
        SlowChannel.most = 0
        for binding in bindings:
            binding.set_preferred(False)
            binding.step_out()
        await asyncio.sleep(40 * POLL)
        closed_at_once = SlowChannel.most
        assert not any(b.waiting for b in bindings), "every standby left its line"
        for binding in bindings:
            await binding.close()
        return waiting, opened_at_once, closed_at_once

    waiting, opened_at_once, closed_at_once = asyncio.run(steer())
    assert waiting == 40, "every preferred standby stood in its line"
    assert opened_at_once == 3, f"{opened_at_once} lines joined at once"
    assert closed_at_once == 3, f"{closed_at_once} lines left at once"
