"""Metric names and types follow Prometheus conventions: counters end in `_total`, no
sentinel values, `lbg_build_info` names the version, each daemon registers only its own."""

import importlib.metadata

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from lbg.metrics import StatsCollector
from lbg.validator import Validator


def exposed(validator: Validator) -> dict[str, tuple[str, float]]:
    """Each sample the validator's collector exposes: its family type and value."""
    registry = CollectorRegistry()
    registry.register(StatsCollector(lambda: validator.metric_families("orders")))
    text = generate_latest(registry).decode()
    return {
        sample.name: (family.type, sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_validator_totals_are_counters_and_unknown_loss_is_absent() -> None:
    samples = exposed(Validator())
    for name in ("delivered", "unique", "duplicates", "reordered", "gaps", "dead_lettered"):
        assert samples[f"lbg_validator_{name}_total"] == ("counter", 0.0)
    assert samples["lbg_validator_keys"] == ("gauge", 0.0)
    assert samples["lbg_validator_lost_known"] == ("gauge", 0.0)
    assert "lbg_validator_lost" not in samples
    assert "lbg_validator_last_record_timestamp_seconds" not in samples, "no record yet"
    assert all(value >= 0 for _kind, value in samples.values())


def test_every_endpoint_has_the_build_info_and_no_other_daemons_histograms() -> None:
    samples = exposed(Validator())
    assert samples["lbg_build_info"][1] == 1.0
    assert not any(name.startswith(("lbg_handler_", "lbg_publish_ack_")) for name in samples)
    registry = CollectorRegistry()
    registry.register(StatsCollector(list))
    text = generate_latest(registry).decode()
    assert f'lbg_build_info{{version="{importlib.metadata.version("sticky-lbg")}"}} 1.0' in text
