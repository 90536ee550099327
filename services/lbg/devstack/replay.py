"""`make replay`: a dataset replayed with Spark into a group with clients and the validator running.

A private nats-server (or the broker at a URL), a fresh group, N lbg-client processes and the
validator in this process; the Spark job runs in a thread so the validator keeps reading.
Afterwards it waits until every replayed row is accounted for and returns the report.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from lbg.broker import connect_broker
from lbg.devstack.deployment import LocalDeployment
from lbg.model.group import GroupConfig
from lbg.model.sequence import Report
from lbg.replay.job import ReplayOptions, ReplayResult, replay
from lbg.replay.spark import console_to, spark_session
from lbg.settings import BrokerSettings
from lbg.validator import Validator, run_validator, wait_until_complete

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

GROUP = "replay"


@dataclass(frozen=True)
class LocalReplay:
    """One local replay run: where the broker is, the group's shape and the Spark master."""

    broker_url: str
    replay: ReplayOptions
    master: str | None = None
    clients: int = 2
    hash_count: int = 64
    queue_count: int = 4
    queue_size_mb: int = 1024
    drain_timeout: float = 120.0
    spark_log: Path = Path("var/replay/spark.log")


def _quiet_spark_session(master: str | None, log_path: Path) -> SparkSession:
    """A Spark session whose JVM writes its console warnings to `log_path`, not the terminal."""
    with console_to(log_path):
        return spark_session(master)


async def run_local_replay(
    run: LocalReplay, workdir: Path, echo: Callable[[str], None]
) -> tuple[ReplayResult, Report]:
    """Replay into a fresh group with clients and the validator; the replay and the report."""
    settings = BrokerSettings(url=run.broker_url)
    config = GroupConfig(
        hash_prefix=GROUP,
        hash_count=run.hash_count,
        queue_count=run.queue_count,
        queue_size_mb=run.queue_size_mb,
    )
    broker = await connect_broker(settings, "lbg-replay-local")
    local = LocalDeployment(run.broker_url, GROUP, workdir)
    validator = Validator()
    stop = asyncio.Event()
    validation: asyncio.Task[Report] | None = None
    try:
        if GROUP in await broker.list_groups():
            await broker.delete_group(GROUP)
        await broker.create_group(GROUP, config)
        echo(f"group '{GROUP}' created: {config.to_json()}")
        validation = asyncio.create_task(
            run_validator(broker, GROUP, validator, stop, progress_interval=0)
        )
        for index in range(run.clients):
            local.start(f"client-{index}", "lbg-client", "--id", f"client-{index}")
        echo(f"{run.clients} clients started")
        echo(f"Spark's and Java's console output: {run.spark_log}")
        spark = await asyncio.to_thread(_quiet_spark_session, run.master, run.spark_log)

        def processed() -> int:
            return validator.report().unique

        try:
            result = await asyncio.to_thread(
                replay, spark, settings, GROUP, run.replay, echo, processed
            )
        finally:
            await asyncio.to_thread(spark.stop)
        echo("drain: waiting until every replayed row is accounted for")
        drained = await wait_until_complete(validator, run.drain_timeout)
        echo("drained" if drained else f"drain timed out: {validator.progress_line()}")
    finally:
        stop.set()
        if validation is not None:
            with contextlib.suppress(Exception):
                await validation
        await asyncio.to_thread(local.stop_all)
        await broker.close()
    return result, validator.report()
