"""How fast queues move under load: dynamic joins, crashes and planned handovers, against static.

A dynamic group (members join by themselves, heartbeats and a lease) takes a steady publisher
while members join, are killed with SIGKILL and leave with SIGTERM; every figure comes from
the times of the validation records (`OutputMessage.at`: the broker's store time on NATS, the
client's send time on RabbitMQ), so it is when the work was done, not when this process
noticed. In the same run, a static group (the original design: client index and count,
secondary queues released every --cycle-seconds) measures how long a joining client waits for
its primary queues. The whole scenario runs on each broker in turn, in one invocation.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
import logging
import math
import os
import random
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import click
import uvloop

from lbg.aio import cancel_and_wait
from lbg.broker.base import Broker, BrokerError, OutputMessage
from lbg.devstack.alarms import EVICTED, LOG_TIME_FORMAT, SELF_FENCED, lease_alarms
from lbg.devstack.deployment import Daemon
from lbg.model.destinations import OutputKind
from lbg.model.group import GroupConfig, GroupConfigError
from lbg.model.messages import MalformedMessage, decode_processed
from lbg.model.sequence import Report
from lbg.validator import Validator
from measure import (
    BenchError,
    BrokerRun,
    Echo,
    broker_options,
    chosen_brokers,
    follow_records,
    machine_busy_seconds,
    passed,
    run_per_broker,
    table,
    tidy_workdir,
    verdict,
)

POLL_SECONDS = 0.02
START_TIMEOUT = 30.0
JOIN_TIMEOUT = 15.0
MOVE_TIMEOUT = 15.0
LEAVE_EXIT_TIMEOUT = 15.0
PUBLISHER_EXIT_TIMEOUT = 30.0
DRAIN_TIMEOUT = 300.0
# Draining ends early once no record came for this long: what is missing then is lost.
DRAIN_IDLE = 10.0
# A static join is started at least this long before the next release of the cycle.
STATIC_MIN_LEAD = 1.0
TARGET_JOIN_P99 = 1.0
TARGET_CRASH_P99 = 1.0
TARGET_PLANNED_P99 = 0.1
TARGET_RATIO = 30.0
# Machine CPU busy during the rounds from which the run's latencies are the machine's.
SATURATED_PCT = 95.0


@dataclass(frozen=True)
class Options:
    """Everything one run shares, on every broker."""

    rate: float
    keys: int
    hash_count: int
    queues: int
    members: int
    rounds: int
    leave_every: int
    settle: float
    static_samples: int
    cycle_seconds: float
    seed: int
    member_args: tuple[str, ...] = ()  # e.g. ("--config", "fast-failover.toml")


# Silences between a queue's consecutive records shorter than this are not kept (at the
# bench's rates, most gaps are a few milliseconds).
SILENCE_FLOOR = 0.05
# A silence of a queue the victim did not serve counts for a kill if it began this soon after.
BYSTANDER_WINDOW = 2.0


@dataclass(frozen=True)
class Change:
    """A queue's records came from a new client: the old owner's last and the new one's first,
    with the first one's wait from ready (see `ready_wait`; None without a publish time)."""

    queue: int
    old: str | None
    old_at: float | None
    new: str
    new_at: float
    new_wait: float | None = None


@dataclass(frozen=True)
class Action:
    """Something the bench did to the group, with the wall-clock time just before it."""

    kind: str  # "join", "kill" or "leave"
    member: str
    at: float
    queues: tuple[int, ...] = ()  # kill / leave: the queues the member served just before


def ready_wait(
    published_at: float | None, previous_done_at: float | None, done_at: float
) -> float | None:
    """How long an event waited once it could have been processed: from when it was both
    published and the previous event of its queue was done, to when it was done (None
    without a publish time). A queue's silence also holds the wait for the next event to be
    published; this does not."""
    if published_at is None:
        return None
    ready = published_at if previous_done_at is None else max(published_at, previous_done_at)
    return done_at - ready


def added_wait(first_wait: float | None, baseline: float | None) -> float | None:
    """What a change of owner added to its first event's wait from ready: that wait beyond
    an ordinary record's (`baseline`), never below 0; None if either is unknown."""
    if first_wait is None or baseline is None:
        return None
    return max(0.0, first_wait - baseline)


