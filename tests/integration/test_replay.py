"""Spark replay at local[2] into a real nats-server, with lbg-client processes and the validator.

One SparkSession serves the whole module (it takes 10-25 s to start).
"""

import asyncio
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lbg.broker import connect_broker
from lbg.devstack.deployment import LocalDeployment, script
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


def test_a_retried_partition_duplicates_and_never_reorders(
    dataset: Path, nats_url: str, group
) -> None:
    """A task that died halfway, then ran again in full, as Spark retries it: same (key, seq)."""
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

    report = validate(local)
    assert report["unique"] == ROWS
    assert report["duplicates"] >= ROWS // 2, "the second attempt's first half was not counted"
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
