"""Replay a dataset into a group with Spark, every key in order, counted only when acked.

Rows are partitioned by the group's own bucket function (bucket mod partitions), so all of a
key's rows land in one Spark task, and sorted within each partition by the order column, then
the key (sorting by key first would leave one key in flight at a time); each task
publishes its rows through the hashed publisher over its own broker connection. The per-key
sequence is the row's rank within its key in that sorted partition, so a retried task sends
the same (key, seq) pairs again: brokers that deduplicate (NATS, Message DB) drop them, on the
others the validator counts them as duplicates, never as reorders.

`lbg-replay ...` runs it, as does `spark-submit services/lbg/cli/replay.py ...`.
"""

from __future__ import annotations

import asyncio
import glob
import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import orjson
import pyarrow as pa
import uvloop

from lbg.broker import connect_broker
from lbg.model.group import GroupConfig
from lbg.model.messages import MalformedMessage, check_key
from lbg.publisher import HashedPublisher, PublishStats
from lbg.replay import FORMATS
from lbg.settings import BrokerSettings

if TYPE_CHECKING:
    from pyspark import Accumulator
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger("lbg.replay")

PARTITION_COLUMN = "_lbg_partition"
TAG_SEARCH = 64
PROGRESS_SECONDS = 5.0
RESULT_SCHEMA = (
    "partition int, attempt int, publisher string, rows long, acked long, rejected long,"
    " keys long, retried long, started double, seconds double, waited double"
)


class ReplayError(Exception):
    """The replay cannot start or did not finish; the message is one line naming the cause."""


@dataclass(frozen=True)
class ReplayOptions:
    """What to replay and how: the dataset, its key and order columns, the Spark layout."""

    path: str
    key_column: str = "order_id"
    order_column: str = "event_seq"
    input_format: str = "auto"
    partitions: int = 0
    window: int = 1000
    run_id: str = field(default_factory=lambda: f"replay-{uuid.uuid4().hex[:8]}")


@dataclass(frozen=True)
class PartitionResult:
    """What one Spark task achieved; `acked` counts broker-confirmed rows only."""

    partition: int
    attempt: int
    publisher: str
    rows: int
    acked: int
    rejected: int
    keys: int
    retried: int
    started: float
    seconds: float
    waited: float  # of `seconds`, before Spark handed the task its first rows (shuffle, sort)


@dataclass
class ReplayResult:
    """The whole replay: per-partition results and the wall time of the Spark job."""

    partitions: list[PartitionResult]
    elapsed: float

    @property
    def rows(self) -> int:
        return sum(p.rows for p in self.partitions)

    @property
    def acked(self) -> int:
        return sum(p.acked for p in self.partitions)

    @property
    def rejected(self) -> int:
        return sum(p.rejected for p in self.partitions)

    @property
    def keys(self) -> int:
        return sum(p.keys for p in self.partitions)

    @property
    def retried_tasks(self) -> int:
        """Tasks that Spark ran again (a lost executor, a failed attempt): their rows were
        published twice, the second time dropped by brokers that deduplicate."""
        return sum(p.attempt > 0 for p in self.partitions)

    @property
    def rate(self) -> float:
        """Acked rows per second of the Spark job."""
        return self.acked / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def publish_seconds(self) -> float:
        """Wall time from the first task's start of publishing to the last task's end."""
        if not self.partitions:
            return 0.0
        end = max(p.started + p.seconds for p in self.partitions)
        return end - min(p.started for p in self.partitions)

    def to_dict(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "acked": self.acked,
            "rejected": self.rejected,
            "keys": self.keys,
            "partitions": len(self.partitions),
            "retried_tasks": self.retried_tasks,
            "elapsed_s": round(self.elapsed, 3),
            "rate_per_s": round(self.rate, 1),
        }


def _is_local(path: str) -> bool:
    """Whether `path` names local files (no scheme, or file://), which can be checked up front."""
    scheme = urlsplit(path).scheme
    return scheme in ("", "file") or len(scheme) == 1


