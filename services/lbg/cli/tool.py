"""lbg: the umbrella tool: hash keys, run the embedded broker, play the demo, and the operator
commands on a running group (status, route, move)."""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import click
import orjson

from lbg.cli.common import (
    CONTEXT,
    EXIT_FAILURE,
    EXIT_USAGE,
    EXPECTED_ERRORS,
    admin_url_option,
    broker_option,
    config_option,
    fail,
    group_option,
    load,
    print_verdict,
    run_folder,
    run_with_broker,
    setup_logging,
    verbose_option,
    version_option,
    workdir_option,
)
from lbg.cli.local import autoscale, local
from lbg.cli.parking import parked, unpark
from lbg.cli.soak import soak
from lbg.cli.spark_cluster import spark_cluster
from lbg.devstack.brokers import LOCAL_BROKERS
from lbg.model.hashing import HASH_FUNCTIONS, HashKeyError, bucket_for
from lbg.settings import ClientConfig, ConfigError, PublisherConfig, ValidatorConfig, load_config


@click.group(context_settings=CONTEXT)
@version_option("lbg")
def main() -> None:
    """Tools around sticky load-balanced groups (the daemons are cg-admin, hashed-publisher,
    lbg-client and validation-client): status, route and move operate a running group."""


@main.command(name="hash")
@click.option(
    "--function",
    "function",
    type=click.Choice(sorted(HASH_FUNCTIONS)),
    default="java",
    show_default=True,
    help="java: the original publisher; murmur2: Kafka's partitioner; messagedb: Message DB.",
)
@click.option("--buckets", type=click.IntRange(min=1), required=True, help="Bucket count (HC).")
@click.argument("keys", nargs=-1, required=True)
def hash_keys(function: str, buckets: int, keys: tuple[str, ...]) -> None:
    """Print the bucket of each KEY: one line per key, the bucket, a tab, the key."""
    for key in keys:
        try:
            click.echo(f"{bucket_for(function, key, buckets)}\t{key}")
        except HashKeyError as exc:
            fail(str(exc), EXIT_USAGE)


@main.command()
@click.option(
    "--port", type=int, default=0, show_default=False, help="Client port [default: a free one]."
)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False),
    help="JetStream storage folder [default: a new temporary folder].",
)
def broker(port: int, host: str, data_dir: str | None) -> None:
    """Run the embedded NATS JetStream broker until Ctrl-C / SIGTERM; prints its URL."""
    from lbg.devstack.embedded import BrokerStartError, EmbeddedNats

    setup_logging()
    folder = Path(data_dir) if data_dir else Path(tempfile.mkdtemp(prefix="lbg-nats-"))
    server = EmbeddedNats(folder, port=port, host=host)
    try:
        url = server.start()
    except BrokerStartError as exc:
        fail(str(exc))
    click.echo(url)
    click.echo(f"JetStream data in {folder}; Ctrl-C stops", err=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        signal.pause()
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        server.stop()


@main.command()
@click.option(
    "--broker",
    "broker_kind",
    type=click.Choice(LOCAL_BROKERS),
    default="nats",
    show_default=True,
    help="Which broker to start privately for the run (on free ports, under --workdir).",
)
@click.option("--broker-url", help="Run against this broker instead of starting one.")
@admin_url_option
@click.option(
    "--duration",
    type=click.FloatRange(min=5),
    default=60.0,
    show_default=True,
    help="Seconds of publishing, split over the five phases.",
)
@click.option(
    "--rate",
    type=click.FloatRange(min=1),
    default=500.0,
    show_default=True,
    help="Events per second.",
)
@click.option(
    "--keys",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="Number of keys (UUID/UUID topics, as the original test).",
)
@click.option(
    "--mode",
    type=click.Choice(["dynamic", "static"]),
    default="dynamic",
    show_default=True,
    help="dynamic: clients join by themselves; static: the original index and count.",
)
@click.option(
    "--cycle-seconds",
    type=click.FloatRange(min=0.5),
    default=5.0,
    show_default=True,
    help="How often clients release secondary queues (the original used 30-60 s).",
)
@workdir_option
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Make the last line of stdout the final report as one JSON object.",
)
@click.option(
    "--web-port",
    type=click.IntRange(0, 65535),
    default=0,
    help="Serve the live view (who serves which queue, handovers, counts) on this port.",
)
def demo(
    broker_kind: str,
    broker_url: str | None,
    admin_url: str | None,
    duration: float,
    rate: float,
    keys: int,
    mode: str,
    cycle_seconds: float,
    workdir: str | None,
    as_json: bool,
    web_port: int,
) -> None:
    """Play the original scenario end to end and report: 2 clients -> kill -9 one -> restart
    it -> add a 3rd and a 4th -> (dynamic: stall one, wake it) -> scale down to 1 -> stop
    publishing -> drain.

    Starts a private broker (embedded NATS JetStream by default, RabbitMQ from Debian's
    package with --broker rabbitmq, or Message DB on a private PostgreSQL with --broker
    messagedb) unless --broker-url is given. Exits 1 if any event was lost or reordered.
    """
    import uvloop

    from lbg.devstack.brokers import BrokerEndpoint, local_broker
    from lbg.devstack.demo import DemoOptions, run_demo
    from lbg.devstack.embedded import BrokerStartError

    folder = run_folder(workdir, "demo")
    with contextlib.ExitStack() as stack:
        if broker_url is None:
            try:
                endpoint = stack.enter_context(local_broker(broker_kind, folder))
            except BrokerStartError as exc:
                fail(str(exc))
            click.echo(f"private {broker_kind} broker at {endpoint.url}")
        else:
            endpoint = BrokerEndpoint(broker_kind, broker_url, admin_url)
        options = DemoOptions(
            broker_url=endpoint.url,
            admin_url=endpoint.admin_url,
            duration=duration,
            rate=rate,
            keys=keys,
            cycle_seconds=cycle_seconds,
            mode=mode,
            web_port=web_port,
        )
        try:
            report = uvloop.run(run_demo(options, folder / "daemons", click.echo))
        except EXPECTED_ERRORS as exc:
            fail(str(exc))
    document = report.to_dict() | {"ok": report.ok} if as_json else None
    print_verdict(report.to_text(), folder, document, report.ok)


