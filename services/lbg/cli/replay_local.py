"""`python -m lbg.cli.replay_local` (make replay): replay a dataset end to end and report."""

from __future__ import annotations

import contextlib
import sys
import tempfile
from pathlib import Path

import click
import orjson
import uvloop

from lbg.cli.common import (
    CONTEXT,
    fail,
    needs_extra,
    one_line_errors,
    quiet_option,
    setup_logging,
    verbose_option,
    version_option,
)
from lbg.cli.dataset import DEFAULT_PATH
from lbg.devstack.embedded import EmbeddedNats
from lbg.replay import FORMATS, KEY_COLUMN, ORDER_COLUMN


@click.command(context_settings=CONTEXT)
@version_option("lbg replay-local")
@click.argument("dataset", default=DEFAULT_PATH)
@click.option("--broker-url", help="A running NATS broker [default: a private nats-server].")
@click.option("--clients", default=2, show_default=True, type=click.IntRange(1), help="Clients.")
@click.option("--key", "key_column", default=KEY_COLUMN, show_default=True, help="Key column.")
@click.option(
    "--order-by", "order_column", default=ORDER_COLUMN, show_default=True, help="Order column."
)
@click.option("--format", "input_format", type=click.Choice(FORMATS), default="auto")
@click.option("--partitions", type=click.IntRange(0), default=0, help="Spark tasks (0: auto).")
@click.option("--master", help="Spark master [default: local[2]].")
@click.option("--json", "as_json", is_flag=True, help="Last stdout line: the report as JSON.")
@verbose_option
@quiet_option
def main(
    dataset: str,
    broker_url: str | None,
    clients: int,
    key_column: str,
    order_column: str,
    input_format: str,
    partitions: int,
    master: str | None,
    as_json: bool,
    verbose: int,
    quiet: bool,
) -> None:
    """Replay DATASET with Spark into a fresh group while clients and the validator run.

    Prints the validator's report (lost, reordered, duplicates, ...); exits 1 unless every
    row was acked and nothing was lost or reordered. Make the dataset with `make dataset`.
    """
    setup_logging(verbose, quiet)
    with needs_extra():
        from lbg.devstack.replay import LocalReplay, run_local_replay
        from lbg.replay.job import ReplayError, ReplayOptions
    options = ReplayOptions(
        path=dataset,
        key_column=key_column,
        order_column=order_column,
        input_format=input_format,
        partitions=partitions,
    )
    with one_line_errors(), contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="lbg-replay-")))
        if broker_url is None:
            broker_url = stack.enter_context(EmbeddedNats(workdir / "nats"))
            click.echo(f"embedded nats-server at {broker_url}", err=True)
        run = LocalReplay(broker_url, options, master=master, clients=clients)
        try:
            result, report = uvloop.run(
                run_local_replay(run, workdir / "daemons", lambda line: click.echo(line, err=True))
            )
        except ReplayError as exc:
            fail(str(exc))
    click.echo(report.to_text())
    click.echo(f"{'replayed':<14}{result.acked} of {result.rows} rows acked, {result.rate:.0f}/s")
    if as_json:
        click.echo(orjson.dumps({"replay": result.to_dict(), "report": report.to_dict()}).decode())
    sys.exit(0 if report.ok and result.rejected == 0 else 1)


if __name__ == "__main__":
    main()
