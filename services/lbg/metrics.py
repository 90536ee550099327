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
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable
from typing import TYPE_CHECKING

import orjson

from lbg.aio import until_next

if TYPE_CHECKING:
    from aiohttp import web
    from prometheus_client import CollectorRegistry, Histogram
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily

    Family = CounterMetricFamily | GaugeMetricFamily | InfoMetricFamily

log = logging.getLogger(__name__)

DISTRIBUTION = "sticky-lbg"
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
TICK_SECONDS = 0.5
# /healthz fails when the loop's last tick is older than this (a loop blocked by a handler).
LIVENESS_SECONDS = 5.0


class Latency:
    """A latency histogram that exists only once a daemon serves its metrics (`serve` makes
    it): until then an observation costs an attribute check, and prometheus_client (with
    http.server, a sixth of a client's imports) is not imported at all."""

    def __init__(self, name: str, doc: str, labelnames: tuple[str, ...]) -> None:
        self.name = name
        self.doc = doc
        self.labelnames = labelnames
        self.histogram: Histogram | None = None

    def made(self) -> Histogram:
        """The prometheus_client histogram, made at the first call."""
        if self.histogram is None:
            from prometheus_client import Histogram

            self.histogram = Histogram(
                self.name, self.doc, self.labelnames, buckets=LATENCY_BUCKETS, registry=None
            )
        return self.histogram

    def labels(self, *values: str) -> LatencySeries:
        """The series of these label values (bind it once where it is observed often)."""
        return LatencySeries(self, values)


class LatencySeries:
    """One labelled series of a Latency: observations before its histogram exists are not
    kept (nobody can scrape them)."""

    __slots__ = ("_child", "_latency", "_values")

    def __init__(self, latency: Latency, values: tuple[str, ...]) -> None:
        self._latency = latency
        self._values = values
        self._child: Histogram | None = None

    def observe(self, seconds: float) -> None:
        child = self._child
        if child is None:
            histogram = self._latency.histogram
            if histogram is None:
                return
            child = self._child = histogram.labels(*self._values)
        child.observe(seconds)


PUBLISH_SECONDS = Latency(
    "lbg_publish_ack_seconds", "Publish to broker acknowledgement, per event.", ("group",)
)
HANDLER_SECONDS = Latency(
    "lbg_handler_seconds", "Handler run time per message (successful attempts).", ("group", "queue")
)
HANDOVER_SECONDS = Latency(
    "lbg_handover_release_seconds",
    "A planned handover by this client: from the decision to the queue's release.",
    ("group", "queue"),
)


def package_version() -> str:
    """The installed distribution's version (pyproject.toml), so --version never drifts."""
    import importlib.metadata  # only when asked: with the lookup, a twentieth of a start-up

    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


class StatsCollector:
    """Turns a daemon's stats into metric families when Prometheus scrapes (a
    prometheus_client collector: it only needs `collect`)."""

    def __init__(self, read: Callable[[], Iterable[Family]]) -> None:
        self._read = read

    def collect(self) -> Iterable[Family]:
        """The daemon's families, and `lbg_build_info` naming the running version."""
        from prometheus_client.core import InfoMetricFamily

        info = InfoMetricFamily("lbg_build", "The running sticky-lbg build.")
        info.add_metric([], {"version": package_version()})
        return [info, *self._read()]


def counter(name: str, doc: str, group: str, value: float) -> CounterMetricFamily:
    """A counter of one group (exposed as `<name>_total`)."""
    from prometheus_client.core import CounterMetricFamily

    family = CounterMetricFamily(name, doc, labels=["group"])
    family.add_metric([group], value)
    return family


def gauge(name: str, doc: str, group: str, value: float) -> GaugeMetricFamily:
    """A gauge of one group."""
    from prometheus_client.core import GaugeMetricFamily

    family = GaugeMetricFamily(name, doc, labels=["group"])
    family.add_metric([group], value)
    return family


class LoopWatch:
    """Ticks on the event loop; how late the last tick came says whether the loop is alive."""

    def __init__(self) -> None:
        self.last_tick = time.monotonic()
        self.lag = 0.0

    async def tick(self) -> None:
        """On each multiple of TICK_SECONDS (with the process's other periodic work), note the
        time and how late the loop woke this task."""
        while True:
            delay = until_next(TICK_SECONDS)
            await asyncio.sleep(delay)
            now = time.monotonic()
            self.lag = max(0.0, now - self.last_tick - delay)
            self.last_tick = now

    def alive(self) -> bool:
        """Whether the loop ran the tick recently."""
        return time.monotonic() - self.last_tick < LIVENESS_SECONDS


def health_app(
    registry: CollectorRegistry, ready: Callable[[], bool], watch: LoopWatch
) -> web.Application:
    """The routes: /metrics (Prometheus text), /healthz and /readyz (JSON, 200 or 503)."""
    from aiohttp import web  # only where a server runs: its import is a tenth of a start-up
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

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
    latencies: Iterable[Latency] = (),
) -> AsyncIterator[None]:
    """Serve the daemon's metrics (its collector and `latencies` only) and its health on
    the running loop while the block runs; port 0 means no server (and no histograms)."""
    if not port:
        yield
        return
    from aiohttp import web
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry(auto_describe=True)
    registry.register(StatsCollector(read))
    for latency in latencies:
        registry.register(latency.made())
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
