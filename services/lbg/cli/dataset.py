"""lbg-dataset: write the sample Black Friday order events as Parquet, deterministic per seed."""

from __future__ import annotations

import time

import click

from lbg.cli.common import CONTEXT, fail, needs_extra, one_line_errors, version_option
from lbg.replay import KEY_COLUMN, ORDER_COLUMN

DEFAULT_PATH = "var/dataset/black_friday.parquet"


@click.command(context_settings=CONTEXT)
@version_option("lbg-dataset")
@click.option(
    "--output",
    "-o",
    default=DEFAULT_PATH,
    show_default=True,
    type=click.Path(dir_okay=False),
    help="Parquet file to write (folders are created).",
)
@click.option("--rows", default=200_000, show_default=True, type=int, help="Events to generate.")
@click.option(
    "--orders",
    default=0,
    show_default=False,
    type=int,
    help="Distinct orders (keys) [default: rows/20].",
)
@click.option(
    "--accounts",
    default=0,
    show_default=False,
    type=int,
    help="Accounts placing them [default: orders/4].",
)
@click.option("--skus", default=2_000, show_default=True, type=int, help="Distinct products.")
@click.option(
    "--skew",
    default=1.1,
    show_default=True,
    type=float,
    help="Zipf exponent of the hot orders, accounts and products (0: none hot).",
)
@click.option(
    "--hot-share",
    default=0.1,
    show_default=True,
    type=float,
    help="Share of quantity changes, orders and items that follow the Zipf weights.",
)
@click.option("--seed", default=0, show_default=True, type=int, help="Same seed, same file.")
def main(
    output: str,
    rows: int,
    orders: int,
    accounts: int,
    skus: int,
    skew: float,
    hot_share: float,
    seed: int,
) -> None:
    """Generate a storefront's Black Friday: orders created, quantities changed, paid, shipped
    and cancelled, with a few hot orders and accounts, in time order.

    Key column: order_id; per-key order column: event_seq (ts also works, unique over the file).
    """
    with needs_extra():
        from lbg.replay.dataset import DatasetError, DatasetSpec, generate, write_dataset
    spec = DatasetSpec(rows, orders, accounts, skus, skew, hot_share, seed)
    with one_line_errors():
        started = time.monotonic()
        try:
            table = generate(spec)
        except DatasetError as exc:
            fail(f"--{exc}")
        path = write_dataset(table, output)
        click.echo(
            f"wrote {table.num_rows} events of {spec.order_count} orders to {path} "
            f"(key {KEY_COLUMN}, order {ORDER_COLUMN}; {time.monotonic() - started:.1f} s)"
        )
