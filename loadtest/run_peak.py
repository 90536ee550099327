"""`make peak`: a headless Locust peak against a group with clients and the validator running.

A private nats-server (or --broker-url), a fresh group, lbg-client processes scaled by the
autoscaler on the group's lag (each event costs --work-ms in the clients' handler, so a peak
needs more of them), the validator in this process, and Locust (loadtest/locustfile.py) as a
child process. Afterwards, in --out (var/peak/ by default): the peak picture (peak.png), one
row per second (peak_seconds.csv), the verdict (verdict.txt), report.json, and Locust's own
CSV, JSON and log. Exits 1 if a request failed, or anything was lost or reordered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import click
import orjson
import uvloop

from lbg.admin.autoscale import Autoscaler
from lbg.broker import connect_broker
from lbg.broker.base import OutputMessage
from lbg.cli.common import fail, one_line_errors, require_extra
from lbg.devstack.embedded import EmbeddedNats
from lbg.devstack.peak import Handled, Sample, plot, seconds, verdict, write_csv
from lbg.devstack.scaling import LocalStack, StackState
from lbg.model.autoscale import AutoscalePolicy
from lbg.model.destinations import OutputKind
from lbg.model.group import GroupConfig
from lbg.model.messages import MalformedMessage, decode_processed
from lbg.model.sequence import Report
from lbg.settings import BrokerSettings
from lbg.validator import Validator, run_validator, wait_until_complete

HERE = Path(__file__).resolve().parent
LOCUSTFILE = HERE / "locustfile.py"
HANDLER = "peak_handler:handle"
PREFIX = "peak"
POLL_SECONDS = 0.5
ACK_WAIT_SECONDS = 30.0


@dataclass(frozen=True)
class PeakRun:
    """One peak: the broker, the clients and their work, the autoscaler, the Locust profile."""

    broker_url: str
    out: Path
    policy: AutoscalePolicy
    autoscale: bool = True
    work_ms: float = 40.0
    peak_users: int = 20
    user_rate: float = 10.0
    ramp_seconds: float = 15.0
    hold_seconds: float = 30.0
    drain_timeout: float = 60.0
    lag_limit: float = 10.0
    handler: str | None = None

    @property
    def prefix(self) -> Path:
        return self.out / PREFIX


@dataclass
class Observed:
    """What the run saw: the start, polls of the group, processed events, the drain."""

    start: float = 0.0
    samples: list[Sample] = field(default_factory=list)
    handled: list[Handled] = field(default_factory=list)
    drained: bool = False


class PeakValidator(Validator):
    """The validator, keeping each processed event's publish and record times as well."""

    def __init__(self, handled: list[Handled]) -> None:
        super().__init__()
        self._handled = handled

    def handle(self, message: OutputMessage) -> None:
        super().handle(message)
        if message.kind is OutputKind.VALIDATION and message.at is not None:
            with contextlib.suppress(MalformedMessage):
                record = decode_processed(message.body)
                if record.published_at is not None:
                    self._handled.append(Handled(record.published_at, message.at, record.client))


def locust_command(run: PeakRun, group: str) -> list[str]:
    """Locust headless with the peak shape; CSV (with history) and JSON under run.out."""
    return [
        sys.executable,
        "-m",
        "locust",
        *("-f", str(LOCUSTFILE), "--headless"),
        *("--csv", str(run.prefix), "--csv-full-history", "--json-file", str(run.prefix)),
        *("--broker-url", run.broker_url, "--group", group),
        *("--peak-users", str(run.peak_users), "--user-rate", str(run.user_rate)),
        *("--ramp-seconds", str(run.ramp_seconds), "--hold-seconds", str(run.hold_seconds)),
        # Into locust.log: its start, its users and its stats table every few seconds (with
        # --json-file it prints no final summary: peak.json has the totals).
        *("--stop-timeout", "5", "--loglevel", "INFO"),
    ]


async def _poll(scaler: Autoscaler, observed: Observed, stop: asyncio.Event) -> None:
    """Let the autoscaler poll the lag and act, noting each poll for the picture."""
    while not stop.is_set():
        decision = await scaler.poll()
        lag = scaler.lag
        observed.samples.append(
            Sample(time.time(), scaler.clients, lag.backlog, lag.oldest_age, decision.wanted)
        )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), POLL_SECONDS)


def _scale(stack: LocalStack) -> Any:
    async def scale(count: int) -> None:
        await asyncio.to_thread(stack.scale, count)

    return scale