class Tracker:
    """The validator, fed from the group's outputs, plus the time of every validation record.

    Per queue it keeps the changes of the client the records come from; per client the time
    of its first record (overall and per queue); and the wait from ready of every record that
    is not a new owner's first (the baseline a handover's wait is held against). Times are
    `OutputMessage.at`, epoch seconds: the broker's store time (NATS) or the client's send
    time (RabbitMQ); publish times are the publisher's, from the record (`Lbg-Time`).
    """

    def __init__(self, queue_count: int) -> None:
        self.validator = Validator()
        self.queue_count = queue_count
        self.last: dict[int, tuple[float, str]] = {}
        self.changes: dict[int, list[Change]] = {q: [] for q in range(queue_count)}
        self.first_seen: dict[str, float] = {}
        self.first_on_queue: dict[tuple[str, int], float] = {}
        # Per queue, (start, end) of each silence between records of SILENCE_FLOOR or more.
        self.silences: dict[int, list[tuple[float, float]]] = {q: [] for q in range(queue_count)}
        self.ordinary_waits: list[float] = []
        self.latest = 0.0

    def handle(self, message: OutputMessage) -> None:
        """Validate one output message and, for a validation record, note its time and client."""
        self.validator.handle(message)
        if message.kind is not OutputKind.VALIDATION:
            return
        try:
            record = decode_processed(message.body)
        except MalformedMessage:
            return  # the validator counted it
        at = message.at
        if at is None:
            raise BenchError("the broker gives validation records no time")
        self.latest = max(self.latest, at)
        queue, client = record.queue, record.client
        previous = self.last.get(queue)
        wait = ready_wait(record.published_at, previous[0] if previous else None, at)
        if previous is not None and at - previous[0] >= SILENCE_FLOOR:
            self.silences.setdefault(queue, []).append((previous[0], at))
        if previous is None or previous[1] != client:
            old_at, old = previous if previous else (None, None)
            self.changes.setdefault(queue, []).append(Change(queue, old, old_at, client, at, wait))
        elif wait is not None:
            self.ordinary_waits.append(wait)
        self.last[queue] = (at, client)
        self.first_seen.setdefault(client, at)
        self.first_on_queue.setdefault((client, queue), at)

    def serving(self, client: str) -> tuple[int, ...]:
        """The queues whose latest record came from `client`."""
        return tuple(sorted(q for q, (_, c) in self.last.items() if c == client))

    def owner_at(self, queue: int, at: float) -> str | None:
        """Who the queue's records came from at broker time `at`."""
        owner = None
        for change in self.changes.get(queue, []):
            if change.new_at > at:
                break
            owner = change.new
        return owner

    def change_after(self, queue: int, at: float) -> Change | None:
        """The first change of the queue's client after broker time `at`."""
        return next((c for c in self.changes.get(queue, []) if c.new_at > at), None)

    def baseline_wait(self) -> float | None:
        """An ordinary record's wait from ready (p50): what any event waits, handover or not."""
        return percentile(self.ordinary_waits, 50)

    def report(self) -> Report:
        return self.validator.report()


def percentile(values: Iterable[float], pct: float) -> float | None:
    """Nearest-rank percentile (with fewer than 100 samples p99 is the maximum)."""
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[max(0, math.ceil(pct / 100 * len(ordered)) - 1)]


def ms(value: float | None) -> float | None:
    """Seconds rounded to the millisecond (None stays None)."""
    return None if value is None else round(value, 3)


def stats(values: list[float]) -> dict[str, Any]:
    """p50, p99, max and n of a list of seconds, rounded to the millisecond."""
    return {
        "p50": ms(percentile(values, 50)),
        "p99": ms(percentile(values, 99)),
        "max": ms(max(values, default=None)),
        "n": len(values),
    }


def log_times(path: Path, text: str, after: float = 0.0) -> list[float]:
    """Epoch times of a daemon's log lines that contain `text` (millisecond resolution)."""
    times = []
    if not path.exists():
        return times
    for line in path.read_text(errors="replace").splitlines():
        if text not in line:
            continue
        with contextlib.suppress(ValueError):
            at = datetime.strptime(line[:23], LOG_TIME_FORMAT).timestamp()
            if at >= after:
                times.append(at)
    return times


def false_alarms(run: DynamicRun, logs: dict[str, Path]) -> dict[str, int]:
    """Live members a peer declared gone, and live members that fenced themselves: what a
    lease too short for the machine's load costs (a bench run cuts nobody off, so every
    such line is a false alarm; a member killed or stopped is gone only once it was)."""
    ended = {a.member: a.at for a in run.actions if a.kind in ("kill", "leave")}
    alarms = [
        alarm
        for name, path in logs.items()
        if name.startswith("member-")
        for alarm in lease_alarms(path)
    ]
    return {
        "evictions": sum(
            a.kind == EVICTED and a.at < ended.get(a.member, float("inf")) for a in alarms
        ),
        "fences": sum(a.kind == SELF_FENCED for a in alarms),
    }


def first_log_time(paths: Iterable[Path], text: str, after: float = 0.0) -> float | None:
    """The earliest time `text` was logged after `after` in any of the logs."""
    return min((t for p in paths for t in log_times(p, text, after)), default=None)


def check_running(daemons: Iterable[Daemon]) -> None:
    for daemon in daemons:
        if not daemon.running:
            raise BenchError(
                f"{daemon.name} exited ({daemon.process.returncode}):\n{daemon.log_tail()}"
            )


async def wait_until(
    condition: Callable[[], bool],
    timeout: float,
    alive: Iterable[Daemon] = (),
    reader: asyncio.Task[None] | None = None,
) -> bool:
    """Poll `condition`; False after `timeout`; fail at once if a daemon in `alive` exited
    or the `reader` of the records stopped."""
    watched = list(alive)
    deadline = time.monotonic() + timeout
    while not condition():
        check_running(watched)
        if reader is not None and reader.done():
            raise BenchError(f"reading the group's records stopped: {reader.exception()!r}")
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(POLL_SECONDS)
    return True


