"""Spark replay at local[2] into a real nats-server, with lbg-client processes and the validator.

One SparkSession serves the whole module (it takes 10-25 s to start).
"""

import asyncio
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import nats
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lbg.broker import connect_broker
from lbg.broker.nats.adapter import events_stream
from lbg.devstack.deployment import LocalDeployment, script
from lbg.devstack.spark_cluster import ClusterState, executors, kill_executor, spark_cluster
from lbg.model.group import GroupConfig
from lbg.replay.dataset import DatasetSpec, generate, write_dataset
from lbg.replay.job import PARTITION_COLUMN, ReplayError, ReplayOptions, publish_rows, replay
from lbg.replay.spark import spark_session
from lbg.settings import BrokerSettings

ROWS = 3000


@pytest.fixture(scope="module")
def spark():
    session = spark_session("local[2]")
    yield session
    session.stop()


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("dataset") / "bf.parquet"
    return write_dataset(generate(DatasetSpec(rows=ROWS, seed=11)), path)


async def _create(url: str, name: str) -> GroupConfig:
    broker = await connect_broker(BrokerSettings(url=url), "test-replay")
    try:
        config = GroupConfig(hash_prefix=name, hash_count=32, queue_count=4)
        await broker.create_group(name, config)
        return config
    finally:
        await broker.close()


async def _delete(url: str, name: str) -> None:
    broker = await connect_broker(BrokerSettings(url=url), "test-replay")
    try:
        await broker.delete_group(name)
    finally:
        await broker.close()


@pytest.fixture
def group(nats_url: str, tmp_path: Path) -> Iterator[tuple[str, GroupConfig, LocalDeployment]]:
    """A fresh group with two lbg-client processes serving it."""
    name = f"r{uuid.uuid4().hex[:10]}"
    config = asyncio.run(_create(nats_url, name))
    local = LocalDeployment(nats_url, name, tmp_path / "daemons")
    for index in range(2):
        local.start(f"client-{index}", "lbg-client", "--id", f"client-{index}")
    yield name, config, local
    local.stop_all()
    asyncio.run(_delete(nats_url, name))


def validate(local: LocalDeployment) -> dict:
    """Run the validation client until every published event is accounted for; its report."""
    report = local.workdir / "report.json"
    validator = local.start(
        "validator",
        "validation-client",
        *("--idle-exit", "2", "--progress-interval", "0", "--report-json", str(report)),
    )
    assert validator.wait(60) == 0, validator.log_tail()
    return orjson.loads(report.read_bytes())


def test_replay_acks_every_row_and_keeps_every_key_in_order(
    spark, dataset: Path, nats_url: str, group
) -> None:
    name, _config, local = group
    options = ReplayOptions(path=str(dataset), partitions=4)

    result = replay(spark, BrokerSettings(url=nats_url), name, options, echo=lambda _line: None)

    orders = len(set(pq.read_table(dataset, columns=["order_id"]).column(0).to_pylist()))
    assert (result.rows, result.acked, result.rejected) == (ROWS, ROWS, 0)
    assert len(result.partitions) == 4
    assert all(p.rows > 0 for p in result.partitions), "a partition got no bucket"
    assert result.keys == orders, "a key was split over partitions"
    report = validate(local)
    assert report["published"] == ROWS
    assert report["unique"] == ROWS
    assert (report["lost"], report["reordered"]) == (0, 0)


