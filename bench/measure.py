"""What the benchmarks share: the brokers they run on, reading a group's records, CPU, tables.

CPU figures come from /proc (Linux only).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import click

from lbg.broker import connect_broker
from lbg.broker.adapters import adapter_for
from lbg.broker.base import Broker, BrokerError, OutputMessage
from lbg.devstack.brokers import LOCAL_BROKERS, BrokerEndpoint, local_broker
from lbg.devstack.deployment import LocalDeployment
from lbg.devstack.embedded import BrokerStartError
from lbg.devstack.rabbitmq import TEST_STATISTICS_MS
from lbg.settings import BrokerSettings

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}
TCP_LISTEN = "0A"

Echo = Callable[[str], None]


class BenchError(Exception):
    """The scenario could not go on; the message says why, with a log tail where useful."""


def machine_busy_seconds() -> float:
    """CPU seconds all CPUs spent busy (not idle or waiting for I/O) since boot."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (sum(fields) - fields[3] - fields[4]) / CLOCK_TICKS


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a live process, from /proc; None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def wakeups(pid: int) -> int | None:
    """Times a live process's live threads went to sleep and woke (voluntary context
    switches), from /proc; None if it is gone. An idle daemon's CPU follows them more than its
    work: on a VM a wake from idle costs a few hundred microseconds, whatever little it does."""
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    total = 0
    for thread in threads:
        with contextlib.suppress(OSError):
            text = Path(f"/proc/{pid}/task/{thread}/status").read_text()
            total += int(text.partition("voluntary_ctxt_switches:")[2].split()[0])
    return total


