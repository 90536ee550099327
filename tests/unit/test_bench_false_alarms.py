"""bench/rebalance.py counts the false alarms of a run: live members a peer declared gone,
and live members that fenced themselves; a killed or departed member's eviction is no alarm."""

import sys
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2] / "bench"))

import rebalance


def line(at: float, text: str) -> str:
    stamp = datetime.fromtimestamp(at).strftime("%Y-%m-%d %H:%M:%S,%f")[:23]
    return f"{stamp} INFO    lbg.client.coordinator: {text}\n"


def test_only_members_still_running_count_as_false_alarms(tmp_path: Path) -> None:
    t0 = 1_800_000_000.0
    run = rebalance.DynamicRun(group=None)  # type: ignore[arg-type]
    run.actions = [
        rebalance.Action("kill", "member-2", t0 + 10),
        rebalance.Action("leave", "member-3", t0 + 20),
    ]
    logs = {"member-1": tmp_path / "member-1.log", "publisher": tmp_path / "publisher.log"}
    logs["member-1"].write_text(
        line(t0 + 5, "member member-2 is gone (lease lapsed)")  # alive until t0 + 10: false
        + line(t0 + 11, "member member-2 is gone (lease lapsed)")  # killed: true
        + line(t0 + 21, "member member-3 is gone (lease lapsed)")  # left: true
        + line(t0 + 30, "member member-4 is gone (lease lapsed)")  # never removed: false
        + line(t0 + 31, "member member-1: own heartbeats lapsed (...); fencing its queues")
    )
    logs["publisher"].write_text(line(t0 + 40, "member member-5 is gone"))

    assert rebalance.false_alarms(run, logs) == {"evictions": 2, "fences": 1}
