"""What an idle group costs, by queue count: no events flow, the members only keep their places.

For each size (queues x dynamic clients) on each broker, in one run: a fresh group, the clients
started and settled (every queue served), then over a quiet window the clients' CPU, the
broker's CPU and the control channel's bytes/s (heartbeats and gossip); then, `--samples`
times, one more client joins (process start to its 'joined' line) and the oldest is killed -9
(until a peer logs it gone, which is when its queues are evicted and move: with no events
flowing nothing is pinned, so "served" cannot be observed). The cost should follow the
events, not the queue count (issue 25).

Then, unless --no-raw, the floor on the same broker: as many members written on the broker's
own client (raw_beats.py), exchanging heartbeats of the same size at the same interval and
nothing else, measured the same way; the ratio of the clients' CPU to the floor's is what
lbg's design adds to what any member of such a group costs on that client library.
Beside the CPU, how often a client woke up a second (voluntary context switches): on a VM an
idle process pays mostly for its wake-ups, so that figure says where an idle client's CPU goes.
A private RabbitMQ node collects its management figures every 5 s, its default, as in
production (the test stack's 0.5 s, for fresh `lbg status` figures, costs the broker more).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import signal
import statistics
import string
import sys
import tempfile
import time
import tomllib
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import orjson
import uvloop

from lbg.broker.adapters import heartbeat_timing
from lbg.broker.base import Broker, BrokerError
from lbg.devstack.deployment import Daemon, LocalDeployment
from lbg.devstack.rabbitmq import RABBITMQ_STATISTICS_MS
from lbg.model.destinations import event_destination
from lbg.model.group import GroupConfig
from measure import (
    BenchError,
    BrokerRun,
    broker_options,
    chosen_brokers,
    cpu_seconds,
    passed,
    run_per_broker,
    table,
    tidy_workdir,
    tree_cpu_seconds,
    wakeups,
)
from raw_beats import READY

JOINED = "member {} joined"
GONE = "member {} is gone"
SERVES = " now serves queue "
KEY_CHARACTERS = string.ascii_letters + string.digits
SETTLE_TIMEOUT = 120.0
# After every member joined (or a raw member is ready), before the quiet window (--settle).
SETTLE_SECONDS = 3.0
RAW_BEATS = Path(__file__).with_name("raw_beats.py")
# After a join or a kill, before the next: the queues that move have moved.
BETWEEN_SAMPLES_SECONDS = 3.0


@dataclass(frozen=True)
class Plan:
    """How each size is measured: the options, the same for every size and broker."""

    window: float
    samples: int
    settle: float = SETTLE_SECONDS
    member_args: tuple[str, ...] = ()
    raw: bool = True  # each size's floor too (raw_beats.py)
    # The members' and the floor's heartbeat interval, from --member-config; None: the broker's.
    heartbeat_interval: float | None = None
    primed: bool = False  # one event to every queue before the window (owners the broker knows)


@dataclass(frozen=True)
class Size:
    """One group shape to measure."""

    queues: int
    clients: int

    @property
    def label(self) -> str:
        return f"QC {self.queues} x {self.clients}"


def parse_sizes(_ctx: click.Context, _param: click.Parameter, value: str) -> list[Size]:
    """`16x4,64x4` -> sizes; a bad item is a usage error naming it."""
    sizes = []
    for item in value.split(","):
        queues, _, clients = item.strip().partition("x")
        if not (queues.isdigit() and clients.isdigit() and int(queues) and int(clients)):
            raise click.BadParameter(f"{item!r}: expected QUEUESxCLIENTS, e.g. 64x4")
        sizes.append(Size(int(queues), int(clients)))
    return sizes


def logged(deployment: LocalDeployment, names: list[str], text: str, since: int = 0) -> bool:
    """Every one of `names`' logs has `text` (with the name filled in for each), after its
    first `since` bytes."""
    for name in names:
        path = deployment.daemons[name].log_path
        if not path.exists():
            return False
        with path.open("rb") as log:
            log.seek(since)
            if text.format(name) not in log.read().decode(errors="replace"):
                return False
    return True


def serving(deployment: LocalDeployment, names: list[str]) -> int:
    """How many times `names`' logs say their client took a queue."""
    taken = 0
    for name in names:
        path = deployment.daemons[name].log_path
        if path.exists():
            taken += path.read_bytes().count(SERVES.encode())
    return taken


def priming_keys(config: GroupConfig) -> list[str]:
    """One key for each of the group's queues: the first of a fixed series of random ones that
    hashes to it (keys numbered in order would not do: a Java string hash modulo a multiple of
    31 depends on a key's last characters alone)."""
    draw = random.Random(0)
    keys: dict[int, str] = {}
    while len(keys) < config.queue_count:
        key = "prime-" + "".join(draw.choices(KEY_CHARACTERS, k=12))
        keys.setdefault(config.queue_for_key(key), key)
    return [keys[queue] for queue in range(config.queue_count)]


