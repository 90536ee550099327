"""A short headless Locust peak (loadtest/run_peak.py) against the real broker, clients running."""

import os
import subprocess
import sys
from pathlib import Path

import orjson

RUN_PEAK = Path(__file__).resolve().parents[2] / "loadtest" / "run_peak.py"


# A client runs at most a few of these at once (sync handlers run in its thread pool), so one
# client falls behind the peak's 100 events/s and the autoscaler must add another.
SLOW_HANDLER = """
import time
from lbg.handlers import republish

def handle(event, context):
    time.sleep(0.1)
    return republish(event, context)
"""


def test_peak_publishes_acks_and_the_validator_finds_nothing_lost(
    nats_url: str, tmp_path: Path
) -> None:
    out = tmp_path / "peak"
    (tmp_path / "slow_handler.py").write_text(SLOW_HANDLER)
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    result = subprocess.run(
        [
            sys.executable,
            str(RUN_PEAK),
            *("--broker-url", nats_url, "--out", str(out), "--json"),
            *("--users", "10", "--user-rate", "10", "--ramp", "4", "--hold", "7"),
            *("--handler", "slow_handler:handle", "--clients", "1", "--cooldown", "1"),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env=dict(os.environ, PYTHONPATH=path),
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]

    summary = orjson.loads(result.stdout.strip().splitlines()[-1])
    entries = orjson.loads((out / "peak.json").read_bytes())
    requests = sum(entry["num_requests"] for entry in entries)
    assert requests > 100
    assert sum(entry["num_failures"] for entry in entries) == 0
    assert {entry["name"] for entry in entries} >= {"order_created", "paid"}
    assert summary["locust"] == {"requests": requests, "failures": 0}
    history = (out / "peak_stats_history.csv").read_text().splitlines()
    assert len(history) > 5 and "User Count" in history[0]
    assert (out / "peak_stats.csv").stat().st_size > 0
    assert (out / "peak.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = summary["report"]
    assert (report["lost"], report["reordered"]) == (0, 0)
    assert report["unique"] >= requests, "an acked publish never reached the validator"
    clients = summary["clients"]
    assert clients["max"] > 1, "the autoscaler did not add a client for the peak"
    assert clients["last"] == 1, "the autoscaler did not scale back down after the peak"
