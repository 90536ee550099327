"""The validator's live view: a small web page of who serves which queue, handovers over time,
throughput and error counts, refreshed twice a second from `/api/state`.

Served by aiohttp inside the validator's event loop (`validation-client --web-port`, or
`lbg demo --web-port`); the page is one static HTML file with plain JavaScript.
"""

from __future__ import annotations

import collections
import importlib.resources
import logging
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from lbg.sequence import Observation, Report
from lbg.validator import Validator

log = logging.getLogger(__name__)

HANDOVERS_KEPT = 200
RATE_WINDOW_SECONDS = 5.0


class LiveView:
    """What the page shows, kept current by the validator's callbacks: `queue_changed` for
    the handovers and `observed` for the rate."""

    def __init__(self, group: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.group = group
        self.owners: dict[int, str] = {}
        self.handovers: collections.deque[dict[str, Any]] = collections.deque(maxlen=HANDOVERS_KEPT)
        self._clock = clock
        self._arrivals: collections.deque[float] = collections.deque()
        self._first_record_at: float | None = None
        self._started = time.time()

    def queue_changed(self, queue: int, old: str | None, new: str, at: float | None) -> None:
        """A queue's records now come from another client: note the handover at the time its
        first record was stored (`at`, epoch seconds; now if unknown), as seconds after the
        first record of the run, so that records read late still show when they happened."""
        stored = time.time() if at is None else at
        if self._first_record_at is None:
            self._first_record_at = stored
        self.owners[queue] = new
        self.handovers.append(
            {
                "at": round(max(0.0, stored - self._first_record_at), 3),
                "queue": queue,
                "from": old,
                "to": new,
            }
        )

    def observed(self, _observation: Observation) -> None:
        """One record read: counted for the rate, however often the page asks."""
        self._arrivals.append(self._clock())

    def rate(self) -> float:
        """Records read per second over the last RATE_WINDOW_SECONDS (or since the first
        record, if that is more recent)."""
        now = self._clock()
        while self._arrivals and now - self._arrivals[0] > RATE_WINDOW_SECONDS:
            self._arrivals.popleft()
        if not self._arrivals:
            return 0.0
        return len(self._arrivals) / max(1.0, min(RATE_WINDOW_SECONDS, now - self._arrivals[0]))

    def state(self, report: Report) -> dict[str, Any]:
        """Everything the page renders, as JSON-ready data."""
        clients = sorted({*report.per_client, *self.owners.values()})
        return {
            "group": self.group,
            "uptime": round(time.time() - self._started, 1),
            "owners": {str(q): c for q, c in sorted(self.owners.items())},
            "clients": clients,
            "handovers": list(self.handovers)[-50:],
            "rate": round(self.rate(), 1),
            "report": report.to_dict(),
        }


def page_html() -> bytes:
    return importlib.resources.files("lbg").joinpath("liveview.html").read_bytes()


async def serve_live_view(
    view: LiveView, validator: Validator, port: int, address: str
) -> web.AppRunner:
    """Start serving `/` and `/api/state` on `address:port`; the caller cleans the runner up."""

    async def index(_request: web.Request) -> web.Response:
        return web.Response(body=page_html(), content_type="text/html")

    async def state(_request: web.Request) -> web.Response:
        return web.json_response(view.state(validator.report()))

    app = web.Application()
    app.router.add_get("/", index)
    app.router.add_get("/api/state", state)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, address, port).start()
    log.info("live view on http://%s:%d/", address, port)
    return runner