def _format_of(path: str, input_format: str) -> str:
    """The format asked for, else the one the path's suffix names (Parquet by default)."""
    if input_format != "auto":
        return input_format
    name = path.rstrip("/*").lower()
    if name.endswith(".csv"):
        return "csv"
    if name.endswith((".json", ".jsonl", ".ndjson")):
        return "json"
    return "parquet"


def check_path(path: str) -> None:
    """Raise ReplayError if a local path or glob matches no file (remote paths: Spark checks)."""
    if _is_local(path) and not glob.glob(path.removeprefix("file://")):
        raise ReplayError(f"{path}: no such file")


def read_dataset(spark: SparkSession, path: str, input_format: str = "auto") -> DataFrame:
    """Parquet, CSV (with a header) or JSON lines from a path or glob; format from the suffix."""
    if input_format not in FORMATS:
        raise ReplayError(f"--format: must be one of {', '.join(FORMATS)}, got {input_format!r}")
    check_path(path)
    from pyspark.errors import PySparkException

    reader = spark.read
    fmt = _format_of(path, input_format)
    try:
        if fmt == "csv":
            return reader.csv(path, header=True, inferSchema=True)
        if fmt == "json":
            return reader.json(path)
        return reader.parquet(path)
    except PySparkException as exc:
        raise ReplayError(f"{path}: cannot read as {fmt} ({_first_line(exc)})") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def check_columns(df: DataFrame, path: str, *columns: str) -> None:
    """Raise ReplayError naming the file and the first column the dataset lacks."""
    for column in columns:
        if column not in df.columns:
            have = ", ".join(df.columns)
            raise ReplayError(f"{path}: no column '{column}' (columns: {have})")


