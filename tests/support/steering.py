"""A steering that holds nothing and does nothing with what the coordinator tells it: tests
of the coordinator override the part they look at."""

from collections.abc import Collection

from lbg.client.steering import Holding


class QuietSteering:
    """Every Steering call, answered with nothing."""

    def holdings(self) -> dict[int, Holding]:
        return {}

    def changed(self, queue: int) -> None:
        pass

    def prefer_only(self, queues: Collection[int]) -> bool:
        return False

    def release(self, queue: int) -> None:
        pass

    def step_out(self, queue: int) -> None:
        pass

    def fence_all(self, reason: str) -> None:
        pass

    def suspend_all(self, suspended: bool, reason: str) -> None:
        pass

    async def pinned_by(self, queue: int, *, fresh: bool = False) -> str | None:
        return None

    async def evict(self, queue: int, pin: str) -> bool:
        return False