async def prime(broker: Broker, config: GroupConfig) -> None:
    """Publish one event to every queue: each queue then has an owner the broker knows, as in
    a group that served traffic and went quiet (on NATS a pinned owner keeps pulling)."""
    for key in priming_keys(config):
        destination = event_destination(config.hash_prefix, config.bucket_for_key(key), key)
        await broker.publish(destination, b"prime")


def log_size(daemon: Daemon) -> int:
    """How far `daemon`'s log has come (what it says from now on starts there)."""
    return daemon.log_path.stat().st_size if daemon.log_path.exists() else 0


async def wait_until(check: Any, timeout: float, what: str, daemons: list[Daemon]) -> float:
    """Seconds until `check()` held; BenchError naming `what` after `timeout`."""
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout:
            tails = "\n".join(d.log_tail(5) for d in daemons[:2])
            raise BenchError(f"{what} not within {timeout:.0f} s\n{tails}")
        for daemon in daemons:
            if not daemon.running:
                raise BenchError(f"{daemon.name} exited: {daemon.log_tail(5)}")
        await asyncio.sleep(0.05)
    return time.monotonic() - started


async def measure_size(run: BrokerRun, broker: Broker, size: Size, plan: Plan) -> dict:
    """Idle CPU and control bytes/s at one size, then the plan's samples: joins and crashes."""
    name = f"idle-{uuid.uuid4().hex[:6]}"
    config = GroupConfig(  # small queues: no event flows, and NATS reserves QS x QC on disk
        hash_prefix=name, hash_count=max(64, size.queues), queue_count=size.queues, queue_size_mb=8
    )
    await broker.create_group(name, config)
    deployment = run.deployment(name)
    control_bytes = 0

    def count(body: bytes) -> None:
        nonlocal control_bytes
        control_bytes += len(body)

    unsubscribe = await broker.subscribe_control(name, count)
    try:
        clients = [
            deployment.start(f"c{n}", "lbg-client", "--id", f"c{n}", *plan.member_args)
            for n in range(size.clients)
        ]
        names = [c.name for c in clients]
        joined = lambda: logged(deployment, names, JOINED)  # noqa: E731
        await wait_until(joined, SETTLE_TIMEOUT, f"{size.label}: every client joined", clients)
        if plan.primed:
            await prime(broker, config)
            served = lambda: serving(deployment, names) >= size.queues  # noqa: E731
            await wait_until(served, SETTLE_TIMEOUT, f"{size.label}: every queue served", clients)
        await asyncio.sleep(plan.settle)
        bytes_before, started = control_bytes, time.monotonic()
        quiet = await quiet_cpu(run, clients, plan.window)
        result: dict[str, Any] = {
            "queues": size.queues,
            "clients": size.clients,
            "clients_cpu_pct": quiet.clients_cpu_pct,
            "broker_cpu_pct": quiet.broker_cpu_pct,
            "client_wakeups_per_s": quiet.wakeups_per_client_s,
            "control_bytes_per_s": round(
                (control_bytes - bytes_before) / (time.monotonic() - started)
            ),
            "load_1min": round(os.getloadavg()[0], 1),
        }
        result["join_s"], result["crash_s"] = [], []
        for sample in range(plan.samples):
            joiner = deployment.start(
                f"j{sample}", "lbg-client", "--id", f"j{sample}", *plan.member_args
            )
            joined_in = await wait_until(
                lambda: logged(deployment, [joiner.name], JOINED),  # noqa: B023
                SETTLE_TIMEOUT,
                f"{size.label}: {joiner.name} joined",
                [*clients, joiner],
            )
            result["join_s"].append(round(joined_in, 2))
            clients.append(joiner)
            await asyncio.sleep(BETWEEN_SAMPLES_SECONDS)
            victim, witness = clients.pop(0), clients[0]
            heard = log_size(witness)  # a lapse seen before the kill (a busy machine) is not it
            victim.send(signal.SIGKILL)
            victim.wait(5)
            gone = GONE.replace("{}", victim.name)
            seen_in = await wait_until(
                lambda: logged(deployment, [witness.name], gone, heard),  # noqa: B023
                SETTLE_TIMEOUT,
                f"{size.label}: the others saw {victim.name} gone",
                clients,
            )
            result["crash_s"].append(round(seen_in, 2))
            await asyncio.sleep(BETWEEN_SAMPLES_SECONDS)
        return result
    finally:
        with contextlib.suppress(BrokerError):
            await unsubscribe()
        await asyncio.to_thread(deployment.stop_all)
        with contextlib.suppress(BrokerError):
            await broker.delete_group(name)


