"""CPU measurements from /proc shared by the benchmarks (Linux only)."""

import os
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def machine_busy_seconds() -> float:
    """CPU seconds all CPUs spent busy (not idle or waiting for I/O) since boot."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (sum(fields) - fields[3] - fields[4]) / CLOCK_TICKS
