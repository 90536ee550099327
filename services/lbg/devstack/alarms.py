"""The lease's alarms as the clients log them: a peer declared gone, a member fenced itself.

A run that cuts no one off (a bench, a soak between its faults) should have none: each is a
live member the lease took for dead, which costs a handover and duplicates (never a loss or
a reorder). bench/rebalance.py and the soak read the daemons' logs with this and count the
alarms their own faults do not explain.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

LOG_TIME_FORMAT = "%Y-%m-%d %H:%M:%S,%f"
# lbg.client.coordinator: "member <id> is gone (lease lapsed)", said by each peer that saw it.
GONE_LINE = re.compile(r"member (\S+) is gone")
# lbg.client.coordinator: "member <id>: own heartbeats lapsed (...); fencing its queues", or
# "member <id>: connection to the broker lost (...); fencing its queues".
FENCE_LINE = re.compile(r"member ([^\s:]+): .*; fencing its queues")

EVICTED = "evicted"
SELF_FENCED = "self-fenced"


@dataclass(frozen=True)
class LeaseAlarm:
    """One alarm: `member` was evicted by a peer, or fenced itself, at `at` (epoch seconds)."""

    kind: str
    member: str
    at: float


def log_lines(path: Path, pattern: re.Pattern[str]) -> list[tuple[float, re.Match[str]]]:
    """(epoch time, match) of a daemon's log lines that `pattern` finds something in."""
    found: list[tuple[float, re.Match[str]]] = []
    if not path.exists():
        return found
    for line in path.read_text(errors="replace").splitlines():
        if (match := pattern.search(line)) is None:
            continue
        with contextlib.suppress(ValueError):
            found.append((datetime.strptime(line[:23], LOG_TIME_FORMAT).timestamp(), match))
    return found


def lease_alarms(path: Path) -> list[LeaseAlarm]:
    """Every eviction and self-fence one client's log tells of, in the log's order."""
    alarms = [LeaseAlarm(EVICTED, match[1], at) for at, match in log_lines(path, GONE_LINE)]
    alarms += [LeaseAlarm(SELF_FENCED, match[1], at) for at, match in log_lines(path, FENCE_LINE)]
    return sorted(alarms, key=lambda alarm: alarm.at)
