"""`make peak`: a headless Locust peak against a group with clients and the validator running.

A private nats-server (or --broker-url), a fresh group, N lbg-client processes, the validator
in this process, and Locust (loadtest/locustfile.py) as a child process. Afterwards: Locust's
CSV and JSON, a PNG of rate, latency and users over time, and the validator's report, all in
--out (var/peak/ by default). Exits 1 if a request failed, or anything was lost or reordered.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import orjson
import uvloop

from lbg.broker import connect_broker
from lbg.cli.common import fail, one_line_errors, require_extra
from lbg.devstack.embedded import EmbeddedNats
from lbg.devstack.scaling import AutoscalePolicy, LocalStack, StackState, autoscale
from lbg.model.group import GroupConfig
from lbg.model.sequence import Report
from lbg.settings import BrokerSettings
from lbg.validator import Validator, run_validator, wait_until_complete

LOCUSTFILE = Path(__file__).with_name("locustfile.py")
PREFIX = "peak"
ACK_WAIT_SECONDS = 30.0


@dataclass(frozen=True)
class PeakRun:
    """One peak: the broker, the group's shape, the clients and the Locust profile."""

    broker_url: str
    out: Path
    clients: int = 2
    peak_users: int = 50
    user_rate: float = 20.0
    ramp_seconds: float = 20.0
    hold_seconds: float = 30.0
    drain_timeout: float = 60.0
    autoscale: AutoscalePolicy | None = None
    handler: str | None = None

    @property
    def prefix(self) -> Path:
        return self.out / PREFIX


def locust_command(run: PeakRun, group: str) -> list[str]:
    """Locust headless with the peak shape; CSV (with history) and JSON under run.out."""
    return [
        sys.executable,
        "-m",
        "locust",
        *("-f", str(LOCUSTFILE), "--headless", "--only-summary"),
        *("--csv", str(run.prefix), "--csv-full-history", "--json-file", str(run.prefix)),
        *("--broker-url", run.broker_url, "--group", group),
        *("--peak-users", str(run.peak_users), "--user-rate", str(run.user_rate)),
        *("--ramp-seconds", str(run.ramp_seconds), "--hold-seconds", str(run.hold_seconds)),
        *("--stop-timeout", "5", "--loglevel", "WARNING"),
    ]


async def _count_clients(
    stack: LocalStack, timeline: list[tuple[float, int]], stop: asyncio.Event
) -> None:
    """Note the number of running clients twice a second, for the plot and the report."""
    while not stop.is_set():
        timeline.append((time.time(), len(stack.running_clients(stack.load()))))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.5)