def tree_cpu_seconds(pid: int) -> float | None:
    """CPU time of a live process and of its live children: a PostgreSQL's work is done by
    the postmaster's backends, one per connection. None if the process is gone."""
    total = cpu_seconds(pid)
    if total is None:
        return None
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rpartition(")")[2].split()
            if int(fields[1]) == pid:
                total += (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    return total


def own_cpu_seconds() -> float:
    """CPU time of this process (the validator and the polling), all threads."""
    times = os.times()
    return times.user + times.system


def reaped_children_cpu_seconds() -> float:
    """CPU time of this process's children that have exited and been reaped."""
    times = os.times()
    return times.children_user + times.children_system


def listening_pid(url: str) -> int | None:
    """The local process listening on the URL's port (the broker, for its CPU); None if unknown.

    Broker-neutral: the embedded nats-server is a child of this process, a local RabbitMQ node
    is detached from it; both are found through their listening socket.
    """
    parts = urlsplit(url)
    if parts.hostname not in LOCAL_HOSTS or parts.port is None:
        return None
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == TCP_LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == parts.port:
                    inodes.add(f"socket:[{fields[9]}]")
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        with contextlib.suppress(OSError):
            for fd in fd_dir.iterdir():
                with contextlib.suppress(OSError):
                    if os.readlink(fd) in inodes:
                        return int(fd_dir.parent.name)
    return None


def follow_records(
    broker: Broker, group: str, handle: Callable[[OutputMessage], None]
) -> asyncio.Task[None]:
    """Read the group's outputs from the start into `handle`, in a task the caller cancels.

    The task ends with the error if reading fails or `handle` raises, so pollers can check it.
    """

    async def read() -> None:
        async for message in broker.read_output(group):
            handle(message)

    return asyncio.create_task(read())


def broker_kind(url: str) -> str | None:
    """Which broker a URL names, from its scheme (None: not one the benchmark runs on)."""
    adapter = adapter_for(urlsplit(url).scheme)
    return adapter.key if adapter is not None and adapter.key in ("nats", "rabbitmq") else None


def _split_brokers(_ctx: click.Context, _param: click.Parameter, values: tuple[str, ...]) -> Any:
    """`--broker nats --broker rabbitmq` or `--broker nats,rabbitmq`: the kinds, in order, once."""
    kinds: list[str] = []
    for kind in (k.strip() for value in values for k in value.split(",")):
        if kind not in LOCAL_BROKERS:
            raise click.BadParameter(f"'{kind}': choose from {', '.join(LOCAL_BROKERS)}")
        if kind not in kinds:
            kinds.append(kind)
    return tuple(kinds)


def broker_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The benches' --broker, --broker-url and --admin-url options."""
    command = click.option(
        "--admin-url",
        help="The management API of a RabbitMQ --broker-url (http://host:15672).",
    )(command)
    command = click.option(
        "--broker-url",
        help="Run on this one broker (nats:// or amqp://) instead of private ones.",
    )(command)
    return click.option(
        "--broker",
        "brokers",
        multiple=True,
        callback=_split_brokers,
        help="Broker to run the whole scenario on, one after another: repeat the option or give "
        f"a comma list [default: {','.join(LOCAL_BROKERS)}, each a private one in a temp dir].",
    )(command)


def chosen_brokers(
    brokers: tuple[str, ...], broker_url: str | None, admin_url: str | None
) -> tuple[str, ...]:
    """The broker kinds to run on, checked against --broker-url and --admin-url."""
    if broker_url is None:
        if admin_url is not None:
            raise click.UsageError("--admin-url goes with --broker-url")
        return brokers or LOCAL_BROKERS
    kind = broker_kind(broker_url)
    if kind is None:
        raise click.UsageError(f"--broker-url {broker_url}: expected nats:// or amqp://")
    if brokers and brokers != (kind,):
        raise click.UsageError(f"--broker-url is a {kind} broker: give --broker {kind} or none")
    if kind == "rabbitmq" and admin_url is None:
        raise click.UsageError("a RabbitMQ --broker-url needs --admin-url (its management API)")
    return (kind,)


@dataclass(frozen=True)
class BrokerRun:
    """One broker a scenario runs on, the folder for its daemons' logs, and its process."""

    endpoint: BrokerEndpoint
    workdir: Path
    pid: int | None

    @property
    def kind(self) -> str:
        return self.endpoint.kind

    async def connect(self, name: str) -> Broker:
        """A broker client with the management API where the broker needs one (groups)."""
        settings = BrokerSettings(url=self.endpoint.url, admin_url=self.endpoint.admin_url)
        return await connect_broker(settings, name)

    def deployment(self, group: str) -> LocalDeployment:
        """Local daemon processes of `group` on this broker, logging under the workdir."""
        return LocalDeployment(
            self.endpoint.url, group, self.workdir / group, admin_url=self.endpoint.admin_url
        )


class Usage:
    """Wall time and CPU seconds from its creation on: the machine's, this run's, the broker's."""

    def __init__(self, broker_pid: int | None) -> None:
        self.broker_pid = broker_pid
        self.started = time.monotonic()
        self.busy = machine_busy_seconds()
        self.ours = own_cpu_seconds() + reaped_children_cpu_seconds()
        self.broker = self._broker_cpu()

    def _broker_cpu(self) -> float | None:
        return cpu_seconds(self.broker_pid) if self.broker_pid else None

    def figures(self) -> dict[str, Any]:
        """Wall, machine busy %, broker CPU and the CPU of processes this run did not start.

        Call it once the run's daemons have exited (and were reaped), before the broker stops.
        """
        wall = time.monotonic() - self.started
        busy = machine_busy_seconds() - self.busy
        ours = own_cpu_seconds() + reaped_children_cpu_seconds() - self.ours
        after = self._broker_cpu()
        broker = None if self.broker is None or after is None else after - self.broker
        cpus = os.cpu_count() or 1
        return {
            "wall_s": round(wall, 1),
            "cpus": cpus,
            "machine_busy_pct": round(100 * busy / (wall * cpus), 1),
            "broker_cpu_s": None if broker is None else round(broker, 1),
            "other_cpu_s": round(busy - ours - (broker or 0.0), 1),
        }


@contextlib.contextmanager
def open_broker(
    kind: str,
    broker_url: str | None,
    admin_url: str | None,
    data_dir: Path,
    rabbitmq_statistics_ms: int = TEST_STATISTICS_MS,
) -> Iterator[BrokerEndpoint]:
    """The broker at `broker_url`, else a private one of `kind` (stopped on exit)."""
    if broker_url is not None:
        yield BrokerEndpoint(kind, broker_url, admin_url)
        return
    with local_broker(kind, data_dir, rabbitmq_statistics_ms) as endpoint:
        yield endpoint


async def run_per_broker(
    kinds: Sequence[str],
    broker_url: str | None,
    admin_url: str | None,
    workdir: Path,
    scenario: Callable[[BrokerRun], Awaitable[dict[str, Any]]],
    echo: Echo,
    rabbitmq_statistics_ms: int = TEST_STATISTICS_MS,
) -> dict[str, dict[str, Any]]:
    """The whole scenario on each broker in turn; a failed one gets {"error": ...}, the rest run.

    SIGTERM cancels like Ctrl-C, so every daemon and private broker is stopped on the way out;
    a second SIGTERM (`timeout` passes one on as `pkill` sends its own) does not cancel that
    cleanup, which left clients running.
    """
    task = asyncio.current_task()
    if task is not None:

        def cancel_once() -> None:
            if not task.cancelling():
                task.cancel()

        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, cancel_once)
    results: dict[str, dict[str, Any]] = {}
    for kind in kinds:
        folder = workdir / kind
        try:
            # A private broker starts here, blocking the loop for its start (RabbitMQ: ~10 s);
            # a SIGTERM meanwhile cancels at the next await, inside this block.
            with open_broker(
                kind, broker_url, admin_url, folder, rabbitmq_statistics_ms
            ) as endpoint:
                run = BrokerRun(endpoint, folder, listening_pid(endpoint.url))
                echo(f"[{kind}] broker at {endpoint.url} (pid {run.pid or 'unknown'})")
                usage = Usage(run.pid)
                result = await scenario(run)
                result.update(usage.figures())
        except (BenchError, BrokerError, BrokerStartError) as exc:
            echo(f"[{kind}] FAILED: {exc}")
            result = {"error": str(exc)}
        results[kind] = result
    return results