# ---------------------------------------------------------------------------------------------
# Operator commands: they listen to the group's control channel like a member, and never join.

DEFAULT_LISTEN = 0.5


def _operator_options(command):
    options = [
        config_option,
        broker_option,
        admin_url_option,
        group_option,
        click.option(
            "--listen",
            type=click.FloatRange(min=0.05),
            help=f"Seconds to listen for heartbeats [default: {DEFAULT_LISTEN}, or 3 heartbeat "
            "intervals if the config's [client] heartbeat_interval, or its broker's default "
            "(0.25 s on RabbitMQ), makes that longer].",
        ),
        click.option("--json", "as_json", is_flag=True, help="Print one JSON document."),
        verbose_option,
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _operator_settings(
    config_path: str | None,
    broker_url: str | None,
    admin_url: str | None,
    group_name: str | None,
    listen: float | None,
):
    from lbg.admin.status import OperatorConfig

    overrides = {"broker.url": broker_url, "broker.admin_url": admin_url, "group.name": group_name}
    settings = load(config_path, OperatorConfig, overrides)
    if listen is None:
        listen = max(DEFAULT_LISTEN, 3 * settings.heartbeat_interval)
    return settings, listen


@main.command()
@click.argument("port", type=click.IntRange(1, 65535), required=False)
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    help="Take the port and address from this daemon config's [metrics] table instead.",
)
@click.option("--host", default="127.0.0.1", help="Where the daemon serves its metrics.")
@click.option(
    "--path",
    type=click.Choice(["/readyz", "/healthz"]),
    default="/readyz",
    help="/readyz: broker connected and group bound; /healthz: the event loop answers.",
)
@click.option(
    "--wait", type=click.FloatRange(min=0), default=0.0, help="Seconds to keep asking (0: once)."
)
def probe(port: int | None, config_path: str | None, host: str, path: str, wait: float) -> None:
    """Ask a daemon's /readyz (or /healthz) on its metrics PORT; exit 0 once it answers 200,
    else 1 with one line saying why (systemd's ExecStartPost, container health checks)."""
    if config_path is not None:
        port, address = _metrics_of(config_path)
        host = host if address in ("0.0.0.0", "::") else address
    if not port:
        fail("give the metrics PORT, or --config of a daemon whose [metrics] port is set", 2)
    url = f"http://{host}:{port}{path}"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    deadline = time.monotonic() + wait
    while True:
        try:
            with opener.open(url, timeout=3):
                return
        except urllib.error.HTTPError as exc:
            reason = f"{exc.code} {exc.read().decode(errors='replace').strip()}"
        except OSError as exc:
            reason = str(getattr(exc, "reason", None) or exc)
        if time.monotonic() + 0.5 > deadline:
            fail(f"{url}: {reason}")
        time.sleep(0.5)


def _metrics_of(config_path: str) -> tuple[int, str]:
    """The [metrics] port and address of any daemon's config file (one-line error if bad)."""
    errors = []
    for schema in (ClientConfig, PublisherConfig, ValidatorConfig):
        try:
            metrics = load_config(config_path, schema).metrics
        except ConfigError as exc:
            errors.append(str(exc))
            continue
        return metrics.port, metrics.address
    fail(errors[0], EXIT_USAGE)


