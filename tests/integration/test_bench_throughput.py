"""bench/throughput.py runs end to end on a private NATS: sticky, competing and raw modes,
their ratios and the per-event CPU, in the table and in --json. Rates are not checked: this
only proves the bench works, on whatever load the machine has."""

import json
import subprocess
import sys
from pathlib import Path

THROUGHPUT = Path(__file__).parents[2] / "bench" / "throughput.py"
MODES = ("sticky", "competing", "raw")
CPU_PARTS = {"clients", "publisher", "broker", "bench"}


def test_a_small_run_measures_all_three_modes_and_their_ratios() -> None:
    command = [sys.executable, str(THROUGHPUT), "--broker", "nats", "--events", "500", "--json"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)

    assert result.returncode == 0, result.stderr[-3000:]
    nats = json.loads(result.stdout.splitlines()[-1])["nats"]
    for mode in MODES:
        figures = nats[mode]
        assert figures["rate"] > 0, mode
        assert figures["lost"] == 0, mode
        per_event = figures["cpu_us_per_event"]
        assert set(per_event) == CPU_PARTS, mode
        assert all(isinstance(per_event[part], int | float) for part in CPU_PARTS), mode
        assert figures["client_peak_rss_mb"] > 0, mode
    assert nats["sticky"]["reordered"] == 0
    assert nats["raw"]["duplicates"] == 0
    assert nats["ratio_sticky_raw"] == round(nats["sticky"]["rate"] / nats["raw"]["rate"], 3)
    assert nats["ratio_competing_raw"] == round(nats["competing"]["rate"] / nats["raw"]["rate"], 3)
    assert sorted(run["mode"] for run in nats["runs"]) == sorted(MODES)
    assert "ratio sticky / raw" in result.stdout
    assert "CPU us/event: broker" in result.stdout