@dataclass(frozen=True)
class Quiet:
    """What a group's daemons and its broker cost over a window with no event flowing."""

    clients_cpu_pct: float
    broker_cpu_pct: float | None
    wakeups_per_client_s: float


async def quiet_cpu(run: BrokerRun, daemons: list[Daemon], window: float) -> Quiet:
    """The daemons' CPU together and the broker's over the next `window` s, % of a core, and
    how often a daemon woke up, on average."""
    pids = [d.process.pid for d in daemons]
    before = [cpu_seconds(pid) or 0.0 for pid in pids]
    wakes_before = [wakeups(pid) or 0 for pid in pids]
    broker_before = tree_cpu_seconds(run.pid) if run.pid else None
    started = time.monotonic()
    await asyncio.sleep(window)
    elapsed = time.monotonic() - started
    after = [cpu_seconds(pid) or 0.0 for pid in pids]
    wakes_after = [wakeups(pid) or 0 for pid in pids]
    broker_after = tree_cpu_seconds(run.pid) if run.pid else None
    broker = (
        None
        if broker_before is None or broker_after is None
        else round(100 * (broker_after - broker_before) / elapsed, 1)
    )
    wakes = (sum(wakes_after) - sum(wakes_before)) / elapsed / max(1, len(pids))
    return Quiet(round(100 * (sum(after) - sum(before)) / elapsed, 1), broker, round(wakes))


async def measure_raw(run: BrokerRun, size: Size, plan: Plan) -> dict:
    """The floor at this size: as many raw_beats.py members, heartbeats only, on the broker's
    own client, measured like the lbg clients (after them, on the same broker)."""
    name = f"raw{uuid.uuid4().hex[:6]}"
    deployment = run.deployment(name)
    command = [sys.executable, str(RAW_BEATS), "--broker-url", run.endpoint.url, "--name", name]
    interval = plan.heartbeat_interval or heartbeat_timing(run.endpoint.url).interval
    try:
        members = [
            deployment.spawn(f"r{n}", [*command, "--interval", str(interval)])
            for n in range(size.clients)
        ]
        ready = lambda: logged(deployment, [m.name for m in members], READY)  # noqa: E731
        await wait_until(ready, SETTLE_TIMEOUT, f"{size.label}: every raw member ready", members)
        await asyncio.sleep(plan.settle)
        quiet = await quiet_cpu(run, members, plan.window)
    finally:
        await asyncio.to_thread(deployment.stop_all)
    return {
        "raw_clients_cpu_pct": quiet.clients_cpu_pct,
        "raw_broker_cpu_pct": quiet.broker_cpu_pct,
        "raw_client_wakeups_per_s": quiet.wakeups_per_client_s,
    }


def heartbeat_interval(member_config: str | None) -> float | None:
    """The members' heartbeat interval if the member config sets one (else each broker's)."""
    if member_config is None:
        return None
    with open(member_config, "rb") as file:
        return tomllib.load(file).get("client", {}).get("heartbeat_interval")


async def scenario(run: BrokerRun, sizes: list[Size], plan: Plan) -> dict[str, Any]:
    """Every size on one broker, and each size's raw floor too if the plan says so."""
    broker = await run.connect("bench-idle")
    try:
        rows: list[dict[str, Any]] = []
        for size in sizes:
            print(f"[{run.kind}] {size.label} ...", file=sys.stderr)
            try:
                row = await measure_size(run, broker, size, plan)
                if plan.raw:
                    row.update(await measure_raw(run, size, plan))
                    row["clients_vs_raw"] = ratio(
                        row["clients_cpu_pct"], row["raw_clients_cpu_pct"]
                    )
                rows.append(row)
            except (BenchError, BrokerError) as exc:  # the other sizes still count
                print(f"[{run.kind}] {size.label} failed: {exc}", file=sys.stderr)
                rows.append({"error": str(exc)})
        return {"sizes": rows}
    finally:
        await broker.close()


def show(results: dict[str, dict[str, Any]], sizes: list[Size]) -> list[str]:
    """One table per figure: sizes down, brokers across."""
    kinds = list(results)
    lines: list[str] = []
    figures = (
        ("clients_cpu_pct", "clients' CPU, % of a core"),
        ("broker_cpu_pct", "broker CPU, % of a core"),
        ("raw_clients_cpu_pct", "raw floor (raw_beats.py): clients' CPU, %"),
        ("clients_vs_raw", "clients' CPU / raw floor's"),
        ("raw_broker_cpu_pct", "raw floor: broker CPU, % of a core"),
        ("client_wakeups_per_s", "wake-ups per client per s"),
        ("raw_client_wakeups_per_s", "raw floor: wake-ups per member per s"),
        ("control_bytes_per_s", "control channel, bytes/s"),
        ("join_s", "join: start -> joined, s, p50 / max"),
        ("crash_s", "kill -9 -> seen gone, s, p50 / max"),
        ("load_1min", "machine load (1 min) at the window's end"),
    )
    label_width = max(len(title) for _, title in figures)  # every table's columns line up
    for key, title in figures:
        rows = []
        for index, size in enumerate(sizes):
            cells = []
            for kind in kinds:
                measured = results[kind].get("sizes") or []
                value = measured[index].get(key) if index < len(measured) else None
                cells.append("-" if value is None else cell(value))
            rows.append((size.label, cells))
        lines += ["", *table(label_width, kinds, [""], rows, width=14, heading=title)]
    lines += [f"[{k}] {v['error']}" for k, v in results.items() if "error" in v]
    return lines