def _json_ready(df: DataFrame, key_column: str) -> DataFrame:
    """Key as text; decimals as exact text and binary as base64, which JSON cannot carry."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import BinaryType, DecimalType, StringType

    for column in df.schema.fields:
        key_not_text = column.name == key_column and not isinstance(column.dataType, StringType)
        if key_not_text or isinstance(column.dataType, DecimalType):
            df = df.withColumn(column.name, F.col(column.name).cast("string"))
        elif isinstance(column.dataType, BinaryType):
            df = df.withColumn(column.name, F.base64(F.col(column.name)))
    return df


def partition_tags(spark: SparkSession, partitions: int) -> list[int]:
    """For each partition p, an int that Spark's hash partitioning sends to partition p.

    `repartition(n, column)` places a row by pmod(hash(value), n); tagging a row with the tag of
    `bucket mod n` therefore puts exactly the buckets b = p (mod n) in partition p.
    """
    from pyspark.sql import functions as F

    candidates = spark.range(partitions * TAG_SEARCH).select(
        F.col("id").cast("int").alias("tag"),
        F.expr(f"pmod(hash(cast(id as int)), {partitions})").alias("partition"),
    )
    tags: dict[int, int] = {}
    for row in candidates.collect():
        tags.setdefault(row["partition"], row["tag"])
    if len(tags) < partitions:
        raise ReplayError(f"--partitions {partitions}: found no hash tag for every partition")
    return [tags[p] for p in range(partitions)]


def tag_batches(
    config: GroupConfig, key_column: str, tags: list[int]
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A mapInArrow function tagging each row with its partition: its bucket mod len(tags)."""

    def add_tag(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            keys = batch.column(key_column).to_pylist()
            column = [tags[_bucket(config, key) % len(tags)] for key in keys]
            yield batch.append_column(PARTITION_COLUMN, pa.array(column, pa.int32()))

    return add_tag


def _bucket(config: GroupConfig, key: str | None) -> int:
    """The key's bucket; unusable keys go to bucket 0, where the publishing task rejects them."""
    try:
        return config.bucket_for_key(check_key(key))
    except (MalformedMessage, ValueError):
        return 0


def plan(df: DataFrame, config: GroupConfig, options: ReplayOptions, tags: list[int]) -> DataFrame:
    """Bucket every row, put each bucket in one partition, sort by order then key inside it."""
    from pyspark.sql.types import IntegerType, StructField, StructType

    df = _json_ready(df, options.key_column)
    tagged = StructType([*df.schema.fields, StructField(PARTITION_COLUMN, IntegerType(), False)])
    return (
        df.mapInArrow(tag_batches(config, options.key_column, tags), tagged)
        .repartition(len(tags), PARTITION_COLUMN)
        .sortWithinPartitions(options.order_column, options.key_column)
    )


async def _rows(
    batches: Iterator[pa.RecordBatch],
    key_column: str,
    stats: PublishStats,
    partition: int,
    first_rows: list[float],
) -> AsyncIterator[tuple[str, bytes]]:
    """(key, row as JSON) pairs from Arrow batches, read in a thread so acks keep flowing;
    appends the time the first batch arrived to `first_rows`."""
    started = time.monotonic()
    next_progress = started + PROGRESS_SECONDS
    while (batch := await asyncio.to_thread(next, batches, None)) is not None:
        if not first_rows:
            first_rows.append(time.monotonic())
        for row in batch.drop_columns([PARTITION_COLUMN]).to_pylist():
            try:
                key = check_key(row[key_column])
            except MalformedMessage as exc:
                stats.rejected_input += 1
                log.warning("partition %d: skipped a row: %s", partition, exc)
                continue
            yield key, orjson.dumps(row)
        now = time.monotonic()
        if now >= next_progress:
            log.info(
                "partition %d: %d rows acked (%.0f/s)",
                partition,
                stats.acked,
                stats.acked / (now - started),
            )
            next_progress = now + PROGRESS_SECONDS


async def publish_rows(
    batches: Iterator[pa.RecordBatch],
    settings: BrokerSettings,
    group: str,
    config: GroupConfig,
    key_column: str,
    publisher_id: str,
    partition: int,
    window: int,
    first_rows: list[float] | None = None,
) -> PublishStats:
    """Publish one partition's rows through the hashed publisher; then its per-key summary."""
    broker = await connect_broker(settings, publisher_id)
    try:
        publisher = HashedPublisher(broker, group, config, publisher_id, window=window)
        arrived = first_rows if first_rows is not None else []
        events = _rows(batches, key_column, publisher.stats, partition, arrived)
        stats = await publisher.run(events, progress_interval=float("inf"))
        if stats.last_seq:
            await publisher.publish_summary()
        return stats
    finally:
        await broker.close()


def _worker_logging() -> None:
    """Progress lines from a Spark task go to its stderr (the console at local[N])."""
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


def partition_publisher(
    settings: BrokerSettings,
    group: str,
    config: GroupConfig,
    options: ReplayOptions,
    acked_so_far: Accumulator[int],
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The mapInArrow function each Spark task runs: publish, then return one result row.

    The returned rows are the counts (a failed attempt returns none); the accumulator only
    feeds the driver's progress lines.
    """

    def publish(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        _worker_logging()
        context = TaskContext.get()
        partition = context.partitionId() if context else 0
        attempt = context.attemptNumber() if context else 0
        publisher_id = f"{options.run_id}-p{partition:04d}"
        started_at = time.time()
        started = time.monotonic()
        first_rows: list[float] = []
        stats = uvloop.run(
            publish_rows(
                batches,
                settings,
                group,
                config,
                options.key_column,
                publisher_id,
                partition,
                options.window,
                first_rows,
            )
        )
        seconds = time.monotonic() - started
        waited = (first_rows[0] if first_rows else started + seconds) - started
        acked_so_far.add(stats.acked)
        rows = stats.acked + stats.rejected_input
        if rows:
            log.info(
                "partition %d: done, %d rows acked in %.1f s (%.0f/s)",
                partition,
                stats.acked,
                seconds,
                stats.acked / seconds if seconds > 0 else 0.0,
            )
        yield pa.RecordBatch.from_pylist(
            [
                {
                    "partition": partition,
                    "attempt": attempt,
                    "publisher": publisher_id,
                    "rows": rows,
                    "acked": stats.acked,
                    "rejected": stats.rejected_input,
                    "keys": len(stats.last_seq),
                    "retried": stats.retried,
                    "started": started_at,
                    "seconds": seconds,
                    "waited": waited,
                }
            ],
            schema=_RESULT_ARROW,
        )

    return publish


_RESULT_ARROW = pa.schema(
    [
        ("partition", pa.int32()),
        ("attempt", pa.int32()),
        ("publisher", pa.string()),
        ("rows", pa.int64()),
        ("acked", pa.int64()),
        ("rejected", pa.int64()),
        ("keys", pa.int64()),
        ("retried", pa.int64()),
        ("started", pa.float64()),
        ("seconds", pa.float64()),
        ("waited", pa.float64()),
    ]
)


async def read_group_config(settings: BrokerSettings, group: str) -> GroupConfig:
    """The group's config from the broker's store (the driver reads it once)."""
    broker = await connect_broker(settings, f"lbg-replay-{os.getpid()}")
    try:
        return await broker.read_group(group)
    finally:
        await broker.close()


def _job_failure(exc: BaseException) -> str:
    """The Python error inside a failed Spark job as one line (its last traceback line)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    python_errors = [line for line in lines if "Error:" in line or "Failed:" in line]
    return (python_errors or lines or [type(exc).__name__])[-1]


def _watch_progress(
    spark: SparkSession,
    done: threading.Event,
    echo: Callable[[str], None],
    total: int,
    acked_so_far: Accumulator[int],
    processed: Callable[[], int] | None,
) -> None:
    """Overall progress from the driver every few seconds: partitions finished, the rows they
    acked (Spark reports a task's counts when it ends), and, if `processed` is given, the
    rows the group has processed so far (they flow long before a partition finishes)."""
    tracker = spark.sparkContext.statusTracker()
    started = time.monotonic()
    while not done.wait(PROGRESS_SECONDS):
        finished = 0
        for stage_id in tracker.getActiveStageIds():
            stage = tracker.getStageInfo(stage_id)
            if stage is not None and stage.numTasks == total:
                finished = stage.numCompletedTasks
        elapsed = time.monotonic() - started
        live = "" if processed is None else f"{processed()} rows processed by the group; "
        echo(
            f"replay after {elapsed:.0f} s: {live}{finished}/{total} partitions finished"
            f" ({acked_so_far.value} rows acked by those)"
        )


def replay(
    spark: SparkSession,
    settings: BrokerSettings,
    group: str,
    options: ReplayOptions,
    echo: Callable[[str], None] = log.info,
    processed: Callable[[], int] | None = None,
) -> ReplayResult:
    """Replay `options.path` into `group`; ReplayError (one line) on bad input or a failed job.
    `processed`, if given, counts the rows the group processed so far for the progress lines."""
    settings = replace(settings, password=settings.secret(), password_file=None)
    config = uvloop.run(read_group_config(settings, group))
    df = read_dataset(spark, options.path, options.input_format)
    check_columns(df, options.path, options.key_column, options.order_column)
    partitions = min(
        options.partitions or 2 * spark.sparkContext.defaultParallelism, config.hash_count
    )
    acked_so_far = spark.sparkContext.accumulator(0)
    job = plan(df, config, options, partition_tags(spark, partitions)).mapInArrow(
        partition_publisher(settings, group, config, options, acked_so_far), RESULT_SCHEMA
    )
    echo(
        f"replay {options.path} -> group '{group}' ({config.to_json()}): {partitions} partitions"
        f" by bucket, key {options.key_column}, order {options.order_column}"
    )
    from py4j.protocol import Py4JError
    from pyspark.errors import PySparkException

    done = threading.Event()
    watcher = threading.Thread(
        target=_watch_progress,
        args=(spark, done, echo, partitions, acked_so_far, processed),
        daemon=True,
    )
    started = time.monotonic()
    watcher.start()
    try:
        rows = job.collect()
    except (PySparkException, Py4JError) as exc:
        raise ReplayError(f"replay failed: {_job_failure(exc)}") from None
    finally:
        done.set()
    elapsed = time.monotonic() - started
    results = sorted(
        (PartitionResult(**row.asDict()) for row in rows), key=lambda result: result.partition
    )
    result = ReplayResult(results, elapsed)
    echo(
        f"replay: {result.acked} of {result.rows} rows acked over {result.keys} keys in"
        f" {elapsed:.1f} s ({result.rate:.0f} rows/s); {result.rejected} rejected;"
        f" {result.retried_tasks} tasks retried"
    )
    return result
