"""`lbg local ...` and `lbg autoscale`: a local stack whose client count changes at run time."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import time
from pathlib import Path

import click
import uvloop

from lbg.cli.common import admin_url_option, fail, one_line_errors, run, setup_logging
from lbg.cli.localstate import DEFAULT_FOLDER
from lbg.devstack.deployment import script
from lbg.devstack.embedded import free_port
from lbg.devstack.scaling import LocalStack

LOCAL_GROUP = "local"
BROKER_START_TIMEOUT = 20.0
VALIDATOR_IDLE_EXIT = "2"
JOIN_TIMEOUT = 30.0
log = logging.getLogger(__name__)

folder_option = click.option(
    "--folder",
    type=click.Path(file_okay=False),
    default=DEFAULT_FOLDER,
    show_default=True,
    help="Where the stack keeps its state, logs and broker data.",
)


def _stack(folder: str) -> LocalStack:
    return LocalStack(Path(folder))


@click.group(name="local")
def local() -> None:
    """A group's daemons as local background processes, scaled at run time (make scale N=4)."""


@local.command()
@folder_option
@click.option("--broker-url", help="Use this broker instead of starting an embedded NATS one.")
@admin_url_option
@click.option("--group", "group_name", default=LOCAL_GROUP, show_default=True)
@click.option("--clients", type=click.IntRange(min=0), default=2, show_default=True)
@click.option("--rate", type=click.FloatRange(min=0), default=200.0, show_default=True,
              help="Events/s of the publisher (0: no publisher).")  # fmt: skip
@click.option("--keys", type=click.IntRange(min=1), default=100, show_default=True)
@click.option("--queue-count", type=click.IntRange(min=1), default=4, show_default=True)
@click.option("--hash-count", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--web-port", type=click.IntRange(0, 65535), default=0,
              help="Serve the validator's live view on this port (0: off).")  # fmt: skip
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=0,
              help="Serve Prometheus metrics: the validator on this port, the publisher on the "
              "next, client-N on this + 2 + N (0: off).")  # fmt: skip
