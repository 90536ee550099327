"""bench/rebalance.py says when a broker's rounds ran on a saturated machine, since its
latencies are then the machine's as much as the group's."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2] / "bench"))

import rebalance


def test_only_a_saturated_brokers_run_gets_the_note() -> None:
    results = {
        "nats": {"dynamic": {"machine_busy_pct": 57.0}},
        "rabbitmq": {"dynamic": {"machine_busy_pct": 99.8}},
        "messagedb": {"error": "no record in 15 s"},
    }

    notes = rebalance.saturation_notes(results)

    assert len(notes) == 1
    assert notes[0].startswith("rabbitmq: the machine was 99.8 % busy during the rounds")
