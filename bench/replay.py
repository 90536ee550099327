"""Spark replay rows/s at local[N] and on a standalone cluster against the raw hashed
publisher's rate, in the same run.

All publish the same generated Black Friday rows, in the same order (event_seq, then key), to
their own fresh group on the same nats-server, with broker acks; no clients consume, so this
measures the publishing side only. Spark's start-up is not counted; its rate is over the whole
job (read, bucket, shuffle, sort, publish). The per-task rate (a task's rows over its own
publishing time, averaged) is what to hold against the raw publisher: a task is one publisher,
so Spark is not the limit when the two are close. Spark runs tasks side by side (one per core
at local[N], one per worker on the cluster), so the raw publisher is also run as that many
processes at once, each over its own share of the keys: per task against that rate is Spark's
own cost, with the machine's cores shared the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import sys
import tempfile
import time
import uuid
from concurrent.futures import ProcessPoolExecutor
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


async def raw_share(settings: BrokerSettings, group: str, path: Path, share: int, shares: int):
    """One of `shares` raw publishers side by side: the rows whose bucket is `share` mod
    `shares` (as Spark splits them), acked rows per second."""
    broker = await connect_broker(settings, f"bench-raw-{share}")
    try:
        config = await broker.read_group(group)
        table = pq.read_table(path)
        mine = [
            config.bucket_for_key(key) % shares == share
            for key in table.column(KEY_COLUMN).to_pylist()
        ]
        rows = rows_in_order(table.filter(pa.array(mine)))
        publisher = HashedPublisher(broker, group, config, f"bench-raw-{share}", window=WINDOW)
        stats = await publisher.run(rows, progress_interval=float("inf"))
    finally:
        await broker.close()
    return stats.rate


def run_raw_share(url: str, group: str, path: Path, share: int, shares: int) -> float:
    """`raw_share` in a process of its own."""
    return uvloop.run(raw_share(BrokerSettings(url=url), group, path, share, shares))


def raw_side_by_side(settings: BrokerSettings, path: Path, shares: int) -> dict[str, float]:
    """`shares` raw publisher processes at once: the mean of their rates (per publisher)."""
    group = uvloop.run(create_group(settings))
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(shares, mp_context=context) as pool:
        futures = [
            pool.submit(run_raw_share, settings.url, group, path, share, shares)
            for share in range(shares)
        ]
        rates = [future.result() for future in futures]
    return {"publishers": shares, "rate": sum(rates) / len(rates)}


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
    done = [p for p in result.partitions if p.seconds > 0 and p.acked]
    tasks = [p.acked / p.seconds for p in done]
    waits = [p.waited / p.seconds for p in done]
    return {
        "master": master,
        "task_rate": sum(tasks) / len(tasks) if tasks else 0.0,
        "task_waiting": sum(waits) / len(waits) if waits else 0.0,
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
        runs[0]["slots"] = local_slots(master)
        if cluster_workers:
            cluster = stack.enter_context(spark_cluster(workdir / "spark", cluster_workers))
            runs.append(spark_replay(settings, path, cluster.master_url, partitions))
            runs[-1]["slots"] = cluster_workers
        side_by_side = {
            slots: raw_side_by_side(settings, path, slots)
            for slots in sorted({run["slots"] for run in runs})
        }
    click.echo(f"rows                      {rows}")
    click.echo(f"raw hashed publisher      {raw['rate']:8.0f} rows/s ({raw['seconds']:.1f} s)")
    for slots, figures in side_by_side.items():
        click.echo(f"raw, {slots} side by side      {figures['rate']:8.0f} rows/s per publisher")
    for run in runs:
        run["raw_side_by_side"] = side_by_side[run["slots"]]["rate"]
        show(run, raw["rate"])
    if as_json:
        ratios = {run["master"]: run["task_rate"] / raw["rate"] for run in runs if raw["rate"]}
        beside = {run["master"]: run["task_rate"] / run["raw_side_by_side"] for run in runs}
        figures = {"rows": rows, "raw": raw, "spark": runs, "ratio": ratios}
        click.echo(orjson.dumps({**figures, "ratio_side_by_side": beside}).decode())


def local_slots(master: str) -> int:
    """How many tasks a local master runs at once: N of local[N] (all cores for `*`)."""
    inside = master.partition("[")[2].partition("]")[0].partition(",")[0]
    return (os.cpu_count() or 1) if inside in ("", "*") else int(inside)


def show(run: dict, raw_rate: float) -> None:
    """One Spark run's figures beside the raw publisher's, alone and side by side."""
    click.echo(f"spark on {run['master']} ({run['partitions']} partitions, {run['slots']} at once)")
    click.echo(f"  whole job               {run['rate']:8.0f} rows/s ({run['seconds']:.1f} s)")
    click.echo(
        f"  publishing              {run['publish_rate']:8.0f} rows/s (first task start to "
        f"last task end, {run['publish_seconds']:.1f} s)"
    )
    click.echo(f"  per task                {run['task_rate']:8.0f} rows/s")
    click.echo(
        f"  waiting for first rows  {run['task_waiting']:8.0%}  of a task's time (Spark's "
        "shuffle and sort)"
    )
    ratio = run["task_rate"] / raw_rate if raw_rate else 0.0
    click.echo(f"  per task / raw alone    {ratio:8.2f}")
    beside = run["raw_side_by_side"]
    ratio = run["task_rate"] / beside if beside else 0.0
    label = f"per task / raw x{run['slots']}"
    click.echo(f"  {label:<24}{ratio:8.2f}  (target >= 0.9: Spark is not the limit)")


if __name__ == "__main__":
    main()
