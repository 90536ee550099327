"""Message handlers: the default republish-for-validation handler and loading a user's own.

A handler is `handler(event, context)`, sync or async: `event` is a `lbg.model.messages.Event` (the
key, the body as the producer sent it, its headers, our sequence and publish time when set).
A sync handler runs in a worker thread, so a slow one cannot stall the event loop that keeps
this client's queues alive.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from lbg.broker.base import Broker
from lbg.model.destinations import OutputKind, output_destination
from lbg.model.messages import Event, Processed, encode_processed


class HandlerLoadError(Exception):
    """The configured handler cannot be imported; the message names it."""


@dataclass(frozen=True, slots=True)
class Context:
    """What a handler knows about the message it is given: the queue and bucket it came from,
    and whether the broker delivered it before."""

    group: str
    client: str
    queue: int
    bucket: int
    redelivered: bool
    broker: Broker
    # The queue's ownership epoch (fencing token): higher for every new owner of the queue,
    # so a store can refuse a write from an older one (README: "Fencing tokens").
    epoch: int = 0


Handler = Callable[[Event, Context], Any]
AsyncHandler = Callable[[Event, Context], Awaitable[None]]


async def republish(event: Event, context: Context) -> None:
    """Default handler: tell the validator who processed which event (the original LBG client)."""
    record = Processed(
        key=event.key,
        seq=event.seq,
        client=context.client,
        queue=context.queue,
        bucket=context.bucket,
        redelivered=context.redelivered,
        published_at=event.ts,
    )
    await context.broker.publish(
        output_destination(context.group, OutputKind.VALIDATION), encode_processed(record)
    )


def as_async(handler: Handler) -> AsyncHandler:
    """Wrap a sync handler so it runs in a thread; async handlers are returned as they are."""
    if inspect.iscoroutinefunction(handler):
        return handler

    @functools.wraps(handler)
    async def run_in_thread(event: Event, context: Context) -> None:
        result = await asyncio.to_thread(handler, event, context)
        if inspect.isawaitable(result):
            await result

    return run_in_thread


QueueHook = Callable[[list[int]], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Hooks:
    """Optional user callbacks around a handover (the Rebalanser events).

    `on_assigned(queues)` runs before the first message of a queue this client became active
    on; `on_revoked(queues)` after its in-flight work was finished and acked, before the queue
    is released (or right after it was taken away by a crash or a stall).
    """

    on_assigned: QueueHook | None = None
    on_revoked: QueueHook | None = None


def _as_async_hook(hook: Callable[[list[int]], Any]) -> QueueHook:
    if inspect.iscoroutinefunction(hook):
        return hook

    @functools.wraps(hook)
    async def run_in_thread(queues: list[int]) -> None:
        result = await asyncio.to_thread(hook, queues)
        if inspect.isawaitable(result):
            await result

    return run_in_thread


def load_handler(spec: str) -> tuple[AsyncHandler, Hooks]:
    """Import `module:function` as an async handler, with `on_assigned` / `on_revoked` hooks
    when its module defines them."""
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise HandlerLoadError(f"handler '{spec}': expected module:function")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise HandlerLoadError(
            f"handler '{spec}': cannot import {module_name} ({type(exc).__name__}: {exc})"
        ) from None
    handler = getattr(module, attribute, None)
    if not callable(handler):
        raise HandlerLoadError(f"handler '{spec}': {module_name} has no function {attribute}")
    hooks = {
        name: _as_async_hook(hook)
        for name in ("on_assigned", "on_revoked")
        if callable(hook := getattr(module, name, None))
    }
    return as_async(handler), Hooks(**hooks)