def ratio(ours: float, raw: float) -> float | None:
    """Our figure over the floor's, None when the floor measured nothing."""
    return round(ours / raw, 2) if raw > 0 else None


def cell(value: Any) -> str:
    """A figure, or a list of samples as its median and its largest."""
    if isinstance(value, list):
        return f"{statistics.median(value):.2f} / {max(value):.2f}" if value else "-"
    return str(value)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--sizes", default="16x4,64x4,256x8", show_default=True, callback=parse_sizes,
              help="QUEUESxCLIENTS, comma-separated.")  # fmt: skip
@click.option("--window", default=15.0, show_default=True, type=click.FloatRange(min=1),
              help="Seconds of quiet measured per size.")  # fmt: skip
@click.option("--settle", default=SETTLE_SECONDS, show_default=True,
              type=click.FloatRange(min=0),
              help="Seconds between the last member joining and the window. A longer one shows "
              "steady-state work of longer periods (Message DB's look at its locks every 30 s, "
              "RabbitMQ's standby counts).")  # fmt: skip
@click.option("--samples", default=3, show_default=True, type=click.IntRange(min=1),
              help="Joins and kills -9 timed per size, one after the other.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Last stdout line: every figure as JSON.")
@click.option(
    "--member-config",
    type=click.Path(exists=True, dir_okay=False),
    help="A TOML file every client runs with (--config), e.g. other [client] "
    "heartbeat_interval, lease and lease_margin values, to weigh their idle cost against "
    "the defaults' [default: the built-in defaults].",
)
@click.option("--raw/--no-raw", default=True, show_default=True,
              help="After each size, measure its floor: as many members exchanging the same "
              "heartbeats on the broker's own client (raw_beats.py), no lbg code.")  # fmt: skip
@click.option("--primed", is_flag=True,
              help="Publish one event to every queue once the clients joined, and measure "
              "when each queue has an owner the broker knows: a group that served traffic and "
              "went quiet. Without it nothing is pinned on NATS, so its owners' pulls are not "
              "in the figures. Give it --settle 40: first the queues whose event went to "
              "whoever stood first in line move to their owners (RabbitMQ), 1024 queues "
              "record their first positions (Message DB), and NATS owners give their pins "
              "back after 15 priority timeouts (30 s) with no event (--settle 0 --window 25 "
              "measures them still pinned).")  # fmt: skip
@click.option("--keep-logs", is_flag=True,
              help="Keep the daemons' logs (their folder is printed at the end) even when every "
              "broker passed [default: kept only for a broker that failed].")  # fmt: skip
@broker_options
def main(
    sizes: list[Size],
    window: float,
    settle: float,
    samples: int,
    as_json: bool,
    member_config: str | None,
    raw: bool,
    primed: bool,
    keep_logs: bool,
    brokers: tuple[str, ...],
    broker_url: str | None,
    admin_url: str | None,
) -> None:
    """Idle cost of a group by queue count, on each broker, in one run."""
    kinds = chosen_brokers(brokers, broker_url, admin_url)
    # The bench's clients connect as the broker's admin user: on RabbitMQ no client user is
    # made, and the warning that says so would only interleave with the progress lines.
    logging.getLogger("lbg.broker.rabbitmq.provision").setLevel(logging.ERROR)
    plan = Plan(
        window,
        samples,
        settle,
        ("--config", str(Path(member_config).resolve())) if member_config else (),
        raw,
        heartbeat_interval(member_config),
        primed,
    )
    workdir = Path(tempfile.mkdtemp(prefix="lbg-idle-"))
    echo = lambda line: print(line, file=sys.stderr)  # noqa: E731
    results = None
    try:
        results = uvloop.run(
            run_per_broker(
                kinds,
                broker_url,
                admin_url,
                workdir,
                lambda run: scenario(run, sizes, plan),
                echo,
                RABBITMQ_STATISTICS_MS,  # what a production node runs, not the tests' 0.5 s
            )
        )
    finally:
        tidy_workdir(workdir, passed(results), echo, keep_logs)
    for line in show(results, sizes):
        click.echo(line)
    if as_json:
        click.echo(orjson.dumps(results).decode())


if __name__ == "__main__":
    main()
