"""A short headless Locust peak (loadtest/run_peak.py) against the real broker, clients running."""

import subprocess
import sys
from pathlib import Path

import orjson

RUN_PEAK = Path(__file__).resolve().parents[2] / "loadtest" / "run_peak.py"


def test_peak_scales_up_and_down_and_the_verdict_says_how_it_went(
    nats_url: str, tmp_path: Path
) -> None:
    # 300 ms of work per event (a sleep in the client's few handler threads): one client
    # manages about 20 events/s, and low marks make the autoscaler add clients even when a
    # busy machine lets Locust publish far below the nominal 100 events/s.
    out = tmp_path / "peak"
    result = subprocess.run(
        [
            sys.executable,
            str(RUN_PEAK),
            *("--broker-url", nats_url, "--out", str(out), "--json"),
            *("--users", "10", "--user-rate", "10", "--ramp", "4", "--hold", "7"),
            *("--work-ms", "300", "--clients", "1", "--cooldown", "1", "--calm", "2"),
            *("--scale-high", "5", "--scale-low", "1", "--high-age", "0.5", "--low-age", "0.4"),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]

    summary = orjson.loads(result.stdout.strip().splitlines()[-1])
    entries = orjson.loads((out / "peak.json").read_bytes())
    requests = sum(entry["num_requests"] for entry in entries)
    assert requests > 50
    assert summary["locust"] == {"requests": requests, "failures": 0}
    assert {entry["name"] for entry in entries} >= {"order_created", "paid"}
    report = summary["report"]
    assert (report["lost"], report["reordered"]) == (0, 0)
    assert report["unique"] >= requests, "an acked publish never reached the validator"

    verdict = summary["verdict"]
    assert verdict["scale_ups"] >= 1, f"the autoscaler did not add a client: {verdict}"
    assert verdict["scale_downs"] >= 1, f"the autoscaler did not remove one after: {verdict}"
    path = verdict["clients_path"]
    assert path[0] == path[-1] == 1 and max(path) > 1
    assert verdict["max_backlog"] > 0 and verdict["max_lag_s"] > 0
    assert verdict["max_e2e_p99_ms"] > 0 and verdict["reaction_start_s"] is not None
    assert isinstance(verdict["kept_up"], bool)
    text = (out / "verdict.txt").read_text()
    for line in ("kept up", "max lag", "max e2e p99", "scale-up", "clients"):
        assert line in text
    rows = (out / "peak_seconds.csv").read_text().splitlines()
    assert rows[0].startswith("second,published,processed,backlog,oldest_age_s,e2e_p50_ms")
    assert len(rows) > 10
    assert (out / "peak.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "Starting Locust" in (out / "locust.log").read_text(), "locust.log is empty"
    assert "held back by the" in (out / "autoscale.log").read_text()