async def run_peak(
    run: PeakRun, workdir: Path, echo: Any, timeline: list[tuple[float, int]]
) -> tuple[int, Report]:
    """Run the peak against a fresh group; Locust's exit status and the validator's report.

    The clients run as a local stack: `run.clients` of them, or, with an autoscale policy,
    as many as the autoscaler decides from the backlog, starting from its minimum.
    """
    group = f"peak-{uuid.uuid4().hex[:6]}"
    config = GroupConfig(hash_prefix=group, hash_count=64, queue_count=4, queue_size_mb=512)
    broker = await connect_broker(BrokerSettings(url=run.broker_url), "lbg-peak")
    stack = LocalStack(workdir)
    handler = ["--handler", run.handler] if run.handler else []
    stack.save(StackState(broker_url=run.broker_url, group=group, client_args=handler))
    validator = Validator()
    stop = asyncio.Event()
    validation: asyncio.Task[Report] | None = None
    helpers: list[asyncio.Task[None]] = []
    try:
        await broker.create_group(group, config)
        echo(f"group '{group}' created: {config.to_json()}")
        validation = asyncio.create_task(
            run_validator(broker, group, validator, stop, progress_interval=0)
        )
        policy = run.autoscale
        await asyncio.to_thread(stack.scale, policy.minimum if policy else run.clients)
        helpers.append(asyncio.create_task(_count_clients(stack, timeline, stop)))
        if policy is not None:
            echo(f"autoscale: {policy.minimum}-{policy.maximum} clients from the backlog")
            helpers.append(
                asyncio.create_task(autoscale(broker, group, config, stack, policy, stop, 0.5))
            )
        total = 2 * run.ramp_seconds + run.hold_seconds
        echo(f"locust: peak of {run.peak_users} users x {run.user_rate:g} events/s, {total:g} s")
        with (run.out / "locust.log").open("wb") as log:
            locust = await asyncio.create_subprocess_exec(
                *locust_command(run, group), stdout=log, stderr=asyncio.subprocess.STDOUT
            )
            status = await locust.wait()
        echo(f"locust exited with status {status}; drain")
        drained = await wait_until_complete(validator, run.drain_timeout)
        echo("drained" if drained else f"drain timed out: {validator.progress_line()}")
        if policy is not None:
            echo("waiting for the autoscaler to scale back down")
            steps = policy.maximum - policy.minimum + 1
            # Deliveries a scale-up left unacked count as backlog until redelivered (NATS: 30 s).
            deadline = time.monotonic() + max(steps * (policy.cooldown + 2), ACK_WAIT_SECONDS + 5)
            while timeline[-1][1] > policy.minimum and time.monotonic() < deadline:
                await asyncio.sleep(0.5)
    finally:
        stop.set()
        for helper in helpers:
            with contextlib.suppress(Exception):
                await helper
        if validation is not None:
            with contextlib.suppress(Exception):
                await validation
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