async def run_peak(
    run: PeakRun, workdir: Path, echo: Any, observed: Observed
) -> tuple[int, Report]:
    """Run the peak against a fresh group; Locust's exit status and the validator's report.

    The clients run as a local stack, as many as the autoscaler decides from the lag (from its
    minimum), or the policy's minimum throughout without --autoscale.
    """
    group = f"peak-{uuid.uuid4().hex[:6]}"
    config = GroupConfig(hash_prefix=group, hash_count=64, queue_count=4, queue_size_mb=512)
    broker = await connect_broker(BrokerSettings(url=run.broker_url), "lbg-peak")
    stack = LocalStack(workdir)
    stack.save(
        StackState(
            broker_url=run.broker_url,
            group=group,
            client_args=["--handler", run.handler or HANDLER],
        )
    )
    validator = PeakValidator(observed.handled)
    stop = asyncio.Event()
    validation: asyncio.Task[Report] | None = None
    poller: asyncio.Task[None] | None = None
    policy = run.policy
    status = -1
    try:
        await broker.create_group(group, config)
        echo(f"group '{group}' created: {config.to_json()}")
        validation = asyncio.create_task(
            run_validator(broker, group, validator, stop, progress_interval=0)
        )
        await asyncio.to_thread(stack.scale, policy.minimum)
        scaler = Autoscaler(
            broker, group, config, policy,
            count=lambda: len(stack.running_clients(stack.load())),
            scale=_scale(stack) if run.autoscale else None,
        )  # fmt: skip
        what = (
            f"{policy.minimum}-{policy.maximum} clients on the lag"
            if run.autoscale
            else (f"{policy.minimum} clients")
        )
        echo(f"clients: {what}; {run.work_ms:g} ms of work per event")
        observed.start = time.time()
        poller = asyncio.create_task(_poll(scaler, observed, stop))
        total = 2 * run.ramp_seconds + run.hold_seconds
        echo(f"locust: peak of {run.peak_users} users x {run.user_rate:g} events/s, {total:g} s")
        with (run.out / "locust.log").open("wb") as log:
            locust = await asyncio.create_subprocess_exec(
                *locust_command(run, group), stdout=log, stderr=asyncio.subprocess.STDOUT
            )
            status = await locust.wait()
        echo(f"locust exited with status {status}; drain")
        observed.drained = await wait_until_complete(validator, run.drain_timeout)
        echo("drained" if observed.drained else f"drain timed out: {validator.progress_line()}")
        if run.autoscale:
            echo("waiting for the autoscaler to scale back down")
            steps = policy.maximum - policy.minimum
            wait = steps * (max(policy.cooldown, policy.calm) + 2) + POLL_SECONDS
            # Deliveries a scale-up left unacked count as backlog until redelivered (NATS: 30 s).
            deadline = time.monotonic() + max(wait, ACK_WAIT_SECONDS + 5)
            while scaler.clients > policy.minimum and time.monotonic() < deadline:
                await asyncio.sleep(POLL_SECONDS)
            await asyncio.sleep(2 * POLL_SECONDS)
    finally:
        stop.set()
        for task in (poller, validation):
            if task is not None:
                with contextlib.suppress(Exception):
                    await task
        await asyncio.to_thread(stack.scale, 0)
        with contextlib.suppress(Exception):
            await broker.delete_group(group)
        await broker.close()
    return status, validator.report()


