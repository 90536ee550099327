"""The server's word on who holds a queue's pin, heard once per events stream and handed to the
bindings it names: a standby that lets the owner be waits for an UNPINNED advisory instead of
asking who owns the queue every second, and a queue the server last said has no pin is known
free without asking (an idle member's coordinator asks about every queue it waits for), so idle
queues cost the server nothing. Coordinated standbys in the background (not preferred) also
share one periodic look for a lost advisory: one listing of the stream's consumers, rather than
one request per standby (768 of them per client at QC 1024 x 4)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from nats.aio.client import Client
from nats.aio.msg import Msg

from lbg.aio import cancel_and_wait, sleep_to_multiple
from lbg.broker.nats import jsapi
from lbg.broker.nats.binding import NatsQueueBinding

log = logging.getLogger(__name__)

# How often a stream's shared look checks whether it has standbys to look for, while none does.
IDLE_LOOK_SECONDS = 60.0


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
        self._looks: list[asyncio.Task[None]] = []

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
            self._looks.append(asyncio.create_task(self._look(stream), name=f"look-{stream}"))
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

    async def _look(self, stream: str) -> None:
        """Every look period of the stream's standbys in the background, on the wall clock's
        multiples of it (with the client's other periodic work): list the stream's consumers
        once and tell each standby whose queue has no pin and no waiting pull to look for
        itself. If the listing fails (a user set up before clients could list), each looks."""
        watched = self._streams[stream]
        failing = False
        while True:
            periods = [p for b in watched.values() if (p := b.look_period) is not None]
            await sleep_to_multiple(min(periods, default=IDLE_LOOK_SECONDS))
            standbys = [b for b in list(watched.values()) if b.look_period is not None]
            if not standbys:
                continue
            try:
                taken = await taken_consumers(self._nc, stream)
                failing = False
            except Exception as exc:  # each looks for itself, as it did before the shared look
                subject = f"$JS.API.CONSUMER.LIST.{stream}"
                if not failing:
                    log.warning(
                        "stream %s: no shared look for the standbys (%s); each asks for itself",
                        stream,
                        self._refusal(subject) or str(exc) or "no answer",
                    )
                failing, taken = True, set()
            for binding in standbys:
                if binding.consumer not in taken:
                    binding.look_soon()

    async def close(self) -> None:
        """Stop the shared looks."""
        for look in self._looks:
            await cancel_and_wait(look)
        self._looks.clear()


async def taken_consumers(nc: Client, stream: str) -> set[str]:
    """The consumers of `stream` that have a pinned client or a waiting pull, from one listing."""
    return {
        info["name"]
        for info in await jsapi.consumer_infos(nc, stream)
        if info.get("num_waiting", 0)
        or any(g.get("pinned_client_id") for g in info.get("priority_groups") or [])
    }
