"""Spark replay rows/s at local[N] against the raw hashed publisher's rate, in the same run.

Both publish the same generated Black Friday rows, in the same order (event_seq, then key), to
their own fresh group on the same nats-server, with broker acks; no clients consume, so this
measures the publishing side only. Spark's start-up is not counted; its rate is over the whole
job (read, bucket, shuffle, sort, publish).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import click
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import uvloop

from lbg.broker import connect_broker
from lbg.devstack.embedded import EmbeddedNats
from lbg.model.group import GroupConfig
from lbg.publisher import HashedPublisher
from lbg.replay.dataset import KEY_COLUMN, ORDER_COLUMN, DatasetSpec, generate, write_dataset
from lbg.replay.job import ReplayOptions, replay
from lbg.replay.spark import spark_session
from lbg.settings import BrokerSettings

WINDOW = 1000


async def create_group(settings: BrokerSettings) -> str:
    """A fresh group with room for every row (no clients drain it)."""
    name = f"bench-{uuid.uuid4().hex[:6]}"
    broker = await connect_broker(settings, "bench-replay")
    try:
        config = GroupConfig(hash_prefix=name, hash_count=64, queue_count=4, queue_size_mb=1024)
        await broker.create_group(name, config)
    finally:
        await broker.close()
    return name


async def rows_in_order(table: pa.Table) -> Any:
    """(key, row as JSON) in the order the replay publishes them: order column, then key."""
    ordered = table.sort_by([(ORDER_COLUMN, "ascending"), (KEY_COLUMN, "ascending")])
    for batch in ordered.to_batches(max_chunksize=10_000):
        for row in batch.to_pylist():
            yield row[KEY_COLUMN], orjson.dumps(row)
        await asyncio.sleep(0)


async def raw_publisher(settings: BrokerSettings, table: pa.Table) -> dict[str, float]:
    """The hashed publisher alone, in this process: acked rows per second."""
    group = await create_group(settings)
    broker = await connect_broker(settings, "bench-raw")
    try:
        config = await broker.read_group(group)
        publisher = HashedPublisher(broker, group, config, "bench-raw", window=WINDOW)
        stats = await publisher.run(rows_in_order(table), progress_interval=float("inf"))
    finally:
        await broker.close()
    return {"acked": stats.acked, "seconds": stats.elapsed, "rate": stats.rate}


def spark_replay(settings: BrokerSettings, path: Path, master: str, partitions: int) -> dict:
    """The Spark replay of the same file: whole-job and publishing-only rates."""
    spark = spark_session(master)
    try:
        group = uvloop.run(create_group(settings))
        options = ReplayOptions(path=str(path), partitions=partitions, window=WINDOW)
        result = replay(
            spark, settings, group, options, echo=lambda line: print(line, file=sys.stderr)
        )
    finally:
        spark.stop()
    publishing = result.publish_seconds
    return {
        "acked": result.acked,
        "partitions": len(result.partitions),
        "seconds": result.elapsed,
        "rate": result.rate,
        "publish_seconds": publishing,
        "publish_rate": result.acked / publishing if publishing > 0 else 0.0,
    }


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--rows", default=200_000, show_default=True, type=int, help="Rows to replay.")
@click.option("--seed", default=1, show_default=True, type=int, help="Dataset seed.")
@click.option("--master", default="local[2]", show_default=True, help="Spark master.")
@click.option("--partitions", default=0, type=int, help="Spark tasks (0: 2 x cores).")
@click.option("--broker-url", help="A running NATS broker [default: a private nats-server].")
@click.option("--json", "as_json", is_flag=True, help="Last stdout line: every figure as JSON.")
def main(
    rows: int, seed: int, master: str, partitions: int, broker_url: str | None, as_json: bool
) -> None:
    """Measure the Spark replay against the raw hashed publisher on the same rows."""
    with contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="lbg-bench-")))
        started = time.monotonic()
        path = write_dataset(generate(DatasetSpec(rows=rows, seed=seed)), workdir / "bf.parquet")
        print(f"dataset: {rows} rows in {time.monotonic() - started:.1f} s", file=sys.stderr)
        url = broker_url or stack.enter_context(EmbeddedNats(workdir / "nats"))
        settings = BrokerSettings(url=url)
        raw = uvloop.run(raw_publisher(settings, pq.read_table(path)))
        print(f"raw publisher: {raw['rate']:.0f} rows/s", file=sys.stderr)
        spark = spark_replay(settings, path, master, partitions)
    ratio = spark["rate"] / raw["rate"] if raw["rate"] else 0.0
    click.echo(f"rows                      {rows}")
    click.echo(f"raw hashed publisher      {raw['rate']:8.0f} rows/s ({raw['seconds']:.1f} s)")
    click.echo(
        f"spark replay, whole job   {spark['rate']:8.0f} rows/s ({spark['seconds']:.1f} s, "
        f"{master}, {spark['partitions']} partitions)"
    )
    click.echo(
        f"spark replay, publishing  {spark['publish_rate']:8.0f} rows/s (first task start to "
        f"last task end, {spark['publish_seconds']:.1f} s)"
    )
    click.echo(f"replay / raw              {ratio:8.2f}")
    if as_json:
        click.echo(
            orjson.dumps({"rows": rows, "raw": raw, "spark": spark, "ratio": ratio}).decode()
        )


if __name__ == "__main__":
    main()
