"""lbg.devstack.alarms reads the lease's alarms out of a client's log: who was declared gone,
who fenced itself, and when."""

from datetime import datetime
from pathlib import Path

from lbg.devstack.alarms import EVICTED, SELF_FENCED, LeaseAlarm, lease_alarms


def line(at: float, text: str, level: str = "INFO") -> str:
    stamp = datetime.fromtimestamp(at).strftime("%Y-%m-%d %H:%M:%S,%f")[:23]
    return f"{stamp} {level:<7} lbg.client.coordinator: {text}\n"


def test_evictions_and_self_fences_come_out_in_time_order(tmp_path: Path) -> None:
    t0 = 1_800_000_000.0
    log = tmp_path / "client-1.log"
    log.write_text(
        line(t0 + 2, "member client-2 is gone (lease lapsed)")
        + "a line without a time: member client-9 is gone\n"
        + line(t0 + 1, "member client-1: own heartbeats lapsed (this member was stalled or")
        + line(
            t0 + 1.5,
            "member client-1: own heartbeats lapsed (this member was stalled or cut off)"
            " (its newest heartbeat that came back was sent 0.61s ago); fencing its queues",
            "WARNING",
        )
        + line(t0 + 3, "member client-3 joined; members ['client-1', 'client-3']")
        + line(
            t0 + 4,
            "member client-1: connection to the broker lost (its newest heartbeat that came"
            " back was sent 0.12s ago); fencing its queues",
            "WARNING",
        )
    )
    assert lease_alarms(log) == [
        LeaseAlarm(SELF_FENCED, "client-1", t0 + 1.5),
        LeaseAlarm(EVICTED, "client-2", t0 + 2),
        LeaseAlarm(SELF_FENCED, "client-1", t0 + 4),
    ]


def test_a_missing_log_has_no_alarms(tmp_path: Path) -> None:
    assert lease_alarms(tmp_path / "never-started.log") == []
