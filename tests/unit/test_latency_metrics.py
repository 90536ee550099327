"""Latency histograms cost nothing until a daemon serves metrics: a daemon's start-up does
not import prometheus_client, and a series bound before `serve` counts from then on."""

import subprocess
import sys

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from lbg.metrics import Latency


def test_no_daemon_imports_prometheus_client_or_package_metadata_at_start() -> None:
    probe = (
        "import sys, lbg.cli.client, lbg.cli.publisher, lbg.cli.validator;"
        "print(sorted(m for m in ('prometheus_client', 'importlib.metadata') if m in sys.modules))"
    )
    found = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert found.strip() == "[]"


def count_of(latency: Latency) -> dict[str, float]:
    registry = CollectorRegistry()
    registry.register(latency.made())
    text = generate_latest(registry).decode()
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.endswith("_count")
    }


def test_a_series_bound_before_the_histogram_exists_counts_once_it_does() -> None:
    latency = Latency("lbg_test_seconds", "A test latency.", ("group",))
    series = latency.labels("orders")
    series.observe(0.5)
    assert latency.histogram is None, "observing alone makes no histogram"
    latency.made()
    series.observe(0.25)
    series.observe(0.125)
    assert count_of(latency) == {"lbg_test_seconds_count": 2.0}