async def wait_log(daemon: Daemon, text: str, timeout: float) -> None:
    def logged() -> bool:
        return daemon.log_path.exists() and text in daemon.log_path.read_text(errors="replace")

    if not await wait_until(logged, timeout, [daemon]):
        raise BenchError(f"{daemon.name}: no '{text}' after {timeout:g} s:\n{daemon.log_tail()}")


async def stop_publisher(publisher: Daemon) -> None:
    publisher.send(signal.SIGTERM)
    if await asyncio.to_thread(publisher.wait, PUBLISHER_EXIT_TIMEOUT) != 0:
        raise BenchError(f"{publisher.name} failed:\n{publisher.log_tail()}")


async def drain(group: Group, label: str, echo: Echo) -> None:
    """Wait until every published event is accounted for (so `lost` is known and final).

    A backlog (a broker slower than the publisher) drains as long as records keep coming.
    """
    validator = group.tracker.validator

    def settled() -> bool:
        return validator.complete or time.monotonic() - validator.last_message > DRAIN_IDLE

    await wait_until(settled, DRAIN_TIMEOUT, reader=group.reader)
    if not validator.complete:
        echo(f"{label} drain incomplete: {validator.progress_line()}")


class Group:
    """One group on the broker with its local daemons and its tracker; torn down on exit."""

    def __init__(self, opts: Options, run: BrokerRun, broker: Broker, kind: str) -> None:
        self.name = f"rebal-{kind}-{uuid.uuid4().hex[:6]}"
        self.broker_kind = run.kind
        self.config = GroupConfig(
            hash_prefix=self.name, hash_count=opts.hash_count, queue_count=opts.queues
        )
        self.local = run.deployment(self.name)
        self.tracker = Tracker(opts.queues)
        self.reader: asyncio.Task[None] | None = None
        self._broker = broker
        self._created = False

    async def __aenter__(self) -> Group:
        await self._broker.create_group(self.name, self.config)
        self._created = True
        self.reader = follow_records(self._broker, self.name, self.tracker.handle)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        try:
            await asyncio.to_thread(self.local.stop_all)
        finally:
            if self.reader is not None:
                await cancel_and_wait(self.reader)
            if self._created:
                with contextlib.suppress(BrokerError):
                    await self._broker.delete_group(self.name)

    def all_served_by(self, clients: Iterable[str]) -> bool:
        """Every queue has records, and the latest of each came from one of `clients`."""
        names = set(clients)
        last = self.tracker.last
        return len(last) == self.config.queue_count and all(c in names for _, c in last.values())


@dataclass
class DynamicRun:
    """What happened in the dynamic scenario: the actions and the group's records."""

    group: Group
    actions: list[Action] = field(default_factory=list)
    steady_from: float = 0.0
    busy_pct: float | None = None
    started_at: dict[str, float] = field(default_factory=dict)


async def run_dynamic(opts: Options, group: Group, rng: random.Random, echo: Echo) -> DynamicRun:
    """Steady load; per round a join, sometimes a second join and a SIGTERM leave, a kill -9."""
    local, tracker = group.local, group.tracker
    run = DynamicRun(group)
    members: list[str] = []  # running members, oldest first
    numbers = itertools.count(1)
    t0 = time.monotonic()

    def say(text: str) -> None:
        echo(f"[{group.broker_kind} dynamic {time.monotonic() - t0:6.1f}s] {text}")

    def daemons() -> list[Daemon]:
        return [local.daemons[m] for m in members]

    async def join() -> None:
        name = f"member-{next(numbers)}"
        at = time.time()
        daemon = local.start(name, "lbg-client", "--id", name, *opts.member_args)
        run.actions.append(Action("join", name, at))
        run.started_at[name] = at
        members.append(name)
        if not await wait_until(
            lambda: name in tracker.first_seen, JOIN_TIMEOUT, [daemon], group.reader
        ):
            raise BenchError(f"{name}: no record {JOIN_TIMEOUT:g} s after its start")
        say(
            f"join {name}: first record after {tracker.first_seen[name] - at:.3f} s; "
            f"members {members}"
        )
        await asyncio.sleep(opts.settle)
        check_running(daemons())

    async def remove(kind: str) -> None:
        victim = rng.choice(members[:-1])
        queues = tracker.serving(victim)
        daemon = local.daemons[victim]
        at = time.time()
        daemon.send(signal.SIGKILL if kind == "kill" else signal.SIGTERM)
        run.actions.append(Action(kind, victim, at, queues))
        members.remove(victim)

        def moved() -> bool:
            return all(tracker.last[q][1] != victim for q in queues)

        if not await wait_until(moved, MOVE_TIMEOUT, daemons(), group.reader):
            raise BenchError(f"{kind} {victim}: queues {queues} not moved in {MOVE_TIMEOUT:g} s")
        back = [c.new_at - at for q in queues if (c := tracker.change_after(q, at))]
        say(
            f"{kind} {victim} (queues {list(queues)}): all moved after {max(back, default=0):.3f} s"
        )
        if kind == "leave":
            code = await asyncio.to_thread(daemon.wait, LEAVE_EXIT_TIMEOUT)
            if code != 0:
                raise BenchError(f"{victim} exited {code} on SIGTERM:\n{daemon.log_tail()}")
        await asyncio.sleep(opts.settle)
        check_running(daemons())

    for _ in range(opts.members):
        name = f"member-{next(numbers)}"
        run.started_at[name] = time.time()
        await wait_log(
            local.start(name, "lbg-client", "--id", name, *opts.member_args),
            " joined",
            START_TIMEOUT,
        )
        members.append(name)
    say(f"group '{group.name}' {group.config.to_json()}; members {members}")
    publisher = local.start_publisher(
        "publisher", *("--keys", str(opts.keys), "--rate", str(opts.rate), "--json")
    )
    say(f"publishing {opts.rate:g} events/s over {opts.keys} keys")
    if not await wait_until(
        lambda: group.all_served_by(members), START_TIMEOUT, [*daemons(), publisher], group.reader
    ):
        raise BenchError(f"queues not all served after {START_TIMEOUT:g} s: {tracker.last}")
    await asyncio.sleep(opts.settle)
    run.steady_from = time.time()
    busy_before, steady_started = machine_busy_seconds(), time.monotonic()
    for round_no in range(1, opts.rounds + 1):
        await join()
        if opts.leave_every and round_no % opts.leave_every == 0:
            await join()
            await remove("leave")
        await remove("kill")
        check_running([publisher])
    cpu_capacity = (time.monotonic() - steady_started) * (os.cpu_count() or 1)
    run.busy_pct = round(100 * (machine_busy_seconds() - busy_before) / cpu_capacity, 1)
    say(f"stop publishing; {tracker.validator.progress_line()}")
    await stop_publisher(publisher)
    await drain(group, f"[{group.broker_kind} dynamic]", echo)
    return run


