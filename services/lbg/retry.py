"""Daemon start-up that tolerates start-up order: wait for the broker, then for the group.

The first failed attempt logs a warning with the reason and how long start-up will keep
trying, later ones an info line each with the next delay (exponential, capped, jittered);
`--connect-retry` / `[broker] connect_retry_for` bounds the whole wait, and 0 fails at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar
from urllib.parse import urlsplit

from lbg.broker import connect_broker
from lbg.broker.adapters import adapter_for
from lbg.broker.base import Broker, BrokerError
from lbg.model.group import GroupConfig
from lbg.settings import BrokerSettings

T = TypeVar("T")

FIRST_DELAY = 0.5
MAX_DELAY = 10.0

log = logging.getLogger("lbg.startup")


class StartupStopped(Exception):
    """A stop was requested while the daemon was still waiting to start."""


def backoff(attempt: int, rng: Callable[[], float] = random.random) -> float:
    """Seconds to wait after failed `attempt` (from 1): doubling from FIRST_DELAY up to
    MAX_DELAY, jittered down to 50-100% so that restarted daemons do not retry in step."""
    ceiling = min(MAX_DELAY, FIRST_DELAY * 2.0 ** min(attempt - 1, 32))
    return ceiling * (0.5 + rng() / 2)


@dataclass
class StartupBudget:
    """How long start-up may keep retrying, shared by connecting and finding the group."""

    seconds: float
    stop: asyncio.Event | None = None
    started: float = field(default_factory=time.monotonic)

    def left(self) -> float:
        """Seconds of retrying left (<= 0: give up)."""
        return self.seconds - (time.monotonic() - self.started)

    async def pause(self, delay: float) -> None:
        """Sleep `delay` seconds; StartupStopped if a stop is requested meanwhile."""
        if self.stop is None:
            await asyncio.sleep(delay)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), delay)
        if self.stop.is_set():
            raise StartupStopped


async def retry(
    action: Callable[[], Awaitable[T]],
    retry_on: type[Exception],
    waiting: Callable[[Exception], str],
    failed: Callable[[Exception], str],
    budget: StartupBudget,
) -> T:
    """Run `action` until it succeeds, retrying `retry_on` errors while the budget lasts."""
    attempt = 0
    while True:
        attempt += 1
        try:
            return await action()
        except retry_on as exc:
            left = budget.left()
            if left <= 0:
                gave_up = (
                    f"; gave up after {attempt} attempt{'s' if attempt > 1 else ''} in"
                    f" {time.monotonic() - budget.started:.0f} s"
                    f" (--connect-retry / connect_retry_for = {budget.seconds:g})"
                    if budget.seconds > 0
                    else ""
                )
                raise BrokerError(f"{failed(exc)}{gave_up}") from None
            delay = min(backoff(attempt), left)
            if attempt == 1:
                log.warning(
                    "%s; retrying for up to %g s (--connect-retry), next in %.1f s (attempt 1)",
                    waiting(exc),
                    budget.seconds,
                    delay,
                )
            else:
                log.info("%s; retrying in %.1f s (attempt %d)", waiting(exc), delay, attempt)
            await budget.pause(delay)


async def connect_with_retry(
    settings: BrokerSettings, client_name: str, budget: StartupBudget
) -> Broker:
    """Connect to the broker, retrying while it is unreachable (not for an unknown scheme)."""
    if adapter_for(urlsplit(settings.url).scheme) is None:
        return await connect_broker(settings, client_name)
    return await retry(
        lambda: connect_broker(settings, client_name),
        BrokerError,
        lambda exc: f"broker unreachable: {exc}",
        str,
        budget,
    )


async def read_group_with_retry(
    broker: Broker, where: str, group: str, budget: StartupBudget
) -> GroupConfig:
    """Read the group's config, waiting while it does not exist yet (cg-admin may run later)
    or cannot be read (a broker restarting); `where` names the broker in log lines (no
    password)."""
    return await retry(
        lambda: broker.read_group(group),
        BrokerError,
        lambda exc: f"waiting for group '{group}' on {where} ({exc})",
        lambda exc: f"{where}: {exc}",
        budget,
    )


async def join_group(
    settings: BrokerSettings, group: str, client_name: str, stop: asyncio.Event
) -> tuple[Broker, GroupConfig] | None:
    """Connect and read the group, within `connect_retry_for`; None if stopped meanwhile."""
    budget = StartupBudget(settings.connect_retry_for, stop)
    started = time.monotonic()
    try:
        broker = await connect_with_retry(settings, client_name, budget)
    except StartupStopped:
        return None
    try:
        config = await read_group_with_retry(broker, settings.shown_url, group, budget)
        log.debug(
            "%s: connected and read group '%s' in %.3fs",
            client_name,
            group,
            time.monotonic() - started,
        )
        return broker, config
    except StartupStopped:
        await broker.close()
        return None
    except BaseException:
        await broker.close()
        raise