def test_a_retried_partition_is_dropped_by_jetstream_and_never_reorders(
    dataset: Path, nats_url: str, group
) -> None:
    """A task that died halfway, then ran again in full, as Spark retries it: same (key, seq),
    so the same Nats-Msg-Id, and the stream drops the second copy of the first half."""
    name, config, local = group
    rows = pq.read_table(dataset).sort_by([("event_seq", "ascending"), ("order_id", "ascending")])
    rows = rows.append_column(PARTITION_COLUMN, pa.array([0] * rows.num_rows, pa.int32()))
    settings = BrokerSettings(url=nats_url)

    def attempt(table: pa.Table) -> int:
        batches = iter(table.to_batches(max_chunksize=500))
        stats = asyncio.run(
            publish_rows(batches, settings, name, config, "order_id", "retried-p0", 0, 200)
        )
        return stats.acked

    assert attempt(rows.slice(0, ROWS // 2)) == ROWS // 2
    assert attempt(rows) == ROWS

    assert asyncio.run(events_stored(nats_url, name)) == ROWS, "the stream kept a republished row"
    report = validate(local)
    assert report["unique"] == ROWS
    assert (report["lost"], report["reordered"]) == (0, 0)


def test_bad_input_is_one_line_naming_file_and_column(
    spark, dataset: Path, nats_url: str, group, tmp_path: Path
) -> None:
    name = group[0]
    settings = BrokerSettings(url=nats_url)
    with pytest.raises(ReplayError, match=rf"^{dataset}: no column 'customer' \(columns: order_id"):
        replay(spark, settings, name, ReplayOptions(str(dataset), key_column="customer"))

    missing = tmp_path / "nothing-*.parquet"
    result = subprocess.run(
        [script("lbg-replay"), str(missing), "--broker-url", nats_url, "--group", name],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert result.stderr.strip() == f"lbg-replay: error: {missing}: no such file"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterState]:
    """A standalone master and two 1-core workers on loopback (`lbg spark-cluster up`)."""
    with spark_cluster(tmp_path_factory.mktemp("spark-cluster"), workers=2) as state:
        yield state


def test_an_executor_killed_mid_job_loses_nothing_and_duplicates_nothing(
    cluster: ClusterState, nats_url: str, group, tmp_path: Path
) -> None:
    """kill -9 of an executor JVM while its task publishes: Spark reruns the task elsewhere,
    JetStream drops what the first attempt had already stored."""
    name, _config, local = group
    rows = 30_000
    dataset = write_dataset(generate(DatasetSpec(rows=rows, seed=23)), tmp_path / "big.parquet")
    command = [script("lbg-replay"), str(dataset), "--broker-url", nats_url, "--group", name]
    command += ["--master", cluster.master_url, "--partitions", "4", "--json", "--quiet"]
    replay_run = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        killed = kill_when_publishing(cluster, nats_url, name)
        out, _ = replay_run.communicate(timeout=240)
    finally:
        replay_run.kill()
    assert replay_run.returncode == 0, out
    result = orjson.loads(out.strip().splitlines()[-1])
    print(f"\nkilled executor {killed}; replay: {result}")
    assert (result["rows"], result["acked"], result["rejected"]) == (rows, rows, 0)
    assert result["retried_tasks"] >= 1, "the killed executor's task was not run again"
    assert asyncio.run(events_stored(nats_url, name)) == rows, "the stream kept a republished row"
    report = validate(local)
    assert report["unique"] == rows
    assert (report["lost"], report["reordered"]) == (0, 0)


def kill_when_publishing(cluster: ClusterState, nats_url: str, name: str) -> int:
    """Wait until the tasks have stored some rows in the group's streams, then kill -9 an
    executor; its pid."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if executors(cluster) and asyncio.run(stored_events(nats_url, name)) > 2000:
            return kill_executor(cluster)
        time.sleep(0.2)
    raise AssertionError(f"the replay into {name} never started publishing")


async def stored_events(url: str, prefix: str) -> int:
    """Events stored so far in the streams of the group whose hash prefix is `prefix`."""
    nc = await nats.connect(url)
    try:
        streams = await nc.jetstream().streams_info()
        return sum(
            info.state.messages
            for info in streams
            if any(subject.startswith(f"{prefix}.") for subject in info.config.subjects or [])
        )
    finally:
        await nc.close()


async def events_stored(url: str, group: str) -> int:
    """Events the group's stream holds: each row once when JetStream dropped every republished
    copy. (The validator's duplicates would also count a redelivery to a client, which a lease
    lapse on a busy machine causes by design: at least once.)"""
    nc = await nats.connect(url)
    try:
        return (await nc.jetstream().stream_info(events_stream(group))).state.messages
    finally:
        await nc.close()
