"""lbg-replay: replay a dataset into a group with Spark; each key in order, acked rows counted."""

from __future__ import annotations

import sys

import click
import orjson

from lbg.cli.common import (
    CONTEXT,
    broker_option,
    config_option,
    fail,
    group_option,
    load,
    needs_extra,
    one_line_errors,
    quiet_option,
    settings_defaults,
    setup_logging,
    verbose_option,
    version_option,
)
from lbg.replay import DEFAULT_MASTER, FORMATS, KEY_COLUMN, ORDER_COLUMN
from lbg.settings import PublisherConfig


@settings_defaults(PublisherConfig)
@click.command(context_settings=CONTEXT)
@version_option("lbg-replay")
@click.argument("dataset")
@config_option
@broker_option
@group_option
@click.option("--key", "key_column", default=KEY_COLUMN, show_default=True, help="Key column.")
@click.option(
    "--order-by",
    "order_column",
    default=ORDER_COLUMN,
    show_default=True,
    help="Column giving each key's order (a sequence or a timestamp).",
)
@click.option(
    "--format",
    "input_format",
    type=click.Choice(FORMATS),
    default="auto",
    show_default=True,
    help="Input format; auto goes by the suffix (.csv, .json/.jsonl, else Parquet).",
)
@click.option(
    "--partitions",
    type=click.IntRange(0),
    default=0,
    show_default=False,
    help="Spark tasks (at most HC) [default: 2 x the master's cores].",
)
@click.option("--window", type=int, help="Most unacked publishes per task (one per key).")
@click.option(
    "--master",
    help=f"Spark master, e.g. local[4] or spark://host:7077 [default: spark-submit's, else "
    f"{DEFAULT_MASTER}].",
)
@click.option("--json", "as_json", is_flag=True, help="Print the totals as one JSON line.")
@verbose_option
@quiet_option
def main(
    dataset: str,
    config_path: str | None,
    broker_url: str | None,
    group_name: str | None,
    key_column: str,
    order_column: str,
    input_format: str,
    partitions: int,
    window: int | None,
    master: str | None,
    as_json: bool,
    verbose: int,
    quiet: bool,
) -> None:
    """Replay DATASET (Parquet, CSV or JSON lines; a path or a glob) into a group.

    Rows are partitioned by the group's bucket function (read from the broker), so each key
    stays in one Spark task, and sorted by the order column; each task publishes its rows
    through the hashed publisher with broker acks. A key's seq is its row's rank within the
    key, so a retried task repeats the same (key, seq): dropped by NATS and Message DB,
    duplicates elsewhere, never reorders. Exits 1 unless every row was acked.
    """
    setup_logging(verbose, quiet)
    overrides = {
        "broker.url": broker_url,
        "group.name": group_name,
        "publisher.window": window,
    }
    settings = load(config_path, PublisherConfig, overrides)
    with needs_extra():
        from lbg.replay.job import ReplayError, ReplayOptions, check_path, replay
        from lbg.replay.spark import spark_session
    options = ReplayOptions(
        path=dataset,
        key_column=key_column,
        order_column=order_column,
        input_format=input_format,
        partitions=partitions,
        window=settings.publisher.window,
    )
    echo = (lambda _line: None) if quiet else (lambda line: click.echo(line, err=True))
    with one_line_errors():
        try:
            check_path(dataset)
        except ReplayError as exc:
            fail(str(exc))
        spark = spark_session(master)
        try:
            result = replay(spark, settings.broker, settings.group.name, options, echo)
        except ReplayError as exc:
            fail(str(exc))
        finally:
            spark.stop()
    if as_json:
        click.echo(orjson.dumps(result.to_dict()).decode())
    sys.exit(1 if result.rejected else 0)


if __name__ == "__main__":
    main()