async def run_static(opts: Options, group: Group, rng: random.Random, echo: Echo) -> list[dict]:
    """A static client joins while its primary queues are served by another static client.

    static-0 (index 0 of 2) serves every queue; a new client with index 1 then waits for
    static-0's next release of its secondary queues. Each join is started at a random point
    of static-0's release cycle, uniformly over what is left of the current cycle (at least
    STATIC_MIN_LEAD s before the release, else over the whole next cycle); the joiner is then
    stopped and its queues go back to static-0 before the next sample.
    """
    local, tracker = group.local, group.tracker
    t0 = time.monotonic()
    samples: list[dict] = []

    def say(text: str) -> None:
        echo(f"[{group.broker_kind} static {time.monotonic() - t0:6.1f}s] {text}")

    def start(name: str, index: int) -> Daemon:
        return local.start_client(name, index, 2, opts.cycle_seconds)

    keeper = start("static-0", 0)
    await wait_log(keeper, " bound ", START_TIMEOUT)
    # static-0 releases its secondary queues every cycle, counted from this log line.
    anchor = first_log_time([keeper.log_path], " bound ") or time.time()
    publisher = local.start_publisher(
        "publisher", *("--keys", str(opts.keys), "--rate", str(opts.rate), "--json")
    )
    say(f"group '{group.name}' {group.config.to_json()}; static-0 serves every queue")
    primaries = [q for q in range(opts.queues) if q % 2 == 1]
    for number in range(1, opts.static_samples + 1):
        if not await wait_until(
            lambda: group.all_served_by(["static-0"]),
            START_TIMEOUT,
            [keeper, publisher],
            group.reader,
        ):
            raise BenchError(f"static-0 does not serve every queue: {tracker.last}")
        phase = (time.time() - anchor) % opts.cycle_seconds
        if phase < opts.cycle_seconds - STATIC_MIN_LEAD:
            delay = rng.uniform(0, opts.cycle_seconds - STATIC_MIN_LEAD - phase)
        else:
            delay = opts.cycle_seconds - phase + rng.uniform(0, opts.cycle_seconds)
        await asyncio.sleep(delay)
        name = f"static-j{number}"
        at = time.time()
        joiner = start(name, 1)
        next_release = anchor + math.ceil((at - anchor) / opts.cycle_seconds) * opts.cycle_seconds

        def got_primary(name: str = name) -> bool:
            return any((name, q) in tracker.first_on_queue for q in primaries)

        timeout = opts.cycle_seconds + JOIN_TIMEOUT
        if not await wait_until(got_primary, timeout, [joiner, keeper, publisher], group.reader):
            raise BenchError(f"{name}: no primary queue after {timeout:g} s")
        first = min(
            t for (c, q), t in tracker.first_on_queue.items() if c == name and q in primaries
        )
        sample = {
            "client": name,
            "latency_s": round(first - at, 3),
            "release_due_s": round(next_release - at, 3),
        }
        samples.append(sample)
        say(
            f"static join {name}: first record on a primary queue after {first - at:.3f} s "
            f"(static-0's release was due {next_release - at:.1f} s after the start)"
        )
        joiner.send(signal.SIGTERM)
        if await asyncio.to_thread(joiner.wait, LEAVE_EXIT_TIMEOUT) != 0:
            raise BenchError(f"{name} failed on SIGTERM:\n{joiner.log_tail()}")
    await stop_publisher(publisher)
    await drain(group, f"[{group.broker_kind} static]", echo)
    return samples


