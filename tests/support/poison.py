"""A user's handler for the parking tests: records every event as recorder.py does, except the
one named in the file $LBG_TEST_POISON ("<key> <seq> fail|hang"), while that file exists: on
it, the handler raises (fails for good) or hangs. Removing the file is the fix."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from tests.support.recorder import record

from lbg import Context, Event


async def handle(event: Event, context: Context) -> None:
    """Fail or hang on the poison event while the poison file exists; else record the event."""
    poison = Path(os.environ["LBG_TEST_POISON"])
    if poison.exists():
        key, seq, how = poison.read_text().split()
        if event.key == key and event.seq == int(seq):
            if how == "hang":
                await asyncio.sleep(3600)
            raise RuntimeError(f"cannot apply {key} #{seq}")
    await record(event, context)
