"""The chaos soak, short: a minute of kills, stalls, restarts and a broker restart, and the
validator still counts 0 lost and 0 reordered (`make soak` runs it for ten minutes)."""

import subprocess
from pathlib import Path

import orjson

from lbg.devstack.alarms import EVICTED, SELF_FENCED
from lbg.devstack.chaos import Fault
from lbg.devstack.deployment import script

SOAK_SECONDS = 60


def test_a_minute_of_chaos_loses_and_reorders_nothing(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            script("lbg"),
            "soak",
            "--duration",
            str(SOAK_SECONDS),
            "--fault-interval",
            "2.5",
            "--workdir",
            str(tmp_path),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=SOAK_SECONDS + 240,
    )
    outcome = orjson.loads(result.stdout.strip().splitlines()[-1])
    report = outcome["report"]
    assert outcome["ok"], result.stdout[-3000:]
    assert result.returncode == 0
    assert report["lost"] == 0 and report["reordered"] == 0
    assert report["published"] > SOAK_SECONDS * 200
    assert outcome["faults"][Fault.BROKER_RESTART.value] == 1
    assert sum(outcome["faults"].values()) >= SOAK_SECONDS / 5
    assert sum(outcome["duplicate_causes"].values()) == report["duplicates"]
    assert not outcome["tracebacks"]
    assert set(outcome["false_alarms"]) == {EVICTED, SELF_FENCED}
