"""The validator's live view: a small web page of who serves which queue, handovers over time,
throughput and error counts, refreshed twice a second from `/api/state`.

Served by aiohttp inside the validator's event loop (`validation-client --web-port`, or
`lbg demo --web-port`); the page is one static HTML file with plain JavaScript.
"""

from __future__ import annotations

import base64
import collections
import hashlib
import importlib.resources
import ipaddress
import logging
import re
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from lbg.model.sequence import Observation, Report
from lbg.validator import Validator

log = logging.getLogger(__name__)

HANDOVERS_KEPT = 200
RATE_WINDOW_SECONDS = 5.0
PARKED_SHOWN = 50


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

    def state(self, report: Report, parked: dict[str, set[int]] | None = None) -> dict[str, Any]:
        """Everything the page renders, as JSON-ready data; `parked`: the parking lot's
        events per key (the validator's last read of it)."""
        clients = sorted({*report.per_client, *self.owners.values()})
        return {
            "group": self.group,
            "uptime": round(time.time() - self._started, 1),
            "owners": {str(q): c for q, c in sorted(self.owners.items())},
            "clients": clients,
            "handovers": list(self.handovers)[-50:],
            "rate": round(self.rate(), 1),
            "report": report.to_dict(),
            "parked": [
                {"key": key, "events": len(seqs)}
                for key, seqs in sorted((parked or {}).items())[:PARKED_SHOWN]
            ],
        }


_INLINE = re.compile(rb"<(script|style)>(.*?)</\1>", re.S)


def page_html() -> bytes:
    return importlib.resources.files("lbg").joinpath("liveview.html").read_bytes()


def security_headers(page: bytes) -> dict[str, str]:
    """Headers for every answer: only the page's own inline script and style may run (by
    hash), it fetches from its own origin only, nobody may frame it, nothing is sniffed."""
    sources: dict[bytes, list[str]] = {b"script": [], b"style": []}
    for kind, body in _INLINE.findall(page):
        digest = base64.b64encode(hashlib.sha256(body).digest()).decode()
        sources[kind].append(f"'sha256-{digest}'")
    policy = (
        "default-src 'none'; connect-src 'self'; img-src 'self';"
        f" script-src {' '.join(sources[b'script'])}; style-src {' '.join(sources[b'style'])};"
        " base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )
    return {
        "Content-Security-Policy": policy,
        "X-Content-Type-Options": "nosniff",
        "X-Frame-Options": "DENY",
        "Referrer-Policy": "no-referrer",
        "Cache-Control": "no-store",
    }


def trusted_host(host: str | None) -> bool:
    """Whether a request's Host names this machine (an IP address, localhost or its own
    name): a page of another site that rebinds its DNS name to us sends its own name."""
    if not host:
        return False
    name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    name = name.strip("[]").lower().rstrip(".")
    try:
        ipaddress.ip_address(name)
    except ValueError:
        own = {"localhost", socket.gethostname().lower(), socket.getfqdn().lower()}
        return name in own or name.endswith(".localhost")
    return True


def is_loopback(address: str) -> bool:
    """Whether `address` (an IP address or a host name) is this machine's loopback."""
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address.lower() == "localhost"


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def serve_live_view(
    view: LiveView, validator: Validator, port: int, address: str
) -> web.AppRunner:
    """Start serving `/` and `/api/state` on `address:port`; the caller cleans the runner up."""

    page = page_html()
    headers = security_headers(page)

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        """Refuse a foreign Host (DNS rebinding), and send the security headers."""
        if not trusted_host(request.host):
            response: web.StreamResponse = web.Response(status=421, text="unknown host\n")
        else:
            response = await handler(request)
        response.headers.update(headers)
        return response

    async def index(_request: web.Request) -> web.Response:
        return web.Response(body=page, content_type="text/html")

    async def state(_request: web.Request) -> web.Response:
        return web.json_response(view.state(validator.report(), validator.parked))

    app = web.Application(middlewares=[guard])
    app.router.add_get("/", index)
    app.router.add_get("/api/state", state)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, address, port).start()
    log.info("live view on http://%s:%d/", address, port)
    if not is_loopback(address):
        log.warning(
            "live view listens on %s: anyone who can reach it sees the group's state"
            " (no authentication); bind it to 127.0.0.1 unless that is meant",
            address,
        )
    return runner
