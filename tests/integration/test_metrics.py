"""Every daemon serves Prometheus metrics that agree with what it did (on every broker)."""

import importlib.metadata
import time
import urllib.request
from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families

from lbg.devstack.deployment import LocalDeployment
from lbg.devstack.embedded import free_port

EVENTS = 600
Samples = dict[str, float]


def scrape(port: int) -> Samples:
    """Every sample on /metrics by name (labels dropped: one group per daemon here), checked
    against Prometheus conventions: counters end in `_total`, no value below 0 (no sentinel),
    `lbg_build_info` names the installed version."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if family.type == "counter" and not sample.name.endswith("_created"):
                assert sample.name.endswith("_total"), sample
            if family.name == "lbg_build":
                assert sample.labels == {"version": importlib.metadata.version("sticky-lbg")}
            assert sample.value >= 0, sample
            samples[sample.name] = samples.get(sample.name, 0.0) + sample.value
    return samples


def wait_until(port: int, check: Callable[[Samples], bool], timeout: float = 30) -> Samples:
    """Scrape until `check(samples)` holds; the samples that satisfied it."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            samples = scrape(port)
        except OSError:
            samples = {}
        if check(samples):
            return samples
        assert time.monotonic() < deadline, f"metrics on :{port} never got there: {samples}"
        time.sleep(0.2)


def wait_for_metric(port: int, name: str, value: float) -> Samples:
    return wait_until(port, lambda samples: samples.get(name) == value)


def test_client_publisher_and_validator_metrics_count_the_same_events(
    make_group, deployment: LocalDeployment
) -> None:
    make_group()
    client_port, publisher_port, validator_port = free_port(), free_port(), free_port()
    metrics = "--metrics-port"
    deployment.start("client-a", "lbg-client", "--id", "client-a", metrics, str(client_port))
    deployment.start(
        "validator", "validation-client", "--progress-interval", "0", metrics, str(validator_port)
    )
    wait_for_metric(client_port, "lbg_group_members", 1)
    deployment.start_publisher(
        "pub", "--keys", "30", "--count", str(EVENTS), "--rate", "100", "--no-summary",
        metrics, str(publisher_port),
    )  # fmt: skip

    publisher = wait_until(publisher_port, lambda m: m.get("lbg_publisher_acked_total", 0) >= 100)
    client = wait_for_metric(client_port, "lbg_client_processed_total", EVENTS)
    validator = wait_for_metric(validator_port, "lbg_validator_unique_total", EVENTS)

    assert publisher["lbg_publish_ack_seconds_count"] == publisher["lbg_publisher_acked_total"]
    assert publisher["lbg_publisher_keys"] == 30
    assert publisher["lbg_publisher_failed"] == 0
    assert client["lbg_handler_seconds_count"] == EVENTS
    assert client["lbg_client_queues_active"] == 4
    assert client["lbg_client_dead_lettered_total"] == 0
    assert 0 < client["lbg_client_heartbeat_echo_seconds"] < 1, "no heartbeat came back"
    assert validator["lbg_validator_reordered_total"] == 0
    assert validator["lbg_validator_duplicates_total"] == 0
    assert validator["lbg_validator_lost_known"] == 0, "no summary was sent: loss is unknown"
    assert "lbg_validator_lost" not in validator
    assert 0 < time.time() - validator["lbg_validator_last_record_timestamp_seconds"] < 60
    for samples in (publisher, client, validator):
        assert samples["lbg_build_info"] == 1
    # Each daemon exposes its own metrics only: no other daemon's histograms.
    assert not any(name.startswith(("lbg_handler_", "lbg_handover_")) for name in publisher)
    assert not any(name.startswith("lbg_publish_ack_") for name in client)
    assert not any(name.startswith(("lbg_handler_", "lbg_publish_ack_")) for name in validator)
    assert 0 < validator["lbg_validator_key_lag_max_seconds"] < 30
    assert (
        0
        < validator["lbg_validator_key_lag_mean_seconds"]
        <= validator["lbg_validator_key_lag_max_seconds"]
    )
