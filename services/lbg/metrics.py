"""Prometheus metrics and health of every daemon, served on `--metrics-port` (0: off).

One HTTP server on the daemon's own event loop answers `/metrics`, `/healthz` (liveness: the
loop answers, and a tick it schedules came on time) and `/readyz` (readiness: the broker is
connected and the group is bound). A stuck loop answers none of them, so a probe times out;
prometheus_client's own server thread would keep answering `/metrics` for a dead daemon.

Counters and gauges are read from each daemon's own stats at scrape time (a collector per
daemon), so the hot paths only keep their plain counters; latencies are histograms observed
where they happen. Each daemon registers only its own metrics. Every series carries the
group's name as the `group` label.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable
from typing import TYPE_CHECKING

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from aiohttp import web

log = logging.getLogger(__name__)

DISTRIBUTION = "sticky-lbg"
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
TICK_SECONDS = 0.5
# /healthz fails when the loop's last tick is older than this (a loop blocked by a handler).
LIVENESS_SECONDS = 5.0

PUBLISH_SECONDS = Histogram(
    "lbg_publish_ack_seconds",
    "Publish to broker acknowledgement, per event.",
    ["group"],
    buckets=LATENCY_BUCKETS,
    registry=None,
)
HANDLER_SECONDS = Histogram(
    "lbg_handler_seconds",
    "Handler run time per message (successful attempts).",
    ["group", "queue"],
    buckets=LATENCY_BUCKETS,
    registry=None,
)
HANDOVER_SECONDS = Histogram(
    "lbg_handover_release_seconds",
    "A planned handover by this client: from the decision to the queue's release.",
    ["group", "queue"],
    buckets=LATENCY_BUCKETS,
    registry=None,
)

Family = CounterMetricFamily | GaugeMetricFamily | InfoMetricFamily


def package_version() -> str:
    """The installed distribution's version (pyproject.toml), so --version never drifts."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


class StatsCollector(Collector):
    """Turns a daemon's stats into metric families when Prometheus scrapes."""

    def __init__(self, read: Callable[[], Iterable[Family]]) -> None:
        self._read = read

    def collect(self) -> Iterable[Family]:
        """The daemon's families, and `lbg_build_info` naming the running version."""
        info = InfoMetricFamily("lbg_build", "The running sticky-lbg build.")
        info.add_metric([], {"version": package_version()})
        return [info, *self._read()]


def counter(name: str, doc: str, group: str, value: float) -> CounterMetricFamily:
    """A counter of one group (exposed as `<name>_total`)."""
    family = CounterMetricFamily(name, doc, labels=["group"])
    family.add_metric([group], value)
    return family


def gauge(name: str, doc: str, group: str, value: float) -> GaugeMetricFamily:
    """A gauge of one group."""
    family = GaugeMetricFamily(name, doc, labels=["group"])
    family.add_metric([group], value)
    return family


class LoopWatch:
    """Ticks on the event loop; how late the last tick came says whether the loop is alive."""

    def __init__(self) -> None:
        self.last_tick = time.monotonic()
        self.lag = 0.0

    async def tick(self) -> None:
        """Every TICK_SECONDS, note the time and how late the loop woke this task."""
        while True:
            await asyncio.sleep(TICK_SECONDS)
            now = time.monotonic()
            self.lag = max(0.0, now - self.last_tick - TICK_SECONDS)
            self.last_tick = now

    def alive(self) -> bool:
        """Whether the loop ran the tick recently."""
        return time.monotonic() - self.last_tick < LIVENESS_SECONDS


def health_app(
    registry: CollectorRegistry, ready: Callable[[], bool], watch: LoopWatch
) -> web.Application:
    """The routes: /metrics (Prometheus text), /healthz and /readyz (JSON, 200 or 503)."""
    from aiohttp import web  # only where a server runs: its import is a tenth of a start-up

    async def metrics(_request: web.Request) -> web.Response:
        body = generate_latest(registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    def answer(ok: bool, **fields: object) -> web.Response:
        document = {"status": "ok" if ok else "failing", **fields}
        return web.Response(
            body=orjson.dumps(document), status=200 if ok else 503, content_type="application/json"
        )

    async def healthz(_request: web.Request) -> web.Response:
        """Liveness says the broker's state too, but never fails on it: a restart cannot bring
        a broker back, it would only drop the daemon's state (readiness fails instead)."""
        lag = round(watch.lag, 3)
        return answer(watch.alive(), loop_lag_seconds=lag, broker_connected_group_bound=ready())

    async def readyz(_request: web.Request) -> web.Response:
        is_ready = ready()
        return answer(is_ready and watch.alive(), broker_connected_group_bound=is_ready)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app


@contextlib.asynccontextmanager
async def serve(
    port: int,
    address: str,
    read: Callable[[], Iterable[Family]],
    ready: Callable[[], bool],
    histograms: Iterable[Histogram] = (),
) -> AsyncIterator[None]:
    """Serve the daemon's metrics (its collector and `histograms` only) and its health on
    the running loop while the block runs; port 0 means no server."""
    if not port:
        yield
        return
    from aiohttp import web

    registry = CollectorRegistry(auto_describe=True)
    registry.register(StatsCollector(read))
    for histogram in histograms:
        registry.register(histogram)
    watch = LoopWatch()
    ticker = asyncio.create_task(watch.tick(), name="metrics-loop-watch")
    runner = web.AppRunner(health_app(registry, ready, watch), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, address, port).start()
        log.info("metrics and health on http://%s:%d/{metrics,healthz,readyz}", address, port)
        yield
    finally:
        ticker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ticker
        await runner.cleanup()
