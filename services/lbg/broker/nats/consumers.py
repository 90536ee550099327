"""What a binding needs to know of its queue's consumer: its priority timeout and whether it
acks cumulatively. Read once per consumer, and for a whole stream from one listing (a page per
256 consumers) when a client first binds there: a client of QC 1024 asked 1,024 times, a
quarter of a second of its join."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from nats.aio.client import Client
from nats.errors import TimeoutError as NatsTimeoutError

from lbg.broker.base import BrokerError
from lbg.broker.nats import jsapi

# A listing the user may not make (set up before clients could list) goes unanswered: each
# consumer is then asked for on its own, after this long, once per stream and connection.
LISTING_TIMEOUT = 1.0
ERRORS = (jsapi.JsApiError, NatsTimeoutError, TimeoutError)

# (priority timeout in seconds, acks cumulatively)
Settings = tuple[float, bool]


class ConsumerSettings:
    """One connection's knowledge of its consumers' settings, by (stream, consumer)."""

    def __init__(
        self, nc: Client, refusal: Callable[[str], str | None], default_timeout: float
    ) -> None:
        self._nc = nc
        self._refusal = refusal
        self._default_timeout = default_timeout
        self._known: dict[tuple[str, str], Settings] = {}
        self._listed: set[str] = set()
        self._listing = asyncio.Lock()

    async def of(self, stream: str, consumer: str, where: str) -> Settings:
        """The consumer's settings; BrokerError naming `where` if they cannot be read."""
        key = (stream, consumer)
        if key not in self._known:
            await self._list(stream)
        if (known := self._known.get(key)) is not None:
            return known
        try:
            info = await jsapi.consumer_info(self._nc, stream, consumer)
        except ERRORS as exc:
            refused = self._refusal(f"$JS.API.CONSUMER.INFO.{stream}.{consumer}")
            raise BrokerError(f"{where}: {refused or exc or 'no answer'}") from None
        return self._remember(stream, info)

    def forget(self, stream: str) -> None:
        """Drop what is known of `stream` (deleted: a new one may take its name)."""
        self._listed.discard(stream)
        for key in [k for k in self._known if k[0] == stream]:
            del self._known[key]

    async def _list(self, stream: str) -> None:
        """Learn every consumer of `stream` from one listing; the first binding makes it, the
        others bound at the same time wait for it."""
        async with self._listing:
            if stream in self._listed:
                return
            self._listed.add(stream)
            try:
                infos = await jsapi.consumer_infos(self._nc, stream, LISTING_TIMEOUT)
            except ERRORS:
                return
            for info in infos:
                self._remember(stream, info)

    def _remember(self, stream: str, info: dict) -> Settings:
        config = info.get("config", {})
        timeout_ns = config.get("priority_timeout") or 0
        known = (
            timeout_ns / jsapi.NANOS if timeout_ns else self._default_timeout,
            config.get("ack_policy") == "all",
        )
        self._known[(stream, info.get("name", ""))] = known
        return known
