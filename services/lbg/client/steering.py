"""The coordinator's hold on the client's queues: it reads what each queue's binding holds and
tells the client what to prefer, release, fence, suspend or evict, without touching a binding
itself (the client owns its bindings; the coordinator only steers)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from lbg.broker.base import QueueBinding


@dataclass(frozen=True)
class Holding:
    """What this member holds of one queue: active (with the broker's pin), or waiting for it."""

    active: bool
    pin: str | None
    waiting: bool


class Steering(Protocol):
    """What a dynamic coordinator may read of and ask of its client's queues."""

    def holdings(self) -> dict[int, Holding]:
        """Every queue the client is bound to, and what it holds of each now."""
        ...

    def prefer(self, queue: int, preferred: bool) -> None:
        """Stand ready for `queue` as its preferred next owner, or stop doing so."""
        ...

    def release(self, queue: int) -> None:
        """Hand `queue` over after finishing its in-flight work (a planned handover)."""
        ...

    def step_out(self, queue: int) -> None:
        """Leave `queue`'s line if only waiting in it, not preferred (someone else holds it)."""
        ...

    def fence_all(self, reason: str) -> None:
        """Stop processing every queue now (the member's lease lapsed)."""
        ...

    def suspend_all(self, suspended: bool, reason: str) -> None:
        """Give every queue up and stop pulling (a stalled member), or pull again."""
        ...

    async def pinned_by(self, queue: int) -> str | None:
        """The pin the broker holds for `queue` now, whoever holds it."""
        ...

    async def evict(self, queue: int, pin: str) -> bool:
        """Unseat `pin` from `queue` if the broker still holds it; True if it did."""
        ...


class BindingSteering:
    """Steering over a client's live bindings and its workers' release requests."""

    def __init__(
        self, bindings: Mapping[int, QueueBinding], request_release: Callable[[int], None]
    ) -> None:
        self._bindings = bindings
        self._request_release = request_release

    def holdings(self) -> dict[int, Holding]:
        return {
            queue: Holding(binding.active, binding.pin, binding.waiting)
            for queue, binding in list(self._bindings.items())
        }

    def prefer(self, queue: int, preferred: bool) -> None:
        if (binding := self._bindings.get(queue)) is not None:
            binding.set_preferred(preferred)

    def release(self, queue: int) -> None:
        self._request_release(queue)

    def step_out(self, queue: int) -> None:
        if (binding := self._bindings.get(queue)) is not None:
            binding.step_out()

    def fence_all(self, reason: str) -> None:
        for binding in list(self._bindings.values()):
            if binding.active:
                binding.fence(reason)

    def suspend_all(self, suspended: bool, reason: str) -> None:
        for binding in list(self._bindings.values()):
            if suspended:
                binding.fence(reason)
            binding.suspend(suspended)

    async def pinned_by(self, queue: int) -> str | None:
        binding = self._bindings.get(queue)
        return await binding.pinned_by() if binding is not None else None

    async def evict(self, queue: int, pin: str) -> bool:
        binding = self._bindings.get(queue)
        return await binding.evict(pin) if binding is not None else False
