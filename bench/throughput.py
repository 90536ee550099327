"""End-to-end throughput of an LBG: sticky (exclusive queues), competing consumers, and raw.

publisher -> N lbg-client processes -> in-process validator, on real processes and a real
broker: the whole scenario runs on each broker in turn (NATS JetStream, RabbitMQ), so their
figures come from one invocation. The raw mode is the same pipeline written on the broker's
own client library (raw_pipeline.py), the yardstick for the other two. Every mode runs on
each broker, the order reversed every other round so that drift on the machine hits them
alike; the rates reported are medians over the rounds.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import click
import uvloop

import raw_pipeline
from lbg.aio import cancel_and_wait
from lbg.broker.base import Broker, BrokerError, OutputMessage
from lbg.devstack.deployment import Daemon, LocalDeployment
from lbg.model.destinations import OutputKind
from lbg.model.group import GroupConfig, GroupConfigError
from lbg.validator import Validator
from measure import (
    BenchError,
    BrokerRun,
    Echo,
    broker_options,
    chosen_brokers,
    cpu_seconds,
    follow_records,
    machine_busy_seconds,
    own_cpu_seconds,
    passed,
    reaped_children_cpu_seconds,
    run_per_broker,
    table,
    tidy_workdir,
    verdict,
)
from raw_events import Tally

MODES = ("sticky", "competing", "raw")
LBG_MODES = ("sticky", "competing")
RAW_PIPELINE = Path(__file__).with_name("raw_pipeline.py")
# Clients release secondary queues this often, so the pins settle on the primaries soon after
# the warm-up; once they have, the cycle finds nothing to release and costs nothing.
CYCLE_SECONDS = 1.0
PUBLISH_WINDOW = 2000
WARMUP_KEYS_PER_QUEUE = 20
WARMUP_RATE = 500.0
WARMUP_SECONDS = 1.0
POLL_SECONDS = 0.05
QUEUE_POLL_SECONDS = 0.25
CONVERGE_TIMEOUT = 30.0
PROGRESS_SECONDS = 3.0
BIND_TIMEOUT = 30.0
SUMMARY_TIMEOUT = 10.0
PUBLISHER_EXIT_TIMEOUT = 30.0
TARGET_RATIO = 0.95
TARGET_RAW_RATIO = 0.7


@dataclass(frozen=True)
class Options:
    """What every measured run shares, on every broker."""

    events: int
    clients: int
    queues: int
    hash_count: int
    keys: int
    rounds: int

    @property
    def warmup_keys(self) -> int:
        """Warm-up keys: enough that every queue gets events (each misses with p ~ e^-20)."""
        return max(self.keys, WARMUP_KEYS_PER_QUEUE * self.queues)

    @property
    def timeout(self) -> float:
        """Seconds one mode may take: generous even at a few hundred events/s."""
        return 30.0 + self.events / 500


@dataclass
class ModeResult:
    """One measured run of one mode; rates in events/s, times in s, memory in MB.

    `rate` is end to end (publisher start until the validator, or raw mode's reader, saw
    every event); `publisher_rate` is the publisher's own acked events/s; `processed_rate`
    spans the times of the first and the last record of the measured events (the clients'
    pace); `validator_lag_s` is how long after that last record the reader had seen
    everything. `cpu_us_per_event` is CPU microseconds per measured event of the clients
    (all together), the publisher, the broker and the bench process (the validator or
    reader). `served_queues` (sticky only) names the client that delivered each queue's last
    event.
    """

    mode: str
    round: int
    elapsed_s: float
    rate: float
    publisher_rate: float
    processed_rate: float
    validator_lag_s: float
    reordered: int
    lost: int | None
    duplicates: int
    reassignments: int
    per_client: dict[str, int]
    served_queues: dict[str, list[int]]
    client_peak_rss_mb: dict[str, float]
    client_cpu_s: dict[str, float]
    publisher_cpu_s: float
    broker_cpu_s: float | None
    bench_cpu_s: float
    cpu_us_per_event: dict[str, float | None]
    machine_busy_pct: float
    other_cpu_s: float


@dataclass(frozen=True)
class Counts:
    """What the validator (or raw mode's reader) counted over one mode's events."""

    reordered: int
    lost: int | None
    duplicates: int
    reassignments: int
    per_client: dict[str, int]
    served_queues: dict[str, list[int]]


@dataclass(frozen=True)
class Usage:
    """CPU seconds and peak memory (MB) over one measurement, from /proc and os.times()."""

    client_cpu: dict[str, float]
    client_rss: dict[str, float]
    publisher_cpu: float
    broker_cpu: float | None
    bench_cpu: float
    machine_busy: float


class Meter:
    """CPU readings at a measurement's start and when its last event was seen.

    Only the publisher may exit (and be reaped) in between: the clients run on, so the CPU
    of reaped children is the publisher's.
    """

    def __init__(self, clients: list[Daemon], broker_pid: int | None) -> None:
        self._clients = clients
        self._broker_pid = broker_pid
        self._client_cpu = self._clients_cpu()
        self._broker_cpu = self._broker()
        self._bench_cpu = own_cpu_seconds()
        self._machine = machine_busy_seconds()
        self._reaped = reaped_children_cpu_seconds()
        self._seen: Usage | None = None

    def _clients_cpu(self) -> dict[str, float]:
        return {c.name: cpu_seconds(c.process.pid) or 0.0 for c in self._clients}

    def _broker(self) -> float | None:
        return cpu_seconds(self._broker_pid) if self._broker_pid else None

    def seen(self) -> None:
        """Read everything but the publisher, as soon as the last event was seen."""
        broker = self._broker()
        self._seen = Usage(
            client_cpu={n: v - self._client_cpu[n] for n, v in self._clients_cpu().items()},
            client_rss={c.name: peak_rss_mb(c.process.pid) or 0.0 for c in self._clients},
            publisher_cpu=0.0,
            broker_cpu=None
            if broker is None or self._broker_cpu is None
            else broker - self._broker_cpu,
            bench_cpu=own_cpu_seconds() - self._bench_cpu,
            machine_busy=machine_busy_seconds() - self._machine,
        )

    def usage(self) -> Usage:
        """Everything, once the publisher has been reaped (after `seen`)."""
        if self._seen is None:
            raise BenchError("the measurement's end was not read")
        return replace(self._seen, publisher_cpu=reaped_children_cpu_seconds() - self._reaped)


def peak_rss_mb(pid: int) -> float | None:
    """VmHWM (peak resident set) of a live process, from /proc; None if it is gone."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return None


class Progress(Protocol):
    """What the bench polls while a mode runs: distinct events seen so far, and a line."""

    @property
    def unique(self) -> int: ...

    def progress_line(self) -> str: ...


class Records:
    """The validator, plus the times of the first and last validation record once measuring.

    Every validation record read after `measuring` is set is of a measured event: the warm-up
    was drained before. Times are `OutputMessage.at`: the broker's store time (NATS) or the
    client's send time (RabbitMQ), both on this machine's clock for a local broker.
    """

    def __init__(self) -> None:
        self.validator = Validator()
        self.measuring = False
        self.first_at: float | None = None
        self.last_at: float | None = None

    @property
    def unique(self) -> int:
        return self.validator.report().unique

    def progress_line(self) -> str:
        return self.validator.progress_line()

    def handle(self, message: OutputMessage) -> None:
        """Validate one output message; while measuring, widen the span of record times."""
        self.validator.handle(message)
        if not self.measuring or message.kind is not OutputKind.VALIDATION:
            return
        if message.at is None:
            raise BenchError("the broker gives validation records no time")
        self.first_at = message.at if self.first_at is None else min(self.first_at, message.at)
        self.last_at = message.at if self.last_at is None else max(self.last_at, message.at)


async def wait_for_log(daemon: Daemon, text: str, timeout: float) -> None:
    """Wait until `text` appears in a daemon's log; fail if it exits or takes too long."""
    deadline = time.monotonic() + timeout
    while text not in daemon.log_path.read_text(errors="replace"):
        if not daemon.running:
            raise BenchError(f"{daemon.name} exited while starting:\n{daemon.log_tail()}")
        if time.monotonic() > deadline:
            raise BenchError(f"{daemon.name}: no '{text}' after {timeout:g} s")
        await asyncio.sleep(POLL_SECONDS)


def client_name(index: int) -> str:
    """The daemon name (and client id) of client `index`."""
    return f"client-{index}"


async def pinned(broker: Broker, group: str, config: GroupConfig) -> dict[int, str | None]:
    """The client the broker has pinned each queue to (None: not pinned)."""
    return {s.queue: s.active_client for s in await broker.queue_status(group, config)}


async def wait_primaries(
    broker: Broker, group: str, config: GroupConfig, clients: int, label: str
) -> None:
    """Wait until every queue is pinned to its primary client: the static mode's steady state.

    Pins are given on a queue's first delivery to whichever pull the server holds first (in
    practice the first client started wins them all); each client then releases its secondary
    queues every cycle, and the primaries take them with the next delivery, so events must
    keep flowing meanwhile. Only then is the load spread as designed.
    """
    want = {q: client_name(q % clients) for q in range(config.queue_count)}
    deadline = time.monotonic() + CONVERGE_TIMEOUT
    while (owners := await pinned(broker, group, config)) != want:
        if time.monotonic() > deadline:
            raise BenchError(
                f"{label} queues not on their primary clients after {CONVERGE_TIMEOUT:g} s: "
                f"{owners}"
            )
        await asyncio.sleep(QUEUE_POLL_SECONDS)


async def wait_validated(
    opts: Options,
    progress: Progress,
    reading: asyncio.Task[None],
    daemons: list[Daemon],
    target: int,
    label: str,
    echo: Echo,
) -> None:
    """Poll until `target` distinct events were seen; fail fast if anything died."""
    started = time.monotonic()
    next_progress = started + PROGRESS_SECONDS
    while progress.unique < target:
        now = time.monotonic()
        if reading.done():
            raise BenchError(f"{label} the reader stopped: {reading.exception()!r}")
        for daemon in daemons:
            if daemon.process.poll() not in (None, 0):
                raise BenchError(f"{label} {daemon.name} failed:\n{daemon.log_tail()}")
        if now - started > opts.timeout:
            raise BenchError(
                f"{label} timed out after {opts.timeout:g} s: {progress.progress_line()}"
            )
        if now >= next_progress:
            echo(f"{label} {now - started:5.1f}s {progress.progress_line()}")
            next_progress = now + PROGRESS_SECONDS
        await asyncio.sleep(POLL_SECONDS)


async def wait_summaries(validator: Validator, publishers: int) -> None:
    """Give the publishers' summaries time to arrive, so `lost` is known rather than None."""
    deadline = time.monotonic() + SUMMARY_TIMEOUT
    while time.monotonic() < deadline:
        if sum(p.complete for p in validator.summaries.values()) >= publishers:
            return
        await asyncio.sleep(POLL_SECONDS)


async def finish_publisher(publisher: Daemon, label: str) -> dict[str, Any]:
    """Reap the publisher and return its `--json` stats."""
    if await asyncio.to_thread(publisher.wait, PUBLISHER_EXIT_TIMEOUT) != 0:
        raise BenchError(f"{label} publisher failed:\n{publisher.log_tail()}")
    for line in reversed(publisher.log_path.read_text(errors="replace").splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise BenchError(f"{label} publisher printed no stats:\n{publisher.log_tail()}")


@dataclass(frozen=True)
class Measurement:
    """One mode's measured stretch: how long it took, when it ended, what it cost."""

    elapsed: float
    validated_at: float
    published: dict[str, Any]
    usage: Usage


async def measure(
    opts: Options,
    run: BrokerRun,
    clients: list[Daemon],
    start_publisher: Callable[[], Daemon],
    progress: Progress,
    reading: asyncio.Task[None],
    target: int,
    label: str,
    echo: Echo,
) -> Measurement:
    """Time the publisher's start until `progress` has seen `target` events, and what the
    clients, the publisher, the broker and this process spent meanwhile."""
    echo(f"{label} measuring: {opts.events} events")
    meter = Meter(clients, run.pid)
    started = time.monotonic()
    publisher = start_publisher()
    await wait_validated(opts, progress, reading, [*clients, publisher], target, label, echo)
    elapsed = time.monotonic() - started
    validated_at = time.time()
    meter.seen()
    published = await finish_publisher(publisher, label)
    return Measurement(elapsed, validated_at, published, meter.usage())


def mode_result(
    opts: Options,
    mode: str,
    round_no: int,
    measured: Measurement,
    span: tuple[float | None, float | None],
    counts: Counts,
    label: str,
) -> ModeResult:
    """One run's figures from its measurement, its records' time span and its counts."""
    first_record, last_record = span
    if first_record is None or last_record is None:
        raise BenchError(f"{label} no record of a measured event was read")
    usage = measured.usage
    clients = sum(usage.client_cpu.values())
    ours = clients + usage.publisher_cpu + usage.bench_cpu
    per_event = {
        "clients": clients,
        "publisher": usage.publisher_cpu,
        "broker": usage.broker_cpu,
        "bench": usage.bench_cpu,
    }
    elapsed = measured.elapsed
    return ModeResult(
        mode=mode,
        round=round_no,
        elapsed_s=round(elapsed, 3),
        rate=round(opts.events / elapsed, 1),
        publisher_rate=round(float(measured.published["rate_per_s"]), 1),
        processed_rate=round(opts.events / max(last_record - first_record, 1e-3), 1),
        validator_lag_s=round(measured.validated_at - last_record, 3),
        **asdict(counts),
        client_peak_rss_mb={n: round(v, 1) for n, v in usage.client_rss.items()},
        client_cpu_s={n: round(v, 2) for n, v in usage.client_cpu.items()},
        publisher_cpu_s=round(usage.publisher_cpu, 2),
        broker_cpu_s=None if usage.broker_cpu is None else round(usage.broker_cpu, 2),
        bench_cpu_s=round(usage.bench_cpu, 2),
        cpu_us_per_event={
            k: None if v is None else round(v * 1e6 / opts.events, 1) for k, v in per_event.items()
        },
        machine_busy_pct=round(100 * usage.machine_busy / (elapsed * (os.cpu_count() or 1)), 1),
        other_cpu_s=round(usage.machine_busy - ours - (usage.broker_cpu or 0.0), 2),
    )


async def run_mode(
    opts: Options, run: BrokerRun, broker: Broker, mode: str, round_no: int, echo: Echo
) -> ModeResult:
    """Measure sticky or competing on a fresh group, then stop its clients and delete it.

    A paced warm-up publisher first runs for a second (and, for sticky, until the queues have
    settled on their primary clients) and is drained; the measured publisher then runs alone,
    timed from its start until the validator has seen every one of its events.
    """
    label = f"[{run.kind} {mode} r{round_no}]"
    name = f"bench-{mode}-{round_no}-{uuid.uuid4().hex[:6]}"
    config = GroupConfig(
        hash_prefix=name,
        hash_count=opts.hash_count,
        queue_count=opts.queues,
        exclusive=mode == "sticky",
    )
    await broker.create_group(name, config)
    local = run.deployment(name)
    records = Records()
    validator = records.validator
    validation: asyncio.Task[None] | None = None
    try:
        clients = [
            local.start_client(client_name(i), i, opts.clients, CYCLE_SECONDS)
            for i in range(opts.clients)
        ]
        for client in clients:
            await wait_for_log(client, " bound ", BIND_TIMEOUT)
        validation = follow_records(broker, name, records.handle)
        echo(f"{label} group '{name}' {config.to_json()}: warming up")
        warmup = local.start_publisher(
            "warm-up", *("--keys", str(opts.warmup_keys), "--rate", str(WARMUP_RATE), "--json")
        )
        # Its SIGTERM below must not land before it handles signals (a slow start on a busy
        # machine), or it dies without its summary.
        await wait_for_log(warmup, " -> group ", BIND_TIMEOUT)
        await asyncio.sleep(WARMUP_SECONDS)
        if config.exclusive:
            await wait_primaries(broker, name, config, opts.clients, label)
        warmup.send(signal.SIGTERM)
        warmed = int((await finish_publisher(warmup, label))["acked"])
        await wait_validated(opts, records, validation, clients, warmed, label, echo)
        reassignments = validator.report().reassignments
        records.measuring = True
        measured = await measure(
            opts,
            run,
            clients,
            lambda: local.start_publisher(
                "publisher",
                *("--keys", str(opts.keys), "--count", str(opts.events)),
                *("--window", str(PUBLISH_WINDOW), "--json"),
            ),
            records,
            validation,
            warmed + opts.events,
            label,
            echo,
        )
        await wait_summaries(validator, 2)
        report = validator.report()
    finally:
        if validation is not None:
            await cancel_and_wait(validation)
        await asyncio.to_thread(local.stop_all)
        with contextlib.suppress(BrokerError):
            await broker.delete_group(name)
    served: dict[str, list[int]] = {}
    if config.exclusive:
        for queue in range(config.queue_count):
            owner = validator.checker.queue_owner(queue)
            if owner is not None:
                served.setdefault(owner, []).append(queue)
    counts = Counts(
        reordered=report.reordered,
        lost=report.lost,
        duplicates=report.duplicates,
        reassignments=report.reassignments - reassignments,
        per_client=report.per_client,
        served_queues=served,
    )
    span = (records.first_at, records.last_at)
    return mode_result(opts, mode, round_no, measured, span, counts, label)


def raw_command(run: BrokerRun, name: str, role: str, *args: str) -> list[str]:
    """The command line of one role of the raw pipeline `name` on this broker."""
    url = run.endpoint.url
    return [sys.executable, str(RAW_PIPELINE), "--broker-url", url, "--name", name, role, *args]


def start_raw_consumers(opts: Options, run: BrokerRun, local: LocalDeployment) -> list[Daemon]:
    """The raw pipeline's N consumer processes, named like the lbg clients."""
    return [
        local.spawn(
            client_name(i), raw_command(run, local.group, "consume", "--id", client_name(i))
        )
        for i in range(opts.clients)
    ]


async def run_raw(opts: Options, run: BrokerRun, round_no: int, echo: Echo) -> ModeResult:
    """Measure the raw pipeline on fresh objects, then stop its processes and delete them.

    No warm-up is needed: nothing has to settle, so the consumers are merely waited for
    (connected, consuming); the publisher is timed from its start until the reader has
    counted every event.
    """
    label = f"[{run.kind} raw r{round_no}]"
    name = f"bench-raw-{round_no}-{uuid.uuid4().hex[:6]}"
    raw = await raw_pipeline.connect(run.endpoint.url, name, "bench")
    local = run.deployment(name)
    tally = Tally()
    reading: asyncio.Task[None] | None = None
    try:
        await raw.create()
        consumers = start_raw_consumers(opts, run, local)
        for consumer in consumers:
            await wait_for_log(consumer, raw_pipeline.READY, BIND_TIMEOUT)
        echo(f"{label} pipeline '{name}' on {opts.clients} consumer processes")
        reading = asyncio.create_task(raw.read(tally.add))
        publish = ("--keys", str(opts.keys), "--count", str(opts.events))
        measured = await measure(
            opts,
            run,
            consumers,
            lambda: local.spawn(
                "publisher",
                raw_command(run, name, "publish", *publish, "--window", str(PUBLISH_WINDOW)),
            ),
            tally,
            reading,
            opts.events,
            label,
            echo,
        )
    finally:
        if reading is not None:
            await cancel_and_wait(reading)
        await asyncio.to_thread(local.stop_all)
        try:
            await raw.delete()
        finally:
            await raw.close()
    counts = Counts(
        reordered=tally.reordered,
        lost=opts.events - tally.unique,
        duplicates=tally.duplicates,
        reassignments=tally.moves,
        per_client=dict(tally.per_client),
        served_queues={},
    )
    span = (tally.first_at, tally.last_at)
    return mode_result(opts, "raw", round_no, measured, span, counts, label)


def round_line(result: ModeResult) -> str:
    """One line per measured run, printed as soon as it is done."""
    queues = " ".join(f"{c}:{q}" for c, q in sorted(result.served_queues.items())) or "-"
    return (
        f"{result.mode} r{result.round}: {result.rate:,.0f} events/s end to end in "
        f"{result.elapsed_s:.1f} s (publisher {result.publisher_rate:,.0f}/s, clients done at "
        f"{result.processed_rate:,.0f}/s, validator lag {result.validator_lag_s:.2f} s); "
        f"reordered {result.reordered} lost {result.lost} duplicates {result.duplicates} "
        f"key moves {result.reassignments}; queues served by {queues}"
    )


def broker_modes(kind: str) -> tuple[str, ...]:
    """The modes measured on a broker: raw only where raw_pipeline.py has a pipeline for it."""
    return MODES if raw_pipeline.supports(kind) else LBG_MODES


async def measure_broker(opts: Options, echo: Echo, run: BrokerRun) -> dict[str, Any]:
    """Every round, every mode, the order reversed every other round, on one broker; then the
    summary."""
    broker = await run.connect("bench")
    modes = broker_modes(run.kind)
    results: list[ModeResult] = []
    try:
        for round_no in range(1, opts.rounds + 1):
            for mode in modes if round_no % 2 else modes[::-1]:
                if mode == "raw":
                    result = await run_raw(opts, run, round_no, echo)
                else:
                    result = await run_mode(opts, run, broker, mode, round_no, echo)
                echo(f"[{run.kind}] {round_line(result)}")
                results.append(result)
    finally:
        await broker.close()
    return summarize(results, modes)


def median_or_none(values: list[float | None]) -> float | None:
    """The median, or None if any value is unknown."""
    if any(v is None for v in values):
        return None
    return statistics.median(v for v in values if v is not None)


def ratio(numerator: dict[str, Any] | None, denominator: dict[str, Any] | None) -> float | None:
    """One mode's end-to-end rate over another's (None if either was not measured)."""
    if numerator is None or denominator is None or not denominator["rate"]:
        return None
    return round(numerator["rate"] / denominator["rate"], 3)


def summarize(results: list[ModeResult], modes: tuple[str, ...]) -> dict[str, Any]:
    """Medians of the rates and CPU per mode, totals of the counts, peaks of memory; the
    ratios, targets."""
    figures: dict[str, Any] = {}
    for mode in modes:
        runs = [r for r in results if r.mode == mode]
        losses = [r.lost for r in runs]
        figures[mode] = {
            "rate": statistics.median(r.rate for r in runs),
            "publisher_rate": statistics.median(r.publisher_rate for r in runs),
            "processed_rate": statistics.median(r.processed_rate for r in runs),
            "validator_lag_s": statistics.median(r.validator_lag_s for r in runs),
            "reordered": sum(r.reordered for r in runs),
            "lost": None if None in losses else sum(x for x in losses if x is not None),
            "duplicates": sum(r.duplicates for r in runs),
            "reassignments": sum(r.reassignments for r in runs),
            "client_peak_rss_mb": max(max(r.client_peak_rss_mb.values()) for r in runs),
            "client_cpu_s": round(statistics.median(sum(r.client_cpu_s.values()) for r in runs), 2),
            "publisher_cpu_s": statistics.median(r.publisher_cpu_s for r in runs),
            "broker_cpu_s": median_or_none([r.broker_cpu_s for r in runs]),
            "bench_cpu_s": statistics.median(r.bench_cpu_s for r in runs),
            "cpu_us_per_event": {
                part: median_or_none([r.cpu_us_per_event[part] for r in runs])
                for part in runs[0].cpu_us_per_event
            },
            "other_cpu_s": statistics.median(r.other_cpu_s for r in runs),
            "machine_busy_pct": statistics.median(r.machine_busy_pct for r in runs),
        }
    sticky, competing, raw = (figures.get(mode) for mode in MODES)
    sticky_competing = ratio(sticky, competing)
    sticky_raw = ratio(sticky, raw)
    return {
        "ratio": sticky_competing,
        "ratio_sticky_raw": sticky_raw,
        "ratio_competing_raw": ratio(competing, raw),
        "targets": {
            "sticky_competing_at_least_0_95": None
            if sticky_competing is None
            else sticky_competing >= TARGET_RATIO,
            "sticky_raw_at_least_0_7": None
            if sticky_raw is None
            else sticky_raw >= TARGET_RAW_RATIO,
            "sticky_in_order_and_complete": sticky is not None
            and sticky["reordered"] == 0
            and sticky["lost"] == 0,
        },
        **figures,
        "runs": [asdict(r) for r in results],
    }


def summary_text(opts: Options, summaries: dict[str, dict[str, Any]]) -> str:
    """The final human-readable block: one row per figure, per broker a column per mode."""
    rows: list[tuple[str, tuple[str, ...], str]] = [
        ("end to end, events/s (median)", ("rate",), "{:,.0f}"),
        ("publisher alone, events/s", ("publisher_rate",), "{:,.0f}"),
        ("clients done, events/s", ("processed_rate",), "{:,.0f}"),
        ("reader lag after clients, s", ("validator_lag_s",), "{:.2f}"),
        ("reordered (all events, all rounds)", ("reordered",), "{}"),
        ("lost (all events, all rounds)", ("lost",), "{}"),
        ("duplicates (all events, all rounds)", ("duplicates",), "{}"),
        ("key moves while measuring", ("reassignments",), "{}"),
        ("client peak RSS, MB (max)", ("client_peak_rss_mb",), "{:.1f}"),
        ("CPU us/event: clients (sum)", ("cpu_us_per_event", "clients"), "{:,.0f}"),
        ("CPU us/event: publisher", ("cpu_us_per_event", "publisher"), "{:,.0f}"),
        ("CPU us/event: broker", ("cpu_us_per_event", "broker"), "{:,.0f}"),
        ("CPU us/event: bench (validator/reader)", ("cpu_us_per_event", "bench"), "{:,.0f}"),
        ("CPU s: clients (sum)", ("client_cpu_s",), "{:.2f}"),
        ("CPU s: publisher", ("publisher_cpu_s",), "{:.2f}"),
        ("CPU s: broker", ("broker_cpu_s",), "{:.2f}"),
        ("CPU s: bench process (validator/reader)", ("bench_cpu_s",), "{:.2f}"),
        ("CPU s: everything else on the machine", ("other_cpu_s",), "{:.2f}"),
        ("machine CPU busy while measuring, %", ("machine_busy_pct",), "{:.0f}"),
    ]
    brokers = list(summaries)

    def mode_cells(path: tuple[str, ...], style: str) -> list[str]:
        cells = []
        for summary in summaries.values():
            for mode in MODES:
                value = summary.get(mode)
                for key in path:
                    value = None if value is None else value[key]
                cells.append("-" if value is None else style.format(value))
        return cells

    def broker_cells(figure: Callable[[dict[str, Any]], Any]) -> list[str]:
        return ["-" if "error" in s else str(figure(s)) for s in summaries.values()]

    def shown(value: Any) -> str:
        return "-" if value is None else str(value)

    lines = [
        f"{opts.events} events, {opts.clients} clients, QC {opts.queues}, HC {opts.hash_count}, "
        f"{opts.keys} keys, {opts.rounds} round(s), {os.cpu_count()} CPUs",
        *table(40, brokers, MODES, [(label, mode_cells(p, st)) for label, p, st in rows], 11),
        "",
        *table(
            40,
            brokers,
            ["all"],
            [
                ("ratio sticky / competing", broker_cells(lambda s: shown(s["ratio"]))),
                ("ratio sticky / raw", broker_cells(lambda s: shown(s["ratio_sticky_raw"]))),
                ("ratio competing / raw", broker_cells(lambda s: shown(s["ratio_competing_raw"]))),
                (
                    f"target sticky / competing >= {TARGET_RATIO:g}",
                    broker_cells(lambda s: verdict(s["targets"]["sticky_competing_at_least_0_95"])),
                ),
                (
                    f"target sticky / raw >= {TARGET_RAW_RATIO:g}",
                    broker_cells(lambda s: verdict(s["targets"]["sticky_raw_at_least_0_7"])),
                ),
                (
                    "target sticky: 0 reordered, 0 lost",
                    broker_cells(lambda s: verdict(s["targets"]["sticky_in_order_and_complete"])),
                ),
                ("wall s (broker up to done)", broker_cells(lambda s: s["wall_s"])),
                ("machine CPU busy over the run, %", broker_cells(lambda s: s["machine_busy_pct"])),
            ],
            22,
        ),
    ]
    lines.extend(f"{kind}: FAILED: {s['error']}" for kind, s in summaries.items() if "error" in s)
    return "\n".join(lines)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--events",
    type=click.IntRange(min=1),
    default=20000,
    show_default=True,
    help="Measured events.",
)
@click.option(
    "--clients", type=click.IntRange(min=1), default=2, show_default=True, help="lbg-clients."
)
@click.option(
    "--queues", type=click.IntRange(min=1), default=4, show_default=True, help="Queue count QC."
)
@click.option(
    "--hash-count", type=click.IntRange(min=1), default=64, show_default=True, help="Buckets HC."
)
@click.option(
    "--keys", type=click.IntRange(min=1), default=200, show_default=True, help="Publisher keys."
)
@click.option(
    "--rounds",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Runs per mode, alternating which mode goes first; rates are medians.",
)
@broker_options
@click.option(
    "--json", "as_json", is_flag=True, help="End with one JSON line of every figure, by broker."
)
def main(
    events: int,
    clients: int,
    queues: int,
    hash_count: int,
    keys: int,
    rounds: int,
    brokers: tuple[str, ...],
    broker_url: str | None,
    admin_url: str | None,
    as_json: bool,
) -> None:
    """Events/s of publisher -> lbg-clients -> validator: sticky vs competing vs raw client."""

    def echo(text: str) -> None:
        click.echo(text, err=True)

    try:
        GroupConfig(hash_prefix="bench", hash_count=hash_count, queue_count=queues)
    except GroupConfigError as exc:
        raise click.UsageError(str(exc)) from None
    kinds = chosen_brokers(brokers, broker_url, admin_url)
    opts = Options(
        events=events,
        clients=clients,
        queues=queues,
        hash_count=hash_count,
        keys=keys,
        rounds=rounds,
    )
    workdir = Path(tempfile.mkdtemp(prefix="lbg-bench-"))
    logging.basicConfig(
        filename=workdir / "bench.log",
        level=logging.INFO,
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
    )
    # Competing consumers reorder and move keys on nearly every event; logging each one would
    # slow the validator in that mode only. The counts are kept either way.
    logging.getLogger("lbg.validator").setLevel(logging.ERROR)
    summaries = None
    try:
        echo(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        summaries = uvloop.run(
            run_per_broker(
                kinds,
                broker_url,
                admin_url,
                workdir,
                functools.partial(measure_broker, opts, echo),
                echo,
            )
        )
    except (KeyboardInterrupt, asyncio.CancelledError):
        echo("interrupted: stopping everything this run started")
        sys.exit(130)
    finally:
        tidy_workdir(workdir, passed(summaries), echo)
    click.echo(summary_text(opts, summaries))
    if as_json:
        click.echo(json.dumps(summaries, separators=(",", ":")))
    if not passed(summaries):
        sys.exit(1)


if __name__ == "__main__":
    main()
