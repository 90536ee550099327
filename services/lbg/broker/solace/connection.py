"""The Solace session's connection events, from the API's listener thread to the bindings.

While the session reconnects, the broker may already be redelivering a flow's unacked
messages to another consumer, and what the API had buffered before the drop would still be
handed out and acked. So every binding rebinds: what it delivered is fenced, its flow is
unbound and a new one bound once the session is back. An interruption (the session gave up
reconnecting) does the same; the new flows then keep failing, with a warning each time.
"""

from __future__ import annotations

import asyncio
import logging
import weakref

from solace.messaging.messaging_service import (
    MessagingService,
    ReconnectionAttemptListener,
    ReconnectionListener,
    ServiceEvent,
    ServiceInterruptionListener,
)

from lbg.broker.solace.binding import SolaceQueueBinding

log = logging.getLogger(__name__)


class ConnectionWatch(
    ReconnectionAttemptListener, ReconnectionListener, ServiceInterruptionListener
):
    """Registered on one service; rebinds the bindings it watches when the session drops."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._bindings: weakref.WeakSet[SolaceQueueBinding] = weakref.WeakSet()

    def register(self, service: MessagingService) -> None:
        """Listen to the service's reconnection attempts, reconnections and interruptions."""
        service.add_reconnection_attempt_listener(self)
        service.add_reconnection_listener(self)
        service.add_service_interruption_listener(self)

    def watch(self, binding: SolaceQueueBinding) -> None:
        """Rebind `binding` whenever the session drops, for as long as it exists."""
        self._bindings.add(binding)

    def on_reconnecting(self, event: ServiceEvent) -> None:
        log.warning("broker connection lost, reconnecting: %s", event.get_message())
        self._rebind_all(f"the session is reconnecting ({event.get_message()})")

    def on_reconnected(self, event: ServiceEvent) -> None:
        log.info("reconnected to the broker")

    def on_service_interrupted(self, event: ServiceEvent) -> None:
        log.warning("broker connection lost for good: %s", event.get_message())
        self._rebind_all(f"the session is down ({event.get_message()})")

    def _rebind_all(self, reason: str) -> None:
        """On the API's thread: hand the rebinding to the event loop."""
        self._loop.call_soon_threadsafe(self._rebind, reason)

    def _rebind(self, reason: str) -> None:
        for binding in list(self._bindings):
            binding.rebind(reason)
