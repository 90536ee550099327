"""The shape every loop-driven binding shares (broker/bindings.py LoopBinding): a failed round does
not end the loop, release stands back then resumes, close gives the queue up once."""

import asyncio

from lbg.broker.base import Delivery
from lbg.broker.bindings import LoopBinding


class Recording(LoopBinding):
    """A binding whose broker calls only record what the shared shape asked of them."""

    def __init__(
        self, fail_rounds: int = 0, stalled: bool = False, library_cancels: int = 0
    ) -> None:
        super().__init__(3, lambda queue, active: self.changes.append(active), preferred=True)
        self.calls: list[str] = []
        self.changes: list[bool] = []
        self.rounds = 0
        self.fail_rounds = fail_rounds
        self.library_cancels = library_cancels
        self.stalled = stalled
        self._start("recording")

    @property
    def pin(self) -> str | None:
        return "p" if self._active else None

    @property
    def waiting(self) -> bool:
        return False

    async def pinned_by(self, *, fresh: bool = False) -> str | None:
        return None

    async def evict(self, pin: str) -> bool:
        return False

    async def ack(self, delivery: Delivery) -> bool:
        return self.owns(delivery)

    async def _step(self) -> float:
        await self._running.wait()
        self.rounds += 1
        if self.rounds <= self.fail_rounds:
            raise OSError("connection reset")
        if self.rounds <= self.library_cancels:
            pending = asyncio.get_running_loop().create_future()
            pending.cancel()  # as aiormq does to the calls of a connection that closed
            await pending
        self._set_active(True, "test")
        return 0.01

    async def _failed(self, exc: Exception) -> float:
        self.calls.append(f"failed: {exc}")
        return 0.0

    def _lose(self, reason: str) -> None:
        self._new_epoch()
        self._set_active(False, reason)
        self.calls.append(f"lose: {reason}")

    async def _give_up(self, reason: str) -> None:
        self._lose(reason)
        self.calls.append("give up")

    def _stall(self) -> str | None:
        return "stalled" if self.stalled else None


async def until(condition, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.005)


def test_a_failed_round_is_recovered_and_the_loop_goes_on() -> None:
    async def main() -> None:
        binding = Recording(fail_rounds=2)
        await until(lambda: binding.active)
        assert binding.calls == ["failed: connection reset"] * 2
        await binding.close()

    asyncio.run(main())


def test_a_call_the_client_library_cancels_is_a_failed_round_not_the_loop_s_end() -> None:
    async def main() -> None:
        binding = Recording(library_cancels=1)
        await until(lambda: binding.active)
        assert binding.calls == ["failed: a broker call was cancelled under it"]
        await binding.close()

    asyncio.run(main())


def test_release_gives_the_queue_up_stands_back_then_runs_again() -> None:
    async def main() -> None:
        binding = Recording()
        await until(lambda: binding.active)
        releasing = asyncio.create_task(binding.release(0.2))
        await until(lambda: "give up" in binding.calls)
        rounds = binding.rounds
        await asyncio.sleep(0.1)
        assert binding.rounds == rounds, "it asked for messages while standing back"
        await releasing
        await until(lambda: binding.active)
        assert binding.changes == [True, False, True]
        await binding.close()

    asyncio.run(main())


def test_a_delivery_of_an_older_stint_or_a_stalled_binding_is_not_owned() -> None:
    async def main() -> None:
        binding = Recording()
        await until(lambda: binding.active)
        old = Delivery(b"", "s", {}, False, epoch=binding._epoch)
        binding.fence("moved")
        await until(lambda: binding.active)
        assert not binding.owns(old)
        current = Delivery(b"", "s", {}, False, epoch=binding._epoch)
        assert binding.owns(current)
        binding.stalled = True
        assert not binding.owns(current)
        assert binding.calls[-1] == "lose: stalled"
        await binding.close()

    asyncio.run(main())


def test_a_delivery_of_another_binding_is_never_owned() -> None:
    """Epochs are unique in the process: a binding that walks several (the NATS stints) asks
    only the current one whether it owns a delivery, even one an earlier binding handed out."""

    async def main() -> None:
        first, second = Recording(), Recording()
        await until(lambda: first.active and second.active)
        for _ in range(3):
            first.fence("moved")
            second.fence("moved")
            await until(lambda: first.active and second.active)
        assert first._epoch != second._epoch
        assert not second.owns(Delivery(b"", "s", {}, False, epoch=first._epoch))
        assert not first.owns(Delivery(b"", "s", {}, False, epoch=second._epoch))
        await first.close()
        await second.close()

    asyncio.run(main())


def test_close_ends_the_loop_and_gives_the_queue_up_once() -> None:
    async def main() -> None:
        binding = Recording()
        await until(lambda: binding.active)
        await binding.close()
        await binding.close()
        assert binding.calls == ["lose: closed", "give up"]
        assert binding._task is not None and binding._task.done()

    asyncio.run(main())