def locust_totals(prefix: Path) -> dict[str, int]:
    """Requests and failures over the whole run, from Locust's JSON (exact, unlike the CSV)."""
    entries = orjson.loads(prefix.with_suffix(".json").read_bytes())
    return {
        "requests": sum(entry["num_requests"] for entry in entries),
        "failures": sum(entry["num_failures"] for entry in entries),
    }


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--broker-url", help="A running NATS broker [default: a private nats-server].")
@click.option(
    "--out",
    default="var/peak",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Folder for the picture, the CSVs, the verdict, Locust's output and the report.",
)
@click.option(
    "--clients",
    default=1,
    show_default=True,
    type=click.IntRange(1, 4),
    help="Clients (with --autoscale: the fewest).",
)
@click.option(
    "--autoscale/--no-autoscale",
    default=True,
    show_default=True,
    help="Let the autoscaler add clients (up to QC = 4) for the peak and remove them after.",
)
@click.option(
    "--work-ms",
    default=40.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Work per event in the clients' handler (a sleep in its threads): what makes a "
    "client too slow for the peak alone.",
)
@click.option("--handler", help="The clients' module:function handler instead (ignores --work-ms).")
@click.option(
    "--scale-high",
    default=50.0,
    show_default=True,
    type=float,
    help="Autoscale: add clients while the backlog per client is above this.",
)
@click.option(
    "--scale-low",
    default=5.0,
    show_default=True,
    type=float,
    help="Autoscale: remove one while it is below this.",
)
@click.option(
    "--high-age",
    default=2.0,
    show_default=True,
    type=float,
    help="Autoscale: add one while the oldest unprocessed event is older (s).",
)
@click.option(
    "--low-age",
    default=0.5,
    show_default=True,
    type=float,
    help="Autoscale: remove one only while the oldest is younger (s).",
)
@click.option(
    "--cooldown",
    default=3.0,
    show_default=True,
    type=float,
    help="Autoscale: seconds between two changes.",
)
@click.option(
    "--calm",
    default=5.0,
    show_default=True,
    type=float,
    help="Autoscale: seconds of low lag before a client is removed.",
)
@click.option(
    "--lag-limit",
    default=10.0,
    show_default=True,
    type=float,
    help="The verdict says 'kept up' while the oldest unprocessed event stays younger.",
)
@click.option("--users", "peak_users", default=20, show_default=True, type=click.IntRange(1))
@click.option("--user-rate", default=10.0, show_default=True, type=float, help="Events/s per user.")
@click.option("--ramp", "ramp_seconds", default=15.0, show_default=True, type=float)
@click.option("--hold", "hold_seconds", default=30.0, show_default=True, type=float)
@click.option("--json", "as_json", is_flag=True, help="Last stdout line: totals and report.")
def main(
    broker_url: str | None,
    out: str,
    clients: int,
    autoscale: bool,
    work_ms: float,
    handler: str | None,
    scale_high: float,
    scale_low: float,
    high_age: float,
    low_age: float,
    cooldown: float,
    calm: float,
    lag_limit: float,
    peak_users: int,
    user_rate: float,
    ramp_seconds: float,
    hold_seconds: float,
    as_json: bool,
) -> None:
    """Ramp Locust publishers up to a peak, hold it, ramp down; autoscale the clients on the
    lag; then picture and judge whether they kept up."""
    # Before any broker starts. Found, not imported: Locust runs in a child process, since
    # its gevent monkey-patching hangs this asyncio process.
    require_extra("locust", "matplotlib")
    policy = AutoscalePolicy(
        clients, 4 if autoscale else clients, scale_high, scale_low, high_age, low_age,
        cooldown, calm,
    )  # fmt: skip
    if problem := policy.problem():
        fail(f"autoscale: {problem}")
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    # The clients import the handler from here and read its work from the environment.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(HERE), os.environ.get("PYTHONPATH")])
    )
    os.environ["LBG_PEAK_WORK_MS"] = f"{work_ms:g}"

    def echo(line: str) -> None:
        click.echo(line, err=True)

    # The autoscaler's decisions and holds, as `lbg autoscale` would log them.
    decisions = logging.FileHandler(folder / "autoscale.log", mode="w")
    decisions.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    autoscale_log = logging.getLogger("lbg.admin.autoscale")
    autoscale_log.addHandler(decisions)
    autoscale_log.setLevel(logging.INFO)

    observed = Observed()
    with one_line_errors(), contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="lbg-peak-")))
        if broker_url is None:
            broker_url = stack.enter_context(EmbeddedNats(workdir / "nats"))
            echo(f"embedded nats-server at {broker_url}")
        run = PeakRun(
            broker_url, folder, policy, autoscale, work_ms, peak_users, user_rate, ramp_seconds,
            hold_seconds, lag_limit=lag_limit, handler=handler,
        )  # fmt: skip
        daemons = LocalStack(folder / "daemons")
        daemons.clear()
        status, report = uvloop.run(run_peak(run, daemons.folder, echo, observed))
        if not run.prefix.with_suffix(".json").exists():
            fail(f"locust wrote no results (status {status}); see {folder / 'locust.log'}")
    totals = locust_totals(run.prefix)
    rows = seconds(observed.samples, observed.handled, observed.start)
    judged = verdict(observed.samples, observed.handled, rows, observed.drained, lag_limit)
    write_csv(folder / f"{PREFIX}_seconds.csv", rows)
    title = (
        f"Peak of {peak_users} users x {user_rate:g} events/s, {work_ms:g} ms per event: "
        f"kept up {'yes' if judged.kept_up else 'NO'}"
    )
    plot(folder / f"{PREFIX}.png", rows, title)
    (folder / "verdict.txt").write_text(judged.to_text() + "\n")
    summary = {"locust": totals, "report": report.to_dict(), "verdict": asdict(judged)}
    (folder / "report.json").write_bytes(orjson.dumps(summary, option=orjson.OPT_INDENT_2))
    click.echo(report.to_text())
    click.echo(f"{'locust':<14}{totals['requests']} requests, {totals['failures']} failures")
    click.echo(judged.to_text())
    click.echo(f"{'results':<14}{folder}/ ({PREFIX}.png, {PREFIX}_seconds.csv, verdict.txt, "
               f"report.json, autoscale.log, locust.log, {PREFIX}_stats*.csv)")  # fmt: skip
    if as_json:
        click.echo(orjson.dumps(summary).decode())
    sys.exit(0 if report.ok and totals["failures"] == 0 and totals["requests"] > 0 else 1)


if __name__ == "__main__":
    main()