def plot(prefix: Path, clients: list[tuple[float, int]]) -> Path:
    """A PNG of request rate, latency (p50, p95, p99), active users and clients over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with Path(f"{prefix}_stats_history.csv").open(newline="") as handle:
        rows = [row for row in csv.DictReader(handle) if row["Name"] == "Aggregated"]
    if not rows:
        raise ValueError(f"{prefix}_stats_history.csv: no Aggregated rows to plot")
    start = int(rows[0]["Timestamp"])
    seconds = [int(row["Timestamp"]) - start for row in rows]

    def series(column: str) -> list[float]:
        return [float(row[column]) if row[column] not in ("", "N/A") else 0.0 for row in rows]

    def per_second(column: str) -> list[float]:
        totals = series(column)
        steps = zip(seconds, seconds[1:], totals, totals[1:], strict=False)
        return [0.0] + [(now - then) / max(t1 - t0, 1) for t0, t1, then, now in steps]

    figure, (rate, latency, users) = plt.subplots(3, 1, sharex=True, figsize=(9, 8))
    rate.plot(seconds, per_second("Total Request Count"), label="acked events/s")
    rate.plot(seconds, per_second("Total Failure Count"), label="failures/s")
    rate.set_ylabel("events/s")
    rate.legend(loc="upper right")
    for percentile in ("50%", "95%", "99%"):
        latency.plot(seconds, series(percentile), label=f"p{percentile[:-1]}")
    latency.set_ylabel("publish-to-ack ms\n(last 10 s)")
    latency.legend(loc="upper right")
    users.plot(seconds, series("User Count"), color="tab:green", label="Locust users")
    users.set_ylabel("active users")
    counts = users.twinx()
    counts.step(
        [at - start for at, _ in clients], [n for _, n in clients], where="post",
        color="tab:purple", label="lbg-clients",
    )  # fmt: skip
    counts.set_ylabel("lbg-clients")
    counts.set_ylim(0, max((n for _, n in clients), default=1) + 1)
    users.legend(loc="upper left")
    counts.legend(loc="upper right")
    users.set_xlabel("seconds")
    figure.suptitle("Locust peak: publish to a sticky LBG group")
    figure.tight_layout()
    path = Path(f"{prefix}.png")
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--broker-url", help="A running NATS broker [default: a private nats-server].")
@click.option(
    "--out",
    default="var/peak",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Folder for Locust's CSV/JSON, the plot and the report.",
)
@click.option(
    "--clients",
    default=1,
    show_default=True,
    type=click.IntRange(1),
    help="Clients (with --autoscale: the fewest).",
)
@click.option(
    "--autoscale/--no-autoscale",
    default=True,
    show_default=True,
    help="Let lbg autoscale add clients (up to QC = 4) for the peak and remove them after.",
)
@click.option("--handler", help="The clients' module:function handler [default: republish].")
@click.option(
    "--scale-high",
    default=20.0,
    show_default=True,
    type=float,
    help="Autoscale: add a client while the backlog per client is above this.",
)
@click.option(
    "--scale-low",
    default=2.0,
    show_default=True,
    type=float,
    help="Autoscale: remove one while it is below this.",
)
@click.option(
    "--cooldown",
    default=3.0,
    show_default=True,
    type=float,
    help="Autoscale: seconds between two changes.",
)
@click.option("--users", "peak_users", default=50, show_default=True, type=click.IntRange(1))
@click.option("--user-rate", default=20.0, show_default=True, type=float, help="Events/s per user.")
@click.option("--ramp", "ramp_seconds", default=20.0, show_default=True, type=float)
@click.option("--hold", "hold_seconds", default=30.0, show_default=True, type=float)
@click.option("--json", "as_json", is_flag=True, help="Last stdout line: totals and report.")
def main(
    broker_url: str | None,
    out: str,
    clients: int,
    autoscale: bool,
    scale_high: float,
    scale_low: float,
    cooldown: float,
    handler: str | None,
    peak_users: int,
    user_rate: float,
    ramp_seconds: float,
    hold_seconds: float,
    as_json: bool,
) -> None:
    """Ramp Locust publishers up to a peak, hold it, ramp down; then report what arrived."""
    # Before any broker starts. Found, not imported: Locust runs in a child process, since
    # its gevent monkey-patching hangs this asyncio process.
    require_extra("locust", "matplotlib")
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)

    def echo(line: str) -> None:
        click.echo(line, err=True)

    with one_line_errors(), contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="lbg-peak-")))
        if broker_url is None:
            broker_url = stack.enter_context(EmbeddedNats(workdir / "nats"))
            echo(f"embedded nats-server at {broker_url}")
        policy = AutoscalePolicy(clients, 4, scale_high, scale_low, cooldown) if autoscale else None
        run = PeakRun(
            broker_url, folder, clients, peak_users, user_rate, ramp_seconds, hold_seconds,
            autoscale=policy,
            handler=handler,
        )  # fmt: skip
        timeline: list[tuple[float, int]] = []
        status, report = uvloop.run(run_peak(run, workdir / "daemons", echo, timeline))
        if not run.prefix.with_suffix(".json").exists():
            fail(f"locust wrote no results (status {status}); see {folder / 'locust.log'}")
        totals = locust_totals(run.prefix)
        png = plot(run.prefix, timeline)
    counts = [n for _, n in timeline]
    scaling = {"min": min(counts, default=0), "max": max(counts, default=0), "last": counts[-1]}
    summary = {"locust": totals, "report": report.to_dict(), "clients": scaling}
    (folder / "report.json").write_bytes(orjson.dumps(summary, option=orjson.OPT_INDENT_2))
    click.echo(report.to_text())
    click.echo(f"{'locust':<14}{totals['requests']} requests, {totals['failures']} failures")
    click.echo(f"{'clients':<14}{scaling['min']} to {scaling['max']}, {scaling['last']} at the end")
    click.echo(f"{'results':<14}{folder}/ ({png.name}, {PREFIX}_stats*.csv, {PREFIX}.json)")
    if as_json:
        click.echo(orjson.dumps(summary).decode())
    sys.exit(0 if report.ok and totals["failures"] == 0 and totals["requests"] > 0 else 1)


if __name__ == "__main__":
    main()
