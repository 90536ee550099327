"""The server's PINNED and UNPINNED advisories, heard once per events stream and handed to the
bindings they name: a standby that lets the owner be waits for an UNPINNED one instead of asking
who owns the queue every second, and a queue the server last said has no pin is known free
without asking (an idle member's coordinator asks about every queue it waits for), so idle
queues cost the server nothing."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from nats.aio.client import Client
from nats.aio.msg import Msg

from lbg.broker.nats.binding import NatsQueueBinding


def unpinned_subject(stream: str) -> str:
    """Where the server announces that a consumer of `stream` lost its pin (timeout, UNPIN)."""
    return f"$JS.EVENT.ADVISORY.CONSUMER.UNPINNED.{stream}.*"


def pinned_subject(stream: str) -> str:
    """Where the server announces that it gave a consumer of `stream`'s pin to a client."""
    return f"$JS.EVENT.ADVISORY.CONSUMER.PINNED.{stream}.*"


class PinWatch:
    """Per events stream: consumer -> the binding its advisories go to."""

    def __init__(self, nc: Client, refusal: Callable[[str], str | None]) -> None:
        self._nc = nc
        self._refusal = refusal  # why the server refused a subscription, if it did
        self._streams: dict[str, dict[str, NatsQueueBinding]] = {}
        self._hears_pins: set[str] = set()
        self._checks: set[asyncio.Task[None]] = set()

    async def watch(self, stream: str, consumer: str, binding: NatsQueueBinding) -> None:
        """Tell `binding` of its consumer's advisories (two subscriptions per stream)."""
        watched = self._streams.get(stream)
        if watched is None:
            watched = self._streams[stream] = {}

            async def pinned(msg: Msg) -> None:
                if (told := watched.get(msg.subject.rpartition(".")[2])) is not None:
                    told.pinned()

            async def unpinned(msg: Msg) -> None:
                if (told := watched.get(msg.subject.rpartition(".")[2])) is not None:
                    told.unpinned()

            await self._nc.subscribe(pinned_subject(stream), cb=pinned)
            await self._nc.subscribe(unpinned_subject(stream), cb=unpinned)
            check = asyncio.create_task(self._check_pins(stream))
            self._checks.add(check)
            check.add_done_callback(self._checks.discard)
        watched[consumer] = binding
        if stream in self._hears_pins:
            binding.hear_pins()

    async def _check_pins(self, stream: str) -> None:
        """Once the server took both subscriptions (a refused one's error comes before the
        answer to a flush), let the stream's bindings rely on them. A group set up with
        permissions that allow only the UNPINNED advisories: its bindings always ask."""
        with contextlib.suppress(Exception):  # no flush answer: they always ask
            await self._nc.flush()
            subjects = (pinned_subject(stream), unpinned_subject(stream))
            if not any(self._refusal(subject) for subject in subjects):
                self._hears_pins.add(stream)
                for binding in list(self._streams[stream].values()):
                    binding.hear_pins()

    def reconnected(self) -> None:
        """The connection came back: every binding may have missed an advisory or lost its
        waiting pull with the server's state."""
        for watched in self._streams.values():
            for binding in list(watched.values()):
                binding.reconnected()
