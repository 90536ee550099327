"""The peak picture (`make peak`): what a run saw each second, its verdict, and the plot.

The run collects two things: samples of the group (every poll: running clients, the backlog,
the oldest unprocessed event's age, what the autoscaler wanted) and one record per processed
event (its publish time, when its validation record was stored, the client). From them come
one row per second (published and processed events/s, backlog, lag, end-to-end latency p50 and
p99 in ms, clients), the verdict (did the stage keep up; max lag, max p99, how fast a scale-up
came) and a PNG with all of it on one time axis.
"""

from __future__ import annotations

import csv
import itertools
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path


@dataclass(frozen=True)
class Sample:
    """The group at one poll: running clients, lag, and the count the autoscaler wanted."""

    at: float
    clients: int
    backlog: int
    oldest_age: float
    wanted: int


@dataclass(frozen=True)
class Handled:
    """One processed event: published (producer's clock), processed (record stored), by whom."""

    published_at: float
    processed_at: float
    client: str


@dataclass(frozen=True)
class Second:
    """One second of the run (from its start); rates are events in that second."""

    second: int
    published: int
    processed: int
    backlog: int
    oldest_age_s: float
    e2e_p50_ms: float
    e2e_p99_ms: float
    clients: int


def percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile of sorted `values` (0.0 for none)."""
    if not values:
        return 0.0
    return values[max(0, math.ceil(fraction * len(values)) - 1)]


def seconds(samples: Sequence[Sample], records: Iterable[Handled], start: float) -> list[Second]:
    """One row per second from `start` to the last sample or record: publishes counted in the
    second they were published, processing and latency in the second they were processed,
    the highest backlog and lag and the last client count sampled in it (carried over a
    second without a sample)."""
    published: dict[int, int] = defaultdict(int)
    latencies: dict[int, list[float]] = defaultdict(list)
    for record in records:
        published[int(record.published_at - start)] += 1
        latencies[int(record.processed_at - start)].append(
            max(0.0, record.processed_at - record.published_at) * 1000.0
        )
    by_second: dict[int, list[Sample]] = defaultdict(list)
    for sample in samples:
        by_second[int(sample.at - start)].append(sample)
    last = max([*published, *latencies, *by_second, 0])
    rows, clients = [], samples[0].clients if samples else 0
    for second in range(last + 1):
        polled = by_second.get(second, [])
        clients = polled[-1].clients if polled else clients
        done = sorted(latencies.get(second, []))
        rows.append(
            Second(
                second,
                published.get(second, 0),
                len(done),
                max((s.backlog for s in polled), default=0),
                round(max((s.oldest_age for s in polled), default=0.0), 3),
                round(percentile(done, 0.5), 2),
                round(percentile(done, 0.99), 2),
                clients,
            )
        )
    return rows


@dataclass(frozen=True)
class Verdict:
    """What a user wants to know after the peak."""

    kept_up: bool
    max_backlog: int
    max_lag_s: float
    max_e2e_p99_ms: float
    scale_ups: int
    scale_downs: int
    reaction_start_s: float | None
    reaction_processing_s: float | None
    clients_path: list[int]

    def to_text(self) -> str:
        """A few lines for the terminal and verdict.txt."""

        def secs(value: float | None) -> str:
            return "-" if value is None else f"{value:.1f} s"

        path = " -> ".join(map(str, self.clients_path))
        return "\n".join(
            [
                f"kept up       {'yes' if self.kept_up else 'NO'}",
                f"max lag       {self.max_lag_s:.2f} s (oldest unprocessed event), "
                f"max backlog {self.max_backlog} events",
                f"max e2e p99   {self.max_e2e_p99_ms:.1f} ms (publish to processed, per second)",
                f"scale-up      {secs(self.reaction_start_s)} from the lag asking for more "
                f"clients to a new one running, {secs(self.reaction_processing_s)} to its "
                "first processed event",
                f"clients       {path} ({self.scale_ups} up, {self.scale_downs} down)",
            ]
        )


def verdict(
    samples: Sequence[Sample],
    records: Sequence[Handled],
    rows: Sequence[Second],
    drained: bool,
    lag_limit: float,
) -> Verdict:
    """The verdict: kept up if every event was processed and the lag stayed under
    `lag_limit` s; the scale-up reaction is timed from the first poll whose lag asked for more
    clients than ran to the next count increase and to the first event a new client processed."""
    path: list[int] = []
    for sample in samples:
        if not path or path[-1] != sample.clients:
            path.append(sample.clients)
    steps = list(itertools.pairwise(path))
    max_lag = max((s.oldest_age for s in samples), default=0.0)
    asked = next((s for s in samples if s.wanted > s.clients > 0), None)
    start_s = processing_s = None
    if asked is not None:
        grown = next((s for s in samples if s.at >= asked.at and s.clients > asked.clients), None)
        start_s = None if grown is None else grown.at - asked.at
        first: dict[str, float] = {}
        for record in records:
            first[record.client] = min(first.get(record.client, math.inf), record.processed_at)
        newcomers = [at for at in first.values() if at > asked.at]
        processing_s = min(newcomers) - asked.at if newcomers else None
    return Verdict(
        kept_up=drained and max_lag <= lag_limit,
        max_backlog=max((s.backlog for s in samples), default=0),
        max_lag_s=round(max_lag, 3),
        max_e2e_p99_ms=max((r.e2e_p99_ms for r in rows), default=0.0),
        scale_ups=sum(1 for a, b in steps if b > a),
        scale_downs=sum(1 for a, b in steps if b < a),
        reaction_start_s=None if start_s is None else round(start_s, 3),
        reaction_processing_s=None if processing_s is None else round(processing_s, 3),
        clients_path=path,
    )


def write_csv(path: Path, rows: Sequence[Second]) -> None:
    """The per-second rows as CSV, one column per field."""
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, [f.name for f in fields(Second)])
        writer.writeheader()
        writer.writerows(asdict(row) for row in rows)


def plot(path: Path, rows: Sequence[Second], title: str) -> None:
    """Rates, backlog and lag, end-to-end latency and clients, on one time axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    x = [row.second for row in rows]
    figure, (rates, backlog, latency, clients) = plt.subplots(
        4, 1, sharex=True, figsize=(10, 10), height_ratios=[3, 2, 3, 1.5]
    )
    rates.plot(x, [r.published for r in rows], label="published", color="tab:blue")
    rates.plot(x, [r.processed for r in rows], label="processed", color="tab:orange")
    rates.set_ylabel("events/s")
    rates.legend(loc="upper right")
    backlog.fill_between(x, [r.backlog for r in rows], step="post", alpha=0.4, color="tab:red")
    backlog.step(x, [r.backlog for r in rows], where="post", color="tab:red", label="backlog")
    backlog.set_ylabel("backlog\n(events)")
    age = backlog.twinx()
    age.plot(x, [r.oldest_age_s for r in rows], color="black", lw=1, label="oldest age (s)")
    age.set_ylabel("oldest\nunprocessed (s)")
    backlog.legend(loc="upper left")
    age.legend(loc="upper right")
    latency.plot(x, [r.e2e_p50_ms for r in rows], label="p50", color="tab:green")
    latency.plot(x, [r.e2e_p99_ms for r in rows], label="p99", color="tab:purple")
    latency.set_ylabel("publish to processed\n(ms, per second)")
    latency.legend(loc="upper right")
    clients.step(x, [r.clients for r in rows], where="post", color="tab:brown")
    clients.set_ylabel("lbg-clients")
    clients.yaxis.set_major_locator(MaxNLocator(integer=True))
    clients.set_ylim(0, max((r.clients for r in rows), default=1) + 1)
    clients.set_xlabel("seconds since the start")
    for axis in (rates, backlog, latency, clients):
        axis.grid(alpha=0.3)
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