def up(
    folder: str,
    broker_url: str | None,
    admin_url: str | None,
    group_name: str,
    clients: int,
    rate: float,
    keys: int,
    queue_count: int,
    hash_count: int,
    web_port: int,
    metrics_port: int,
) -> None:
    """Start a broker (unless --broker-url), the group (unless it exists), a validator, a
    publisher and --clients dynamic lbg-clients, all in the background; `lbg local scale N`
    changes the client count later and `lbg local down` stops everything and prints the
    validator's verdict. A new stack starts afresh: the previous run's logs, report and
    embedded broker data are removed."""
    from lbg.devstack.scaling import StackError, StackState

    setup_logging()
    stack = _stack(folder)
    if stack.running() is not None:
        fail(f"a local stack already runs from {stack.folder} (lbg local down stops it)")
    stack.folder.mkdir(parents=True, exist_ok=True)
    stack.clear()
    state = StackState(broker_url or "", group_name, admin_url, metrics_port=metrics_port)
    if broker_url is None:
        port = free_port()
        state.broker_url = f"nats://127.0.0.1:{port}"
        state.broker_pid = stack.start(
            "broker", "lbg", "broker", "--port", str(port), "--data-dir", str(stack.folder / "nats")
        )
        stack.save(state)
        _wait_for_port(port, state.broker_pid)
    stack.save(state)
    admin = ["--admin-url", admin_url] if admin_url else []
    created = subprocess.run([
        script("cg-admin"), "--broker-url", state.broker_url, *admin, "create", "--if-not-exists",
        "--group", group_name, "--hash-prefix", group_name,
        "--hash-count", str(hash_count), "--queue-count", str(queue_count),
    ], capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    if created.returncode != 0:
        stack.down()
        fail(created.stderr.strip() or "cg-admin create failed")
    web = ["--web-port", str(web_port)] if web_port else []
    state.others["validator"] = stack.spawn(
        state, "validator", "validation-client", "--progress-interval", "10",
        "--report-json", str(stack.report_path), "--idle-exit", VALIDATOR_IDLE_EXIT,
        *web, *state.metrics_args(0),
    )  # fmt: skip
    if rate > 0:
        state.others["publisher"] = stack.spawn(
            state, "publisher", "hashed-publisher", "--id", "publisher",
            "--keys", str(keys), "--rate", str(rate), *state.metrics_args(1),
        )  # fmt: skip
    stack.save(state)
    try:
        started, _ = stack.scale(clients)
    except StackError as exc:
        fail(str(exc))
    _wait_for_members(stack, started)
    click.echo(f"local stack up: broker {state.broker_url}, group '{group_name}', "
               f"{clients} clients; logs in {stack.folder}")  # fmt: skip
    if web_port:
        click.echo(f"live view: http://127.0.0.1:{web_port}/")
    if metrics_port:
        click.echo(f"metrics: http://127.0.0.1:{metrics_port}/metrics (validator), port "
                   f"{metrics_port + 1} (publisher), {metrics_port + 2}+N (client-N)")  # fmt: skip
    click.echo(f"lbg status --group {group_name} (run here, it finds this stack); "
               "scale: lbg local scale N (make scale N=4); stop: lbg local down")  # fmt: skip


def _wait_for_port(port: int, pid: int) -> None:
    import socket

    from lbg.devstack.scaling import alive

    deadline = time.monotonic() + BROKER_START_TIMEOUT
    while time.monotonic() < deadline:
        if not alive(pid):
            fail("the embedded broker exited while starting (see broker.log)")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    fail(f"the embedded broker did not listen on {port} within {BROKER_START_TIMEOUT:g} s")


def _wait_for_members(stack: LocalStack, names: list[str]) -> None:
    """Return once the clients just started are heard as active members, so that the next
    command (`lbg move ... client-3`) finds them; a note after JOIN_TIMEOUT s if not."""
    from lbg.admin.status import read_status
    from lbg.api import default_id
    from lbg.broker import connect_broker
    from lbg.model.control import MemberState
    from lbg.settings import BrokerSettings

    if not names:
        return
    state = stack.load()

    async def joined() -> bool:
        settings = BrokerSettings(url=state.broker_url, admin_url=state.admin_url)
        broker = await connect_broker(settings, default_id("lbg-local"))
        try:
            deadline = time.monotonic() + JOIN_TIMEOUT
            while time.monotonic() < deadline:
                status = await read_status(broker, state.group, 0.5)
                active = {m.member for m in status.members if m.state == MemberState.ACTIVE.value}
                if active.issuperset(names):
                    return True
            return False
        finally:
            await broker.close()

    with one_line_errors():
        if not uvloop.run(joined()):
            click.echo(f"note: {', '.join(names)} not active within {JOIN_TIMEOUT:g} s "
                       f"(see their logs in {stack.folder})", err=True)  # fmt: skip


@local.command()
@folder_option
@click.argument("count", type=click.IntRange(min=0))
def scale(folder: str, count: int) -> None:
    """Run exactly COUNT clients: start the missing ones or SIGTERM the newest (a clean
    handover); the others keep running."""
    from lbg.devstack.scaling import StackError

    try:
        started, stopped = _stack(folder).scale(count)
    except StackError as exc:
        fail(str(exc))
    _wait_for_members(_stack(folder), started)
    click.echo(f"{count} clients; started {', '.join(started) or '-'}; "
               f"stopped {', '.join(stopped) or '-'}")  # fmt: skip


@local.command()
@folder_option
def status(folder: str) -> None:
    """The stack's processes and whether each still runs."""
    from lbg.devstack.scaling import StackError, alive

    try:
        state = _stack(folder).load()
    except StackError as exc:
        fail(str(exc))
    click.echo(f"broker {state.broker_url} group '{state.group}'")
    pids = {"broker": state.broker_pid, **state.others, **state.clients}
    for name, pid in pids.items():
        if pid is not None:
            click.echo(f"{name}\t{pid}\t{'running' if alive(pid) else 'gone'}")


@local.command()
@folder_option
def down(folder: str) -> None:
    """Stop the publisher, let the clients drain until the validator accounted for every
    event, stop the clients (clean handovers), the validator and the broker; print the
    validator's report. Exits 1 if it says something was lost or reordered."""
    from lbg.devstack.scaling import StackError

    stack = _stack(folder)
    try:
        report = stack.down()
    except StackError as exc:
        fail(str(exc))
    if report is None:
        click.echo(f"local stack stopped; the validator wrote no report (see {stack.folder})")
        return
    click.echo(report.to_text())
    click.echo(f"local stack stopped; logs in {stack.folder}")
    if report.verdict == "FAILED":
        sys.exit(1)


@click.command()
@folder_option
@click.option(
    "--broker-url",
    help="Watch this broker's group instead of a local stack: only "
    "emit the count (--desired-file, --metrics-port, --once), start or stop nothing.",
)
@admin_url_option
@click.option("--group", "group_name", help="With --broker-url: the group to watch.")
@click.option("--min", "minimum", type=click.IntRange(min=0), default=1, show_default=True)
@click.option(
    "--max",
    "maximum",
    type=click.IntRange(min=1),
    help="Most clients [default: the group's queue count].",
)
@click.option(
    "--high",
    type=click.FloatRange(min=0),
    default=200.0,
    show_default=True,
    help="Add clients while the backlog per client is above this.",
)
@click.option(
    "--low",
    type=click.FloatRange(min=0),
    default=20.0,
    show_default=True,
    help="Remove one while the backlog per client is below this (and --low-age).",
)
@click.option(
    "--high-age",
    type=click.FloatRange(min=0),
    default=5.0,
    show_default=True,
    help="Add one while the oldest unprocessed event is older than this (s).",
)
@click.option(
    "--low-age",
    type=click.FloatRange(min=0),
    default=1.0,
    show_default=True,
    help="Remove one only while the oldest is younger than this (s).",
)
@click.option(
    "--cooldown",
    type=click.FloatRange(min=0),
    default=5.0,
    show_default=True,
    help="Seconds after a change before the next.",
)
@click.option(
    "--calm",
    type=click.FloatRange(min=0),
    default=15.0,
    show_default=True,
    help="Seconds the lag must stay low before a client is removed.",
)
@click.option(
    "--interval",
    type=click.FloatRange(min=0.1),
    default=1.0,
    show_default=True,
    help="Seconds between two reads of the lag.",
)
@click.option(
    "--desired-file",
    type=click.Path(dir_okay=False),
    help="Write the desired count to this file whenever it changes.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=0,
    help="Serve lbg_autoscale_desired_clients and the lag on /metrics (0: off).",
)
@click.option(
    "--metrics-address",
    default="127.0.0.1",
    show_default=True,
    help="Address for --metrics-port (0.0.0.0 for a scraper on another host).",
)
@click.option(
    "--once",
    is_flag=True,
    help="Read the lag once, print the count it asks for "
    "and exit with that count as the status; start or stop nothing.",
)
@click.option("--dry-run", is_flag=True, help="Decide and emit, but start or stop nothing.")
def autoscale(
    folder: str,
    broker_url: str | None,
    admin_url: str | None,
    group_name: str | None,
    minimum: int,
    maximum: int | None,
    high: float,
    low: float,
    high_age: float,
    low_age: float,
    cooldown: float,
    calm: float,
    interval: float,
    desired_file: str | None,
    metrics_port: int,
    metrics_address: str,
    once: bool,
    dry_run: bool,
) -> None:
    """Scale a group's clients between --min and --max on its consumer lag: the backlog and
    the age of its oldest unprocessed event. Scales up at once, down one client at a time
    after --calm seconds of low lag, never twice within --cooldown (every decision and hold is
    logged). Drives the local stack in --folder, or with --broker-url only reports the count:
    to a file, to Prometheus (a KEDA trigger) or as the exit status of --once."""
    from lbg.admin.autoscale import Autoscaler
    from lbg.api import default_id
    from lbg.broker import connect_broker
    from lbg.devstack.scaling import StackError
    from lbg.metrics import serve
    from lbg.model.autoscale import AutoscalePolicy, wanted
    from lbg.settings import BrokerSettings

    setup_logging()
    stack = None
    if broker_url is None:
        stack = _stack(folder)
        try:
            state = stack.load()
        except StackError as exc:
            fail(str(exc))
        broker_url, admin_url, group_name = state.broker_url, state.admin_url, state.group
    elif group_name is None:
        fail("--broker-url needs --group (the group to watch)")
    drive = stack is not None and not (dry_run or once)

    async def scale(count: int) -> None:
        assert stack is not None
        started, stopped = await asyncio.to_thread(stack.scale, count)
        log.info(
            "autoscale: started %s stopped %s", ", ".join(started) or "-", ", ".join(stopped) or "-"
        )

    def running() -> int:
        assert stack is not None
        return len(stack.running_clients(stack.load()))

    async def main(stop: asyncio.Event) -> int:
        broker = await connect_broker(
            BrokerSettings(url=broker_url, admin_url=admin_url), default_id("autoscale")
        )
        try:
            config = await broker.read_group(group_name)
            policy = AutoscalePolicy(
                minimum, maximum or config.queue_count, high, low, high_age, low_age, cooldown, calm
            )
            if problem := policy.problem():
                fail(problem)
            scaler = Autoscaler(
                broker,
                group_name,
                config,
                policy,
                count=running if stack is not None else None,
                scale=scale if drive else None,
                desired_file=Path(desired_file) if desired_file else None,
            )
            if once:
                lag, clients = await scaler.read_lag()
                count, reason = wanted(policy, clients, lag)
                click.echo(f"{count} clients ({clients} running; {reason})")
                return count
            async with serve(metrics_port, metrics_address, scaler.families, scaler.ready):
                await scaler.run(stop, interval)
        finally:
            await broker.close()
        return 0

    run(main)
