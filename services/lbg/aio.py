"""asyncio helpers shared by the daemons."""

from __future__ import annotations

import asyncio


async def cancel_and_wait(task: asyncio.Task, retry_after: float = 0.5) -> None:
    """Cancel a task and wait until it is done, repeating the cancel if the task swallowed it.

    On Python 3.11 a cancel that arrives while the task is finishing a wait_for can be lost,
    which would otherwise leave a daemon hanging on shutdown.
    """
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=retry_after)
