"""The peak's handler: some work per event, then the default record for the validator.

The work is a sleep of LBG_PEAK_WORK_MS milliseconds in the client's handler threads (like a
call to a slow service), so one client manages only so many events per second and a peak
needs more of them; `run_peak.py --work-ms` sets it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable

from lbg.handlers import Context, republish
from lbg.model.messages import Event

WORK_SECONDS = float(os.environ.get("LBG_PEAK_WORK_MS", "0")) / 1000.0


def handle(event: Event, context: Context) -> Awaitable[None]:
    """Work on the event for WORK_SECONDS, then tell the validator it was processed."""
    time.sleep(WORK_SECONDS)
    return republish(event, context)
