"""lbg: the umbrella tool: hash keys, run the embedded broker, play the demo."""

from __future__ import annotations

import logging
import signal
import sys
import tempfile
from pathlib import Path

import click
import orjson

from lbg.cli.common import EXIT_USAGE, EXPECTED_ERRORS, fail, setup_logging
from lbg.hashing import HASH_FUNCTIONS, HashKeyError, bucket_for


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Tools around sticky load-balanced groups (the daemons are cg-admin, hashed-publisher,
    lbg-client and validation-client)."""


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
@click.option("--port", type=int, default=0, help="Client port [default: a free one].")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False),
    help="JetStream storage folder [default: a new temporary folder].",
)
def broker(port: int, host: str, data_dir: str | None) -> None:
    """Run the embedded NATS JetStream broker until Ctrl-C / SIGTERM; prints its URL."""
    from lbg.embedded import BrokerStartError, EmbeddedNats

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
@click.option("--broker-url", help="Run against this broker instead of the embedded one.")
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
@click.option(
    "--workdir",
    type=click.Path(file_okay=False),
    help="Where daemon logs and broker data go [default: a new temporary folder].",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Make the last line of stdout the final report as one JSON object.",
)
def demo(
    broker_url: str | None,
    duration: float,
    rate: float,
    keys: int,
    mode: str,
    cycle_seconds: float,
    workdir: str | None,
    as_json: bool,
) -> None:
    """Play the original scenario end to end and report: 2 clients -> kill -9 one -> restart
    it -> add a 3rd and a 4th -> (dynamic: stall one, wake it) -> scale down to 1 -> stop
    publishing -> drain.

    Starts the embedded NATS JetStream broker unless --broker-url is given. Exits 1 if any
    event was lost or reordered.
    """
    import uvloop

    from lbg.demo import DemoOptions, run_demo
    from lbg.embedded import BrokerStartError, EmbeddedNats

    folder = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="lbg-demo-"))
    folder.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(
        filename=folder / "demo.log",
        level=logging.INFO,
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
    )
    server = None
    if broker_url is None:
        server = EmbeddedNats(folder / "nats")
        try:
            broker_url = server.start()
        except BrokerStartError as exc:
            fail(str(exc))
        click.echo(f"embedded NATS JetStream broker at {broker_url}")
    options = DemoOptions(
        broker_url=broker_url,
        duration=duration,
        rate=rate,
        keys=keys,
        cycle_seconds=cycle_seconds,
        mode=mode,
    )
    try:
        report = uvloop.run(run_demo(options, folder / "daemons", click.echo))
    except EXPECTED_ERRORS as exc:
        fail(str(exc))
    finally:
        if server is not None:
            server.stop()
    click.echo("")
    click.echo(report.to_text())
    click.echo(f"logs: {folder}")
    if as_json:
        click.echo(orjson.dumps(report.to_dict() | {"ok": report.ok}).decode())
    sys.exit(0 if report.ok else 1)