def bystander_silence(tracker: Tracker, kill: Action) -> float:
    """The longest silence, begun within BYSTANDER_WINDOW of `kill`, of a queue the victim
    did not serve: a crash should stall only the victim's queues (one handed to the victim
    while it was still in the survivors' view waited until it was found gone)."""
    return max(
        (
            end - start
            for queue, silences in tracker.silences.items()
            if tracker.owner_at(queue, kill.at) not in (kill.member, None)
            for start, end in silences
            if kill.at <= start <= kill.at + BYSTANDER_WINDOW
        ),
        default=0.0,
    )


def planned_moves(
    changes: dict[int, list[Change]], actions: list[Action], steady_from: float
) -> list[tuple[Change, str]]:
    """The changes of a queue's owner while the old owner was alive, from the steady state on,
    each with the kind of the bench's last action before it ("join", "leave", "kill" for a
    rebalance after a crash, or "start"): a crash takeover is no planned move."""
    killed = {a.member: a.at for a in actions if a.kind == "kill"}
    moves = []
    for queue_changes in changes.values():
        for change in queue_changes:
            if change.old is None or change.old_at is None or change.new_at < steady_from:
                continue
            if change.old in killed and change.new_at > killed[change.old]:
                continue
            cause = max(
                (a for a in actions if a.at <= change.new_at), key=lambda a: a.at, default=None
            )
            moves.append((change, cause.kind if cause else "start"))
    return moves


def analyse_dynamic(run: DynamicRun) -> dict[str, Any]:
    """Join, crash and planned-handover latencies from the times of the validation records,
    and the wait a handover added to its first event beyond an ordinary record's."""
    tracker = run.group.tracker
    baseline = tracker.baseline_wait()
    logs = {name: d.log_path for name, d in run.group.local.daemons.items()}
    joins, crashes, crash_all, kill_to_gone, planned = [], [], [], [], []
    bystanders: list[float] = []
    for action in run.actions:
        if action.kind == "join":
            first = tracker.first_seen.get(action.member)
            joined = first_log_time([logs[action.member]], " joined")
            joins.append(
                {
                    "member": action.member,
                    "latency_s": None if first is None else round(first - action.at, 3),
                    "start_to_joined_s": None if joined is None else round(joined - action.at, 3),
                    "joined_to_first_s": (
                        None if joined is None or first is None else round(first - joined, 3)
                    ),
                }
            )
        elif action.kind == "kill":
            others = [p for n, p in logs.items() if n.startswith("member-") and n != action.member]
            gone = first_log_time(others, f"member {action.member} is gone", action.at - 0.01)
            if gone is not None:
                kill_to_gone.append(round(gone - action.at, 3))
            worst = 0.0
            for queue in range(tracker.queue_count):
                if tracker.owner_at(queue, action.at) != action.member:
                    continue
                change = tracker.change_after(queue, action.at)
                latency = added = None
                if change is not None and change.old == action.member:
                    latency = change.new_at - action.at
                    added = added_wait(change.new_wait, baseline)
                    worst = max(worst, latency)
                crashes.append(
                    {
                        "victim": action.member,
                        "queue": queue,
                        "new_owner": change.new if change else None,
                        "latency_s": ms(latency),
                        "added_s": ms(added),
                        "kill_to_gone_s": None if gone is None else round(gone - action.at, 3),
                        "gone_to_first_s": (
                            None
                            if gone is None or change is None
                            else round(change.new_at - gone, 3)
                        ),
                    }
                )
            crash_all.append(round(worst, 3))
            bystanders.append(round(bystander_silence(tracker, action), 3))
    for change, cause in planned_moves(tracker.changes, run.actions, run.steady_from):
        planned.append(
            {
                "queue": change.queue,
                "old": change.old,
                "new": change.new,
                "cause": cause,
                "pause_s": ms(change.new_at - change.old_at),
                "wait_s": ms(change.new_wait),
                "added_s": ms(added_wait(change.new_wait, baseline)),
                "old_last_at": ms(change.old_at),
                "new_first_at": ms(change.new_at),
            }
        )

    def values(rows: list[dict], key: str, **match: str) -> list[float]:
        return [
            r[key]
            for r in rows
            if r[key] is not None and all(r.get(k) == v for k, v in match.items())
        ]

    return {
        "join": stats(values(joins, "latency_s")),
        "crash": stats(values(crashes, "latency_s")),
        "crash_all_queues": stats(crash_all),
        "planned": stats(values(planned, "pause_s")),
        "planned_join": stats(values(planned, "pause_s", cause="join")),
        "planned_leave": stats(values(planned, "pause_s", cause="leave")),
        "planned_added": stats(values(planned, "added_s")),
        "planned_added_join": stats(values(planned, "added_s", cause="join")),
        "planned_added_leave": stats(values(planned, "added_s", cause="leave")),
        "planned_first_wait": stats(values(planned, "wait_s")),
        "crash_added": stats(values(crashes, "added_s")),
        "ordinary_wait": stats(tracker.ordinary_waits),
        "join_start_to_joined": stats(values(joins, "start_to_joined_s")),
        "join_joined_to_first": stats(values(joins, "joined_to_first_s")),
        "crash_kill_to_gone": stats(kill_to_gone),
        "crash_bystanders": stats(bystanders),
        "crash_gone_to_first": stats(values(crashes, "gone_to_first_s")),
        "machine_busy_pct": run.busy_pct,
        "false_alarms": false_alarms(run, logs),
        "counts": {
            kind: sum(a.kind == kind for a in run.actions) for kind in ("join", "kill", "leave")
        },
        "missing": {
            "join": sum(r["latency_s"] is None for r in joins),
            "crash": sum(r["latency_s"] is None for r in crashes),
        },
        "joins": joins,
        "crashes": crashes,
        "planned_moves": planned,
    }


