"""`cg-admin resize`: give a running resizable group a new queue count and tell its members."""

from __future__ import annotations

from lbg.broker.base import Broker, BrokerError, Resize
from lbg.model.control import encode_resized


async def resize_group(broker: Broker, group: str, queue_count: int) -> tuple[Resize, str | None]:
    """Resize a running group, then tell its members at once; returns what was done and, if
    the members could not be told, why (they then read the new size within seconds)."""
    done = await broker.resize_group(group, queue_count)
    try:
        await broker.publish_control(group, encode_resized(done.after.generation))
    except BrokerError as exc:
        return done, str(exc)
    return done, None
