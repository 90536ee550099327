"""Prometheus metrics of every daemon, served on `--metrics-port` (0: off).

Counters and gauges are read from each daemon's own stats at scrape time (a collector per
daemon), so the hot paths only keep their plain counters; latencies are histograms observed
where they happen. Every series carries the group's name as the `group` label.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import Histogram, start_http_server
from prometheus_client.core import REGISTRY, CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

PUBLISH_SECONDS = Histogram(
    "lbg_publish_ack_seconds",
    "Publish to broker acknowledgement, per event.",
    ["group"],
    buckets=LATENCY_BUCKETS,
)
HANDLER_SECONDS = Histogram(
    "lbg_handler_seconds",
    "Handler run time per message (successful attempts).",
    ["group", "queue"],
    buckets=LATENCY_BUCKETS,
)
HANDOVER_SECONDS = Histogram(
    "lbg_handover_release_seconds",
    "A planned handover by this client: from the decision to the queue's release.",
    ["group", "queue"],
    buckets=LATENCY_BUCKETS,
)

Family = CounterMetricFamily | GaugeMetricFamily


class StatsCollector(Collector):
    """Turns a daemon's stats into metric families when Prometheus scrapes."""

    def __init__(self, read: Callable[[], Iterable[Family]]) -> None:
        self._read = read

    def collect(self) -> Iterable[Family]:
        return list(self._read())


def counter(name: str, doc: str, group: str, value: float) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=["group"])
    family.add_metric([group], value)
    return family


def gauge(name: str, doc: str, group: str, value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=["group"])
    family.add_metric([group], value)
    return family


def serve(port: int, address: str, read: Callable[[], Iterable[Family]]) -> Any:
    """Register the daemon's collector and serve /metrics; port 0 means no server."""
    if not port:
        return None
    REGISTRY.register(StatsCollector(read))
    server, _thread = start_http_server(port, addr=address)
    log.info("metrics on http://%s:%d/metrics", address, port)
    return server