def totals(report: Report) -> dict[str, Any]:
    return {
        "published": report.published,
        "unique": report.unique,
        "lost": report.lost,
        "reordered": report.reordered,
        "duplicates": report.duplicates,
        "dead_lettered": report.dead_lettered,
    }


async def run_all(opts: Options, echo: Echo, run: BrokerRun) -> dict[str, Any]:
    """Both scenarios on one broker, dynamic first; the same seed on every broker."""
    rng = random.Random(opts.seed)
    broker = await run.connect("bench-rebalance")
    try:
        async with Group(opts, run, broker, "dynamic") as group:
            dynamic_run = await run_dynamic(opts, group, rng, echo)
            dynamic = analyse_dynamic(dynamic_run)
            dynamic["totals"] = totals(group.tracker.report())
        static_samples: list[dict] = []
        static_totals = None
        if opts.static_samples:
            async with Group(opts, run, broker, "static") as group:
                static_samples = await run_static(opts, group, rng, echo)
                static_totals = totals(group.tracker.report())
    finally:
        await broker.close()
    static_join = stats([s["latency_s"] for s in static_samples])
    dynamic_p50 = dynamic["join"]["p50"]
    ratio = (
        round(static_join["p50"] / dynamic_p50, 1)
        if static_join["p50"] is not None and dynamic_p50
        else None
    )
    result = {
        "dynamic": dynamic,
        "static": {"join": static_join, "samples": static_samples, "totals": static_totals},
        "ratio_static_dynamic_join_p50": ratio,
        # For scale only: a static join that just missed a release waits a whole cycle.
        "ratio_cycle_dynamic_join_p50": (
            round(opts.cycle_seconds / dynamic_p50, 1) if dynamic_p50 else None
        ),
        "options": asdict(opts),
    }
    result["targets"] = verdicts(result)
    return result


def verdicts(result: dict[str, Any]) -> dict[str, bool | None]:
    """Each target of the issue: True met, False missed, None not measured."""
    dynamic = result["dynamic"]

    def below(value: float | None, limit: float) -> bool | None:
        return None if value is None else value < limit

    def clean(t: dict[str, Any] | None) -> bool | None:
        return None if t is None else t["lost"] == 0 and t["reordered"] == 0

    ratio = result["ratio_static_dynamic_join_p50"]
    return {
        "join_p99_below_1s": below(dynamic["join"]["p99"], TARGET_JOIN_P99),
        "crash_p99_below_1s": below(dynamic["crash"]["p99"], TARGET_CRASH_P99),
        "planned_wait_added_p99_below_100ms": below(
            dynamic["planned_added"]["p99"], TARGET_PLANNED_P99
        ),
        "static_over_dynamic_at_least_30x": None if ratio is None else ratio >= TARGET_RATIO,
        "dynamic_nothing_lost_or_reordered": clean(dynamic["totals"]),
        "no_live_member_evicted": dynamic["false_alarms"]["evictions"] == 0,
        "static_nothing_lost_or_reordered": clean(result["static"]["totals"]),
    }


TARGET_NAMES = {
    "join_p99_below_1s": "target join p99 < 1 s",
    "crash_p99_below_1s": "target crash p99 < 1 s",
    "planned_wait_added_p99_below_100ms": "target planned wait added p99 < 100 ms",
    "static_over_dynamic_at_least_30x": f"target static / dynamic join >= {TARGET_RATIO:g}x",
    "dynamic_nothing_lost_or_reordered": "target dynamic: 0 lost, 0 reordered",
    "no_live_member_evicted": "target no live member evicted",
    "static_nothing_lost_or_reordered": "target static: 0 lost, 0 reordered",
}


