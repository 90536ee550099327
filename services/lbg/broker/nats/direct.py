"""A subscription whose messages nats-py's read loop hands straight to a plain function.

nats-py gives every subscription with a callback a queue and a task: each message is queued,
wakes the task, and runs the callback as a coroutine. For the control channel, where a member
hears every other member's heartbeat several times a second and handles each in a few
microseconds, that was most of the cost of hearing one. Where the subscription has the queue
and task this expects (nats-py 2.x), the queue is replaced with a stand-in that calls the
handler at once; anywhere else the callback path stays. The same holds for a binding's pull
replies: an idle owner hears one per queue every third of a priority timeout, and a busy
one every event.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

log = logging.getLogger(__name__)

Handler = Callable[[Msg], None]


class _Direct:
    """Stands in for a subscription's pending queue: each message goes to the handler now."""

    def __init__(self, subscription: Subscription, handler: Handler) -> None:
        self._subscription = subscription
        self._handler = handler

    def put_nowait(self, msg: Msg) -> None:
        self._subscription._pending_size -= len(msg.data)  # nothing stays pending
        try:
            self._handler(msg)
        except Exception:  # the read loop must go on whatever one message does
            log.exception("a message on %s was not handled", msg.subject)

    def qsize(self) -> int:
        return 0

    def empty(self) -> bool:
        return True

    def task_done(self) -> None:
        return None

    async def join(self) -> None:
        return None


async def subscribe_direct(nc: Client, subject: str, handler: Handler) -> Subscription:
    """Subscribe `handler` to `subject`, called from the read loop with each message."""

    async def queued(msg: Msg) -> None:
        handler(msg)

    subscription = await nc.subscribe(subject, cb=queued)
    queue = getattr(subscription, "_pending_queue", None)
    task = getattr(subscription, "_wait_for_msgs_task", None)
    if isinstance(queue, asyncio.Queue) and isinstance(task, asyncio.Task):
        task.cancel()
        direct = _Direct(subscription, handler)
        subscription._pending_queue = direct  # type: ignore[assignment]
        while not queue.empty():  # what came while subscribing
            direct.put_nowait(queue.get_nowait())
    return subscription


def is_direct(subscription: Subscription) -> bool:
    """Whether the subscription's messages go to its handler from the read loop itself."""
    return isinstance(getattr(subscription, "_pending_queue", None), _Direct)
