"""Spark replay rows/s at local[N] and on a standalone cluster against the raw hashed
publisher's rate, in the same run.

All publish the same generated Black Friday rows, in the same order (event_seq, then key), to
their own fresh group on the same nats-server, with broker acks; no clients consume, so this
measures the publishing side only. Spark's start-up is not counted; its rate is over the whole
job (read, bucket, shuffle, sort, publish). The per-task rate (a task's rows over its own
publishing time, averaged) is what to hold against the raw publisher: a task is one publisher,
so Spark is not the limit when the two are close.
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
from lbg.devstack.spark_cluster import spark_cluster
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
    tasks = [p.acked / p.seconds for p in result.partitions if p.seconds > 0 and p.acked]
    return {
        "master": master,
        "task_rate": sum(tasks) / len(tasks) if tasks else 0.0,
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
@click.option("--cluster-workers", default=2, show_default=True, type=click.IntRange(min=0),
              help="Also replay on a local standalone cluster of this many 1-core workers "
              "(0: skip).")  # fmt: skip
@click.option("--broker-url", help="A running NATS broker [default: a private nats-server].")
@click.option("--json", "as_json", is_flag=True, help="Last stdout line: every figure as JSON.")
def main(
    rows: int,
    seed: int,
    master: str,
    partitions: int,
    cluster_workers: int,
    broker_url: str | None,
    as_json: bool,
) -> None:
    """Measure the Spark replay (local and on a cluster) against the raw hashed publisher on the
    same rows."""
    with contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="lbg-bench-")))
        started = time.monotonic()
        path = write_dataset(generate(DatasetSpec(rows=rows, seed=seed)), workdir / "bf.parquet")
        print(f"dataset: {rows} rows in {time.monotonic() - started:.1f} s", file=sys.stderr)
        url = broker_url or stack.enter_context(EmbeddedNats(workdir / "nats"))
        settings = BrokerSettings(url=url)
        raw = uvloop.run(raw_publisher(settings, pq.read_table(path)))
        print(f"raw publisher: {raw['rate']:.0f} rows/s", file=sys.stderr)
        runs = [spark_replay(settings, path, master, partitions)]
        if cluster_workers:
            cluster = stack.enter_context(spark_cluster(workdir / "spark", cluster_workers))
            runs.append(spark_replay(settings, path, cluster.master_url, partitions))
    click.echo(f"rows                      {rows}")
    click.echo(f"raw hashed publisher      {raw['rate']:8.0f} rows/s ({raw['seconds']:.1f} s)")
    for run in runs:
        show(run, raw["rate"])
    if as_json:
        ratios = {run["master"]: run["task_rate"] / raw["rate"] for run in runs if raw["rate"]}
        click.echo(
            orjson.dumps({"rows": rows, "raw": raw, "spark": runs, "ratio": ratios}).decode()
        )


def show(run: dict, raw_rate: float) -> None:
    """One Spark run's figures beside the raw publisher's."""
    click.echo(f"spark on {run['master']} ({run['partitions']} partitions)")
    click.echo(f"  whole job               {run['rate']:8.0f} rows/s ({run['seconds']:.1f} s)")
    click.echo(
        f"  publishing              {run['publish_rate']:8.0f} rows/s (first task start to "
        f"last task end, {run['publish_seconds']:.1f} s)"
    )
    click.echo(f"  per task                {run['task_rate']:8.0f} rows/s")
    ratio = run["task_rate"] / raw_rate if raw_rate else 0.0
    click.echo(f"  per task / raw          {ratio:8.2f}")


if __name__ == "__main__":
    main()