def summary_text(opts: Options, results: dict[str, dict[str, Any]]) -> str:
    """The final block: per broker p50 / p99 / max / n of each latency, then one column each
    for counts, totals, ratios, CPU and targets."""
    brokers = list(results)
    latencies = [
        ("join: start -> first record", "dynamic", "join"),
        ("  start -> 'joined' in its log", "dynamic", "join_start_to_joined"),
        ("  'joined' -> first record", "dynamic", "join_joined_to_first"),
        ("crash: kill -9 -> first record, per queue", "dynamic", "crash"),
        ("  kill -9 -> 'is gone' (first survivor)", "dynamic", "crash_kill_to_gone"),
        ("  'is gone' -> first record", "dynamic", "crash_gone_to_first"),
        ("crash: kill -9 -> all its queues back", "dynamic", "crash_all_queues"),
        ("  longest silence of a queue it did not serve", "dynamic", "crash_bystanders"),
        ("crash: wait added, per queue", "dynamic", "crash_added"),
        ("planned handover pause (natural gap incl.)", "dynamic", "planned"),
        ("  after a join", "dynamic", "planned_join"),
        ("  after a SIGTERM leave", "dynamic", "planned_leave"),
        ("planned handover: wait added, per queue", "dynamic", "planned_added"),
        ("  after a join", "dynamic", "planned_added_join"),
        ("  after a SIGTERM leave", "dynamic", "planned_added_leave"),
        ("  first event's wait from ready", "dynamic", "planned_first_wait"),
        ("ordinary record's wait from ready", "dynamic", "ordinary_wait"),
        (f"static join (cycle {opts.cycle_seconds:g} s)", "static", "join"),
    ]

    def seconds(value: float | None) -> str:
        return "-" if value is None else f"{value:.3f}"

    def latency_cells(scenario: str, key: str) -> list[str]:
        cells = []
        for result in results.values():
            if "error" in result:
                cells.extend("-" * 4)
                continue
            s = result[scenario][key]
            cells.extend([seconds(s["p50"]), seconds(s["p99"]), seconds(s["max"]), str(s["n"])])
        return cells

    def cells(figure: Callable[[dict[str, Any]], Any]) -> list[str]:
        return ["-" if "error" in r else str(figure(r)) for r in results.values()]

    def counts(r: dict[str, Any]) -> str:
        c = r["dynamic"]["counts"]
        return f"{c['join']} / {c['kill']} / {c['leave']}"

    def published(scenario: str) -> Callable[[dict[str, Any]], str]:
        def figure(r: dict[str, Any]) -> str:
            t = r[scenario]["totals"]
            return "-" if t is None else f"{t['published']} / {t['unique']}"

        return figure

    def faults(scenario: str) -> Callable[[dict[str, Any]], str]:
        def figure(r: dict[str, Any]) -> str:
            t = r[scenario]["totals"]
            if t is None:
                return "-"
            return f"{t['lost']} / {t['reordered']} / {t['duplicates']} / {t['dead_lettered']}"

        return figure

    def missing(r: dict[str, Any]) -> str:
        m = r["dynamic"]["missing"]
        return f"{m['join']} / {m['crash']}"

    def alarms(r: dict[str, Any]) -> str:
        a = r["dynamic"]["false_alarms"]
        return f"{a['evictions']} / {a['fences']}"

    figures = [
        ("joins / kills / leaves", counts),
        ("joins / crash queues not measured", missing),
        ("live members evicted / self-fenced", alarms),
        ("dynamic: published / unique", published("dynamic")),
        ("  lost / reordered / dup / dead", faults("dynamic")),
        ("static: published / unique", published("static")),
        ("  lost / reordered / dup / dead", faults("static")),
        ("ratio static / dynamic join p50", lambda r: r["ratio_static_dynamic_join_p50"]),
        ("ratio static cycle / dynamic join p50", lambda r: r["ratio_cycle_dynamic_join_p50"]),
        ("machine CPU busy during the rounds, %", lambda r: r["dynamic"]["machine_busy_pct"]),
        ("machine CPU busy over the run, %", lambda r: r["machine_busy_pct"]),
        ("CPU s: broker, over the run", lambda r: r["broker_cpu_s"]),
        ("CPU s: processes this run did not start", lambda r: r["other_cpu_s"]),
        ("wall s (broker up to done)", lambda r: r["wall_s"]),
    ]
    figures.extend(
        (name, lambda r, key=key: verdict(r["targets"][key])) for key, name in TARGET_NAMES.items()
    )
    lines = [
        f"{opts.rate:g} events/s, {opts.keys} keys, HC {opts.hash_count}, QC {opts.queues}, "
        f"{opts.rounds} rounds, a leave every {opts.leave_every}, {opts.static_samples} static "
        f"joins; seed {opts.seed}; {os.cpu_count()} CPUs",
        *table(
            42,
            brokers,
            ["p50", "p99", "max", "n"],
            [(label, latency_cells(scenario, key)) for label, scenario, key in latencies],
            7,
            "seconds",
        ),
        "",
        *table(42, brokers, ["all"], [(label, cells(f)) for label, f in figures], 28),
    ]
    lines.extend(saturation_notes(results))
    lines.extend(f"{kind}: FAILED: {r['error']}" for kind, r in results.items() if "error" in r)
    return "\n".join(lines)