def passed(results: dict[str, dict[str, Any]] | None) -> bool:
    """Whether a run finished with no broker failed (None: it did not finish)."""
    return results is not None and not any("error" in result for result in results.values())


def tidy_workdir(workdir: Path, passed: bool, echo: Echo, keep: bool = False) -> None:
    """Remove a run's folder of daemon logs once every broker passed (unless `keep`); else
    keep it and say where: a failed broker's logs say why."""
    if passed and not keep:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        echo(f"logs kept in {workdir}")


def table(
    label_width: int,
    brokers: Sequence[str],
    columns: Sequence[str],
    rows: Sequence[tuple[str, Sequence[str]]],
    width: int = 10,
    heading: str = "",
) -> list[str]:
    """Rows of cells, `columns` per broker side by side, under a header naming each broker.

    A row's cells run broker by broker (all of the first broker's columns, then the next's);
    `heading` labels the row names.
    """
    span = width * len(columns)
    lines = [f"{'' if len(columns) > 1 else heading:{label_width}}"]
    lines[0] += "".join(f"{b:>{span}}" for b in brokers)
    if len(columns) > 1:
        lines.append(
            f"{heading:{label_width}}" + "".join(f"{c:>{width}}" for c in columns) * len(brokers)
        )
    lines.extend(
        f"{label:{label_width}}" + "".join(f"{cell:>{width}}" for cell in cells)
        for label, cells in rows
    )
    return lines


def verdict(met: bool | None) -> str:
    """How a target reads in a table."""
    return {True: "met", False: "MISSED", None: "-"}[met]