def _print_json(document: object) -> None:
    sys.stdout.write(orjson.dumps(document).decode() + "\n")


@main.command()
@_operator_options
def status(
    config_path: str | None,
    broker_url: str | None,
    admin_url: str | None,
    group_name: str | None,
    listen: float | None,
    as_json: bool,
    verbose: int,
) -> None:
    """Show a running group: its members (active / leaving / stalled) and, per queue, its
    buckets, backlog, in-flight messages, the member serving it and the member it is assigned
    to. Notes: moving (they differ), draining (its server is leaving or stalled), unserved
    (nobody serves it but it has messages), idle (nobody serves it and it is empty: the broker
    pins a consumer only on delivery), pinned (by lbg move).

    Listens to the members' heartbeats for --listen seconds. For a static-mode group (no
    heartbeats) the serving client is the broker's active consumer.
    """
    from lbg.admin.status import read_status

    setup_logging(verbose, quiet=not verbose)
    settings, seconds = _operator_settings(config_path, broker_url, admin_url, group_name, listen)

    async def action(broker) -> int:
        group_status = await read_status(broker, settings.group.name, seconds)
        if as_json:
            _print_json(group_status.to_dict())
        else:
            click.echo(group_status.to_text())
        return 0

    run_with_broker(settings, action)


@main.command()
@_operator_options
@click.argument("keys", nargs=-1, required=True)
def route(
    config_path: str | None,
    broker_url: str | None,
    admin_url: str | None,
    group_name: str | None,
    listen: float | None,
    as_json: bool,
    verbose: int,
    keys: tuple[str, ...],
) -> None:
    """Where each KEY goes in a running group: one line per key, tab-separated: key, bucket
    (the group's hash function), queue, and the member serving that queue now ('-': none)."""
    from lbg.admin.status import read_status, routes
    from lbg.model.messages import MalformedMessage, check_key

    setup_logging(verbose, quiet=not verbose)
    settings, seconds = _operator_settings(config_path, broker_url, admin_url, group_name, listen)
    for key in keys:
        try:
            check_key(key)
        except MalformedMessage as exc:
            fail(f"key {key!r}: {exc}", EXIT_USAGE)

    async def action(broker) -> int:
        group_status = await read_status(broker, settings.group.name, seconds)
        try:
            found = routes(group_status, keys)
        except HashKeyError as exc:
            fail(str(exc), EXIT_USAGE)
        if as_json:
            _print_json([dataclasses.asdict(r) for r in found])
            return 0
        for r in found:
            click.echo(f"{r.key}\t{r.bucket}\t{r.queue}\t{r.owner or '-'}")
        return 0

    run_with_broker(settings, action)


@main.command()
@_operator_options
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    default=10.0,
    show_default=True,
    help="Seconds to wait for the member to serve the queue; exit 1 after that.",
)
@click.argument("queue", type=int)
@click.argument("client")
def move(
    config_path: str | None,
    broker_url: str | None,
    admin_url: str | None,
    group_name: str | None,
    listen: float | None,
    as_json: bool,
    verbose: int,
    timeout: float,
    queue: int,
    client: str,
) -> None:
    """Move QUEUE to the member CLIENT of a dynamic group: a planned handover (the current
    server finishes and acks what it has, then releases the queue to CLIENT).

    The queue stays pinned to CLIENT while it is alive and active (the other queues are
    rebalanced around it); the pin ends when CLIENT leaves or dies. Waits until CLIENT's
    heartbeats say it serves the queue and prints how long that took.
    """
    from lbg.admin.move import MoveRefused, move_queue

    setup_logging(verbose, quiet=not verbose)
    settings, seconds = _operator_settings(config_path, broker_url, admin_url, group_name, listen)

    async def action(broker) -> int:
        try:
            result = await move_queue(broker, settings.group.name, queue, client, seconds, timeout)
        except MoveRefused as exc:
            fail(str(exc), EXIT_USAGE)
        if as_json:
            _print_json(result.to_dict())
        if not result.done:
            fail(
                f"queue {queue} not served by {client} after {timeout:g}s "
                f"(serving now: {result.now or 'nobody'})",
                EXIT_FAILURE,
            )
        if not as_json:
            if result.was == client:
                click.echo(f"queue {queue}: already served by {client}; now pinned there")
            elif result.idle:
                click.echo(
                    f"queue {queue}: {result.was or 'nobody'} -> {client} in "
                    f"{result.seconds:.2f}s (empty: {client} takes its next message)"
                )
            else:
                click.echo(
                    f"queue {queue}: {result.was or 'nobody'} -> {client} in {result.seconds:.2f}s"
                )
        return 0

    run_with_broker(settings, action)


main.add_command(parked)
main.add_command(unpark)
main.add_command(local)
main.add_command(spark_cluster)
main.add_command(autoscale)
main.add_command(soak)