def saturation_notes(results: dict[str, dict[str, Any]]) -> list[str]:
    """A line for each broker whose rounds ran on a saturated machine: its latencies are then
    the machine's (waiting for a CPU) as much as the group's."""
    return [
        f"{kind}: the machine was {busy:g} % busy during the rounds: every latency above includes"
        " waiting for a CPU (a lower --rate shows the group's own)"
        for kind, r in results.items()
        if (busy := (r.get("dynamic") or {}).get("machine_busy_pct")) is not None
        and busy >= SATURATED_PCT
    ]


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--rate",
    type=click.FloatRange(min=1),
    default=1000.0,
    show_default=True,
    help="Events/s of the steady publisher (both groups).",
)
@click.option(
    "--keys", type=click.IntRange(min=1), default=100, show_default=True, help="Publisher keys."
)
@click.option(
    "--hash-count", type=click.IntRange(min=1), default=64, show_default=True, help="Buckets HC."
)
@click.option(
    "--queues", type=click.IntRange(min=2), default=8, show_default=True, help="Queue count QC."
)
@click.option(
    "--members",
    type=click.IntRange(min=2),
    default=2,
    show_default=True,
    help="Dynamic members between rounds (a round adds up to 2 and removes them).",
)
@click.option(
    "--rounds",
    type=click.IntRange(min=1),
    default=10,
    show_default=True,
    help="Rounds of join, wait, kill -9, wait: this many kills; as many joins, plus one per leave.",
)
@click.option(
    "--leave-every",
    type=click.IntRange(min=0),
    default=3,
    show_default=True,
    help="Every Nth round also joins a second member and SIGTERMs one (0: never).",
)
@click.option(
    "--settle",
    type=click.FloatRange(min=0),
    default=2.0,
    show_default=True,
    help="Seconds to wait after each join (first record) and each removal.",
)
@click.option(
    "--static-samples",
    type=click.IntRange(min=0),
    default=12,
    show_default=True,
    help="Static-mode joins to time (0: skip the static mode).",
)
@click.option(
    "--cycle-seconds",
    type=click.FloatRange(min=1),
    default=30.0,
    show_default=True,
    help="Static mode: how often a client releases its secondary queues.",
)
@click.option(
    "--seed",
    type=int,
    help="Seeds the choice of victims and the static join times [default: a random seed, "
    "printed with the result].",
)
@broker_options
@click.option(
    "--member-config",
    type=click.Path(exists=True, dir_okay=False),
    help="A TOML file every dynamic member runs with (--config), e.g. to try other [client] "
    "heartbeat_interval, lease and lease_margin values [default: the broker's defaults].",
)
@click.option("--keep-logs", is_flag=True, help="Keep the daemons' logs even after a clean run.")
@click.option(
    "--json", "as_json", is_flag=True, help="End with one JSON line of every figure, by broker."
)
def main(
    rate: float,
    keys: int,
    hash_count: int,
    queues: int,
    members: int,
    rounds: int,
    leave_every: int,
    settle: float,
    static_samples: int,
    cycle_seconds: float,
    seed: int | None,
    brokers: tuple[str, ...],
    broker_url: str | None,
    admin_url: str | None,
    member_config: str | None,
    keep_logs: bool,
    as_json: bool,
) -> None:
    """Join, crash and planned-handover latency of dynamic membership, and static join."""

    def echo(text: str) -> None:
        click.echo(text, err=True)

    try:
        GroupConfig(hash_prefix="bench", hash_count=hash_count, queue_count=queues)
    except GroupConfigError as exc:
        raise click.UsageError(str(exc)) from None
    if members + 2 > queues:
        raise click.UsageError(f"--members {members} needs --queues >= {members + 2}")
    kinds = chosen_brokers(brokers, broker_url, admin_url)
    if seed is None:
        seed = random.SystemRandom().randrange(1, 2**31)
    opts = Options(
        rate=rate,
        keys=keys,
        hash_count=hash_count,
        queues=queues,
        members=members,
        rounds=rounds,
        leave_every=leave_every,
        settle=settle,
        static_samples=static_samples,
        cycle_seconds=cycle_seconds,
        seed=seed,
        member_args=("--config", str(Path(member_config).resolve())) if member_config else (),
    )
    workdir = Path(tempfile.mkdtemp(prefix="lbg-rebalance-"))
    logging.basicConfig(
        filename=workdir / "bench.log",
        level=logging.INFO,
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
    )
    logging.getLogger("lbg.validator").setLevel(logging.WARNING)
    results = None
    echo(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    echo(f"brokers {', '.join(kinds)}; seed {seed}; logs in {workdir}")
    try:
        results = uvloop.run(
            run_per_broker(
                kinds, broker_url, admin_url, workdir, functools.partial(run_all, opts, echo), echo
            )
        )
    except (KeyboardInterrupt, asyncio.CancelledError):
        echo("interrupted: stopping everything this run started")
        sys.exit(130)
    finally:
        tidy_workdir(workdir, passed(results), echo, keep_logs)
    click.echo(summary_text(opts, results))
    if as_json:
        click.echo(json.dumps(results, separators=(",", ":")))
    if not passed(results):
        sys.exit(1)


if __name__ == "__main__":
    main()
