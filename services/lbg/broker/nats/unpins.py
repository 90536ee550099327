"""The server's UNPINNED advisories, heard once per events stream and handed to the bindings
they name: a standby that lets the owner be waits for one instead of asking who owns the queue
every second, so idle standbys cost the server nothing."""

from __future__ import annotations

from nats.aio.client import Client
from nats.aio.msg import Msg

from lbg.broker.nats.binding import NatsQueueBinding


def unpinned_subject(stream: str) -> str:
    """Where the server announces that a consumer of `stream` lost its pin (timeout, UNPIN)."""
    return f"$JS.EVENT.ADVISORY.CONSUMER.UNPINNED.{stream}.*"


class UnpinWatch:
    """Per events stream: consumer -> the binding its UNPINNED advisories wake."""

    def __init__(self, nc: Client) -> None:
        self._nc = nc
        self._streams: dict[str, dict[str, NatsQueueBinding]] = {}

    async def watch(self, stream: str, consumer: str, binding: NatsQueueBinding) -> None:
        """Wake `binding` on its consumer's advisories (one subscription per stream)."""
        watched = self._streams.get(stream)
        if watched is None:
            watched = self._streams[stream] = {}

            async def wake(msg: Msg) -> None:
                woken = watched.get(msg.subject.rpartition(".")[2])
                if woken is not None:
                    woken.unpinned()

            await self._nc.subscribe(unpinned_subject(stream), cb=wake)
        watched[consumer] = binding

    def reconnected(self) -> None:
        """The connection came back: every binding may have missed an advisory or lost its
        waiting pull with the server's state."""
        for watched in self._streams.values():
            for binding in list(watched.values()):
                binding.reconnected()
