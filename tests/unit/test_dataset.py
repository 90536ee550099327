"""The Black Friday generator: schema, determinism, per-order sequence and time, hot keys."""

from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from lbg.cli.dataset import main as dataset_cli
from lbg.replay.dataset import (
    EVENT_TYPES,
    KEY_COLUMN,
    ORDER_COLUMN,
    SCHEMA,
    DatasetError,
    DatasetSpec,
    generate,
    write_dataset,
)

ENDINGS = {"paid", "shipped", "cancelled"}


def by_order(rows: list[dict]) -> dict[str, list[dict]]:
    """Each order's rows in file order."""
    orders: dict[str, list[dict]] = {}
    for row in rows:
        orders.setdefault(row[KEY_COLUMN], []).append(row)
    return orders


def check_lifecycles(rows: list[dict]) -> None:
    """Every order: seq 1..n in file (time) order, created first, endings only at the tail."""
    for key, events in by_order(rows).items():
        assert [e[ORDER_COLUMN] for e in events] == list(range(1, len(events) + 1)), key
        assert events[0]["event_type"] == "order_created", key
        types = [e["event_type"] for e in events]
        first_end = next((i for i, t in enumerate(types) if t in ENDINGS), len(types))
        assert all(t in ENDINGS for t in types[first_end:]), (key, types)
        assert "order_created" not in types[1:], key
        assert len({e["account_id"] for e in events}) == 1, key
        for event in events:
            has_item = event["event_type"] in ("order_created", "quantity_changed")
            assert (event["sku"] is not None) == has_item
            assert (event["quantity"] is not None) == has_item
            assert (event["amount_cents"] is not None) == (event["event_type"] == "paid")


def test_schema_and_size() -> None:
    table = generate(DatasetSpec(rows=5000, seed=1))
    assert table.schema == SCHEMA
    assert table.num_rows == 5000
    assert set(table.column("event_type").to_pylist()) == set(EVENT_TYPES)
    assert len(set(table.column(KEY_COLUMN).to_pylist())) == 250


def test_same_seed_same_rows_other_seed_other_rows() -> None:
    spec = DatasetSpec(rows=3000, seed=42)
    assert generate(spec).equals(generate(spec))
    assert not generate(spec).equals(generate(DatasetSpec(rows=3000, seed=43)))


def test_file_is_in_time_order_with_unique_times_and_per_order_sequence() -> None:
    table = generate(DatasetSpec(rows=20_000, seed=7))
    times = table.column("ts").to_pylist()
    assert times == sorted(times)
    assert len(set(times)) == len(times)
    check_lifecycles(table.to_pylist())


def test_hot_orders_and_accounts() -> None:
    """The top 1% of orders carry several times their uniform share; without skew they do not."""
    rows = 100_000

    def top_share(spec: DatasetSpec, column: str) -> float:
        counts = Counter(generate(spec).column(column).to_pylist())
        top = sorted(counts.values(), reverse=True)[: max(1, len(counts) // 100)]
        return sum(top) / rows

    skewed = DatasetSpec(rows=rows, seed=3)
    flat = DatasetSpec(rows=rows, seed=3, hot_share=0.0)
    assert top_share(skewed, KEY_COLUMN) > 0.05
    assert top_share(flat, KEY_COLUMN) < 0.03
    assert top_share(skewed, "account_id") > 2 * top_share(flat, "account_id")


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(3, 3000),
    seed=st.integers(0, 2**32 - 1),
    skew=st.floats(0, 3),
    hot_share=st.floats(0, 1),
    data=st.data(),
)
def test_any_valid_spec_makes_well_formed_orders(
    rows: int, seed: int, skew: float, hot_share: float, data: st.DataObject
) -> None:
    orders = data.draw(st.integers(1, rows // 3))
    table = generate(
        DatasetSpec(rows=rows, orders=orders, skew=skew, hot_share=hot_share, seed=seed)
    )
    assert table.num_rows == rows
    assert len(set(table.column(KEY_COLUMN).to_pylist())) == orders
    check_lifecycles(table.to_pylist())


@pytest.mark.parametrize(
    ("spec", "option"),
    [
        (DatasetSpec(rows=0), "rows"),
        (DatasetSpec(rows=30, orders=11), "orders"),
        (DatasetSpec(rows=30, skus=0), "skus"),
        (DatasetSpec(rows=30, skew=-1), "skew"),
        (DatasetSpec(rows=30, hot_share=1.5), "hot-share"),
    ],
)
def test_bad_sizes_name_the_option(spec: DatasetSpec, option: str) -> None:
    with pytest.raises(DatasetError, match=rf"^{option}: "):
        generate(spec)


def test_cli_writes_parquet_and_fails_in_one_line(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "bf.parquet"
    runner = CliRunner()
    result = runner.invoke(dataset_cli, ["-o", str(target), "--rows", "900", "--seed", "5"])
    assert result.exit_code == 0, result.output
    assert pq.read_table(target).equals(generate(DatasetSpec(rows=900, seed=5)))

    result = runner.invoke(dataset_cli, ["-o", str(target), "--rows", "10", "--orders", "9"])
    assert result.exit_code == 1
    assert result.output.strip().endswith(
        "error: --orders: at most rows/3 (3) so every order can end, got 9"
    )
    assert "Traceback" not in result.output


def test_write_round_trips(tmp_path: Path) -> None:
    table = generate(DatasetSpec(rows=600, seed=9))
    assert pq.read_table(write_dataset(table, tmp_path / "a" / "b.parquet")).equals(table)
